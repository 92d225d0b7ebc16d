package localsandbox

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"golang.org/x/sys/unix"
)

// The ways out of a lease, tried as an attacker would, each from inside a
// lease through the HTTP API (issue 14). Every test names the attack and
// asserts the contained outcome with the evidence a host operator would
// want; each was seen to succeed on the server before leases were confined.

// python runs a Python program in the lease as a one-shot exec.
func (ts *testServer) python(lease, program string) execResult {
	ts.t.Helper()
	testenv.RequireFile(ts.t, "/usr/bin/python3")
	return ts.exec(lease, "/usr/bin/python3 - <<'PY'\n"+program+"\nPY")
}

// TIOCSTI into the operator's terminal gave root on the host: the init kept
// the server's controlling terminal, and /dev/tty was there. The server
// here is a child with a pty as its controlling terminal, as sandboxd
// started from an interactive shell has; a command pushes a line into
// /dev/tty and, failing that, into every terminal it can find. Nothing may
// arrive in the server's terminal, and the command has no terminal at all.
func TestNoWayToATerminal(t *testing.T) {
	_, pts := openPTY(t) // the master stays open: closing it hangs the server up
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childServerEnv+"="+filepath.Join(t.TempDir(), "root"))
	child.Stdin, child.Stderr = pts, os.Stderr
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.HasPrefix(addr, "error") {
		t.Fatalf("child server: %q %v", addr, err)
	}
	ts := &testServer{t: t, base: "http://" + strings.TrimSpace(addr) + "/v1"}
	lease := ts.createLease()
	// Before the child is killed (cleanups run last first): its leases'
	// disks are mounted in the test's temporary directory.
	t.Cleanup(func() { ts.call("DELETE", "/sandboxes/"+lease, nil, nil) })
	r := ts.python(lease, `
import os, fcntl, termios, glob
print("tty_nr", open("/proc/self/stat").read().rsplit(")", 1)[1].split()[4])
for dev in ["/dev/tty", "/dev/console"] + glob.glob("/dev/tty*") + glob.glob("/dev/pts/*"):
    try:
        fd = os.open(dev, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        print(dev, "refused")
        continue
    try:
        for c in b"echo pwned\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))
        print(dev, "TIOCSTI allowed")
    except OSError as e:
        print(dev, "TIOCSTI refused", e.errno)
`)
	if !strings.HasPrefix(r.Stdout, "tty_nr 0\n/dev/tty refused\n/dev/console refused\n") || strings.Contains(r.Stdout, "allowed") {
		t.Errorf("in the lease:\n%s(stderr %q)", r.Stdout, r.Stderr)
	}
	// What the operator's shell would read next from its terminal.
	fd := int(pts.Fd()) // once: Fd makes the file blocking again
	if err := syscall.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	if n, _ := syscall.Read(fd, buf); n > 0 {
		t.Errorf("the server's terminal received %q from inside a lease", buf[:n])
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (ptmx, pts *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		testenv.Missing(t, fmt.Sprintf("no pseudo-terminals here: %v", err))
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pts.Close() })
	return ptmx, pts
}

// A descriptor the server held without close-on-exec reached every
// command: started as `exec 9</; sandboxd`, a command wrote the host root
// through /proc/self/fd/9. The lease init closes all but its own channels.
func TestNoDescriptorCrossesIntoALease(t *testing.T) {
	canary := t.TempDir()
	fd, err := syscall.Open(canary, syscall.O_RDONLY|syscall.O_DIRECTORY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	ts := startServer(t, Options{})
	lease := ts.createLease()
	r := ts.exec(lease, `cd /proc/self/fd && ls`)
	if fields := strings.Fields(r.Stdout); strings.Join(fields, " ") != "0 1 2 3" { // 3: ls's own directory
		t.Fatalf("descriptors in the lease: %q (stderr %q), want 0 1 2 and ls's own", r.Stdout, r.Stderr)
	}
	ts.exec(lease, `echo pwned > /proc/self/fd/`+strconv.Itoa(fd)+`/pwned 2>/dev/null`)
	if _, err := os.Stat(canary + "/pwned"); err == nil {
		t.Fatal("a command wrote the host through an inherited descriptor")
	}
}

// A read-only mount was remounted read-write from inside, and a tmpfs
// mounted outside any limit (size=100g took host memory). Mounting is the
// lease setup's alone: the mount family is refused to commands.
func TestNoMountsFromInside(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	for _, script := range []string{
		`mount -o remount,bind,rw /usr`,
		`mount -o remount,rw /`,
		`mkdir -p /mnt/t && mount -t tmpfs -o size=100g none /mnt/t`,
		`mount --bind /workspace /mnt`,
		`umount -l /proc`,
	} {
		r := ts.exec(lease, script+` 2>&1; echo "exit $?"`)
		if strings.HasSuffix(r.Stdout, "exit 0\n") {
			t.Errorf("%s succeeded inside the lease: %q", script, r.Stdout)
		}
	}
	r := ts.python(lease, `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.mount(b"none", b"/tmp", b"tmpfs", 0, b"size=100g"), ctypes.get_errno())
`)
	if r.Stdout != "-1 "+strconv.Itoa(int(syscall.EPERM))+"\n" {
		t.Errorf("mount(2) of a tmpfs: %q %q, want -1 EPERM", r.Stdout, r.Stderr)
	}
}

// A command could create nested namespaces (and with them, privileges the
// lease's limits did not foresee).
func TestNoNestedNamespaces(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	for _, script := range []string{`unshare -U true`, `unshare -Ur true`, `unshare -m true`, `unshare -n true`} {
		if r := ts.exec(lease, script+` 2>&1; echo "exit $?"`); strings.HasSuffix(r.Stdout, "exit 0\n") {
			t.Errorf("%s succeeded inside the lease", script)
		}
	}
}

// Through pidfd_getfd on the init's status pipe a command reported the exit
// status it liked, and by flooding it grew the server's memory; ptrace of
// the init would give it everything the init holds. The init is out of
// reach: non-dumpable, and ptrace, pidfd_getfd and process_vm_readv are
// refused; its status is the one the kernel gave.
func TestTheInitIsOutOfReach(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	r := ts.python(lease, `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_open, SYS_pidfd_getfd, PTRACE_SEIZE = 434, 438, 0x4206
def attempt(name, f):
    r = f()
    print(name, "allowed" if r >= 0 else ctypes.get_errno())
attempt("ptrace", lambda: libc.ptrace(PTRACE_SEIZE, 1, 0, 0))
pidfd = libc.syscall(SYS_pidfd_open, 1, 0)
print("pidfd_open", "ok" if pidfd >= 0 else ctypes.get_errno())
for target in range(3, 8):
    attempt("pidfd_getfd", lambda: libc.syscall(SYS_pidfd_getfd, pidfd, target, 0))
for path in ("/proc/1/mem", "/proc/1/environ"):
    try:
        os.close(os.open(path, os.O_RDONLY)); print(path, "opened")
    except OSError as e:
        print(path, e.errno)
for fd in sorted(os.listdir("/proc/1/fd"), key=int):
    try:
        os.close(os.open("/proc/1/fd/" + fd, os.O_RDWR)); print("/proc/1/fd/" + fd, "opened")
    except OSError as e:
        print("/proc/1/fd/N", e.errno)
`)
	eperm, eacces := strconv.Itoa(int(syscall.EPERM)), strconv.Itoa(int(syscall.EACCES))
	want := "ptrace " + eperm + "\npidfd_open ok\n" + strings.Repeat("pidfd_getfd "+eperm+"\n", 5) +
		"/proc/1/mem " + eacces + "\n/proc/1/environ " + eacces + "\n"
	got, fds, _ := strings.Cut(r.Stdout, "/proc/1/fd/")
	fds = "/proc/1/fd/" + fds
	if got != want || strings.Contains(fds, "opened") || !strings.Contains(fds, "/proc/1/fd/N "+eacces) {
		t.Errorf("got\n%s(stderr %q)\nwant\n%s", r.Stdout, r.Stderr, want)
	}
	if r := ts.exec(lease, `exit 7`); r.ExitCode != 7 {
		t.Errorf("exit 7 reported as %d", r.ExitCode)
	}
}

// Commands ran with every capability of the lease's user namespace, no
// seccomp and no_new_privs off. Now: Docker's capability set, no_new_privs,
// a seccomp filter — and a root inside that can still do a machine's
// ordinary root things.
func TestCommandsHoldLeastPrivilege(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	r := ts.exec(lease, `grep -E '^(CapBnd|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t ' ' '`)
	want := "CapEff: 00000000a80425fb\nCapBnd: 00000000a80425fb\nCapAmb: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2\n"
	if r.Stdout != want {
		t.Errorf("got\n%s(stderr %q)\nwant\n%s", r.Stdout, r.Stderr, want)
	}
	r = ts.exec(lease, `set -e; useradd -m builder; echo hi > /opt/f; chown builder /opt/f; su builder -c 'cat /opt/f; id -un'`)
	if r.ExitCode != 0 || r.Stdout != "hi\nbuilder\n" {
		t.Errorf("ordinary root work in the lease: %+v", r)
	}
}

// The lease init is pid 1: the kernel delivers it only the signals it
// handles, and the Go runtime handles all of them. A command that sent it a
// signal the runtime dies of (SIGSEGV, SIGABRT, …) ended its lease, and
// with it every process in it. The init drops every such signal.
func TestSignalsDoNotEndTheLease(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	for _, sig := range []string{"SEGV", "BUS", "FPE", "ILL", "ABRT", "TRAP", "SYS", "PIPE", "XCPU", "XFSZ", "VTALRM", "PROF", "STKFLT", "PWR", "TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "ALRM"} {
		ts.exec(lease, "kill -"+sig+" 1")
		if r := ts.exec(lease, "echo alive"); r.Stdout != "alive\n" {
			t.Fatalf("after kill -%s 1 the lease answers %+v", sig, r)
		}
	}
}

// Every lease's root was the same host uid (65534, the host's nobody), so a
// process that got out of one lease owned every other lease's files. Now
// each lease has 65536 host ids of its own, shared with nobody.
func TestLeasesShareNoHostID(t *testing.T) {
	testenv.RequireRoot(t, "id ranges need a root server")
	ts := startServer(t, Options{})
	a, b := ts.createLease(), ts.createLease()
	owners := map[string][2]int{}
	for _, lease := range []string{a, b} {
		if r := ts.exec(lease, `set -e; touch /workspace/root-file; useradd -u 4242 builder4242; chmod 755 /workspace; mkdir /workspace/u; chown builder4242 /workspace/u; su builder4242 -c 'touch /workspace/u/user-file'`); r.ExitCode != 0 {
			t.Fatalf("%+v", r)
		}
		var ids [2]int
		for i, rel := range []string{"workspace/root-file", "workspace/u/user-file"} {
			fi, err := os.Stat(filepath.Join(ts.root, leasesDir, lease, rel))
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = int(fi.Sys().(*syscall.Stat_t).Uid)
		}
		owners[lease] = ids
		if uid, _ := ts.leaseIDs(lease); ids != [2]int{uid, uid + 4242} {
			t.Errorf("lease %s: files of its root and its uid 4242 are host %v, want %d and %d", lease, ids, uid, uid+4242)
		}
	}
	if owners[a][0] == owners[b][0] || owners[a][1] == owners[b][1] || owners[a][0] < DefaultHostIDBase || owners[b][0] < DefaultHostIDBase {
		t.Errorf("two leases' files on the host: %v and %v, want distinct ids above %d", owners[a], owners[b], DefaultHostIDBase)
	}
}
