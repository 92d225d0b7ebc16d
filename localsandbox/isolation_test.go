package localsandbox

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
)

// hostPIDs returns the host pids of the processes of a lease whose
// command line starts with prefix.
func hostPIDs(t *testing.T, ts *testServer, lease, prefix string) []int {
	t.Helper()
	ts.srv.mu.Lock()
	l := ts.srv.leases[lease]
	ts.srv.mu.Unlock()
	table, err := proctree.Read()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, root := range l.hostRoots() {
		for _, pid := range table.Tree(root) {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			if strings.HasPrefix(string(cmdline), prefix) {
				out = append(out, pid)
			}
		}
	}
	return out
}

func TestLeasesCannotSeeSignalOrReadEachOther(t *testing.T) {
	ts := startServer(t, Options{})
	a, b := ts.createLease(), ts.createLease()
	if ts.putFile(a, "/workspace/secret", "secret of a") != http.StatusOK {
		t.Fatal("upload failed")
	}
	pidA := ts.startProcess(a, `exec sleep 1000`)
	var sleepers []int
	for deadline := time.Now().Add(10 * time.Second); len(sleepers) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("sleep of lease a not found")
		}
		sleepers = hostPIDs(t, ts, a, "sleep\x00")
	}
	hostPID := sleepers[0]
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", hostPID))
	if uid, _ := ts.leaseIDs(a); !strings.Contains(string(status), fmt.Sprintf("\nUid:\t%d\t%d\t%d\t%d\n", uid, uid, uid, uid)) {
		t.Errorf("a sandboxed process does not run as its lease's uid %d on the host:\n%s", uid, status)
	}

	hostWorkspaceA := filepath.Join(ts.root, leasesDir, a, "workspace")
	r := ts.exec(b, fmt.Sprintf(`
		ls /proc | grep -c '^[0-9]*$'
		kill -0 %d 2>/dev/null && echo "signalled a"
		cat %s/secret 2>/dev/null && echo "read a"
		ls /workspace | wc -l
		kill -KILL -1 2>/dev/null
		echo end`, hostPID, hostWorkspaceA))
	lines := strings.Fields(r.Stdout)
	if len(lines) != 3 || lines[2] != "end" {
		t.Fatalf("lease b says %q (stderr %q)", r.Stdout, r.Stderr)
	}
	if n, _ := strconv.Atoi(lines[0]); n > 6 {
		t.Errorf("lease b sees %d processes", n)
	}
	if lines[1] != "0" {
		t.Errorf("lease b sees %s files in its own new workspace", lines[1])
	}
	// kill -1 in b reached nothing of a.
	if err := syscallKill0(hostPID); err != nil {
		t.Errorf("the process of lease a died: %v", err)
	}
	if w, status := ts.waitTree(a, pidA, 10*time.Millisecond); status != http.StatusOK || w.TreeExited || w.State != "running" {
		t.Errorf("lease a's process ended: %d %+v", status, w)
	}
}

func TestNoNetworkButLoopback(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	port := strings.TrimPrefix(ts.base[strings.LastIndex(ts.base, ":"):], ":")
	port = strings.TrimSuffix(port, "/v1")
	r := ts.exec(lease, fmt.Sprintf(`
		(exec 3<>/dev/tcp/127.0.0.1/%s) 2>&1 | grep -q 'Connection refused' && echo refused || echo "reached the server"
		(exec 3<>/dev/tcp/192.0.2.1/80) 2>&1 | grep -q 'Network is unreachable' && echo unreachable || echo "reached the network"
		grep -c : /proc/net/dev
		grep -o '^ *lo:' /proc/net/dev | tr -d ' '
		hostname`, port))
	want := fmt.Sprintf("refused\nunreachable\n1\nlo:\n%s\n", lease)
	if r.Stdout != want {
		t.Errorf("got %q, want %q", r.Stdout, want)
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		r := ts.exec(lease, `python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname()); a, _ = s.accept()
c.sendall(b"ping"); print(a.recv(4).decode())'`)
		if r.Stdout != "ping\n" {
			t.Errorf("loopback inside the sandbox: %q %q", r.Stdout, r.Stderr)
		}
	}
}

// The root was a read-only view of the host before leases had an overlay
// root of their own; now every write lands in the lease's upper layer.
func TestRootIsWritableAndTheLeasesOwn(t *testing.T) {
	ts := startServer(t, Options{})
	lease, other := ts.createLease(), ts.createLease()
	r := ts.exec(lease, `
		set -e
		echo etc > /etc/sandboxflow-test; echo opt > /opt/o; echo root > /root/r; echo usr > /usr/sandboxflow-test; echo top > /x
		cat /etc/sandboxflow-test /opt/o /root/r /usr/sandboxflow-test /x
		echo w > /workspace/w && echo w > /tmp/t && cat /workspace/w /tmp/t
		id -u; readlink /bin
		for fd in 3 4 5 6 7 8; do [ -e /proc/$$/fd/$fd ] && echo "fd $fd leaked"; done
		[ -e /dev/tty ] && echo "/dev/tty exists"; [ -e /dev/console ] && echo "/dev/console exists"; true`)
	bin, _ := os.Readlink("/bin")
	if bin != "" {
		bin += "\n"
	}
	if want := "etc\nopt\nroot\nusr\ntop\nw\nw\n0\n" + bin; r.Stdout != want {
		t.Errorf("got %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}
	for _, p := range []string{"/etc/sandboxflow-test", "/usr/sandboxflow-test"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was written on the host", p)
		}
	}
	// The image is one lower layer, below upper/root (leaseinit/rootfs.go).
	if got, _ := os.ReadFile(filepath.Join(ts.root, leasesDir, lease, "upper", "root", "etc", "sandboxflow-test")); string(got) != "etc\n" {
		t.Errorf("the write to /etc is not in the lease's upper layer: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(ts.root, leasesDir, lease, "tmp", "t")); string(got) != "w\n" {
		t.Errorf("the lease's /tmp is not its tmp directory: %q", got)
	}
	if r := ts.exec(other, `cat /etc/sandboxflow-test /opt/o 2>&1 | wc -l; ls /etc/hostname >/dev/null && echo host-etc`); r.Stdout != "2\nhost-etc\n" {
		t.Errorf("another lease sees %q", r.Stdout)
	}
}

// An apt-style tool that adds a user, chowns and switches to it works
// (the image has useradd and su).
func TestRootCanAddUsersAndChown(t *testing.T) {
	testenv.RequireRoot(t, "a server that is not root maps only the sandbox's root")
	ts := startServer(t, Options{})
	lease := ts.createLease()
	r := ts.exec(lease, `
		set -e
		useradd -m -d /home/app -s /bin/sh app
		[ "$(id -u app)" -gt 0 ] && echo "a user"
		mkdir -p /srv/data && chown app:app /srv/data && stat -c %U:%G /srv/data
		su app -c 'id -un; echo hi > /srv/data/f' && stat -c %U /srv/data/f
		grep -c '^app:' /etc/passwd`)
	if r.ExitCode != 0 || r.Stdout != "a user\napp:app\napp\napp\n1\n" {
		t.Errorf("got %+v", r)
	}
	if out, _ := os.ReadFile("/etc/passwd"); strings.Contains(string(out), "\napp:") {
		t.Error("the host's /etc/passwd changed")
	}
}

// A server started under a strict umask (an operator's 077) still runs
// its leases in namespaces, and a lease's commands have a Linux login's
// umask. Before, the leases directory was 0700, so no lease's init could
// reach its root ("mounting the overlay at /: permission denied"): the
// server fell back to process groups, whose probe failed too, and sandboxd
// did not start.
func TestAStrictUmaskChangesNoLease(t *testing.T) {
	testenv.RequireRoot(t, "namespaces need a server running as root")
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	ts := startServer(t, Options{})
	if ts.srv.isolation != IsolationNamespaces {
		t.Fatalf("under umask 077 the server runs %s, want namespaces", ts.srv.isolation)
	}
	lease := ts.createLease()
	r := ts.exec(lease, `
		umask
		su -s /bin/sh _apt -c 'cat /dev/null && echo apt-reads-dev'
		echo x > /root/f; stat -c %a /root/f`)
	if r.ExitCode != 0 || r.Stdout != "0022\napt-reads-dev\n644\n" {
		t.Errorf("got %+v", r)
	}
}

func TestFiftyConcurrentLeases(t *testing.T) {
	ts := startServer(t, Options{})
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			lease := ts.createLease()
			if status := ts.putFile(lease, "/workspace/in", fmt.Sprintf("lease %d", i)); status != http.StatusOK {
				errs <- fmt.Errorf("upload: %d", status)
				return
			}
			out := ts.run(lease, `cat /workspace/in; echo " on $(hostname)"`)
			if want := fmt.Sprintf("lease %d on %s\n", i, lease); out.stdout.String() != want {
				errs <- fmt.Errorf("got %q, want %q", out.stdout.String(), want)
			}
			if status := ts.call("DELETE", "/sandboxes/"+lease, nil, nil); status != http.StatusOK {
				errs <- fmt.Errorf("destroy: %d", status)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st, _ := ts.srv.Stats(); st.Leases != 0 || st.Processes != 0 || st.ProcessesStarted != n {
		t.Errorf("stats %+v", st)
	}
	if entries, _ := os.ReadDir(filepath.Join(ts.root, leasesDir)); len(entries) != 0 {
		t.Errorf("%d workspaces left", len(entries))
	}
}

func TestPauseFreezesTheWholeTree(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	// A tree that forks all the time.
	pid := ts.startProcess(lease, `echo ready; while :; do (true); done`)
	st := ts.connect(lease, pid, 0)
	st.next(false)
	var sb sandboxData
	ts.mustCall("POST", "/sandboxes/"+lease+"/pause", nil, &sb)
	if sb.Status != "pausing" && sb.Status != "paused" {
		t.Fatalf("pause answered %q", sb.Status)
	}
	waitStatus(t, ts, lease, "paused")
	ts.srv.mu.Lock()
	l := ts.srv.leases[lease]
	ts.srv.mu.Unlock()
	table, _ := proctree.Read()
	roots := l.hostRoots()
	if len(roots) == 0 {
		t.Fatal("the lease runs nothing")
	}
	if l.freezer() {
		// The whole lease, its init too, is frozen by the kernel: a frozen
		// task shows as D (v1), and SIGCONT does not wake it.
		proctree.Signal([]int{l.machine.Pid()}, syscall.SIGCONT)
		if state := ts.freezerState(lease); state != "FROZEN" {
			t.Errorf("the lease's freezer is %q while paused", state)
		}
		table, _ = proctree.Read()
		roots = []int{l.machine.Pid()}
	}
	for _, p := range table.Tree(roots[0]) {
		if s := table.State(p); s != 'T' && s != 'Z' && !(l.freezer() && s == 'D') {
			t.Errorf("process %d is in state %c while paused", p, s)
		}
	}
	if status := ts.call("POST", "/sandboxes/"+lease+"/processes", map[string]any{"cmd": "true", "args": []string{}}, nil); status != http.StatusConflict {
		t.Errorf("process create while paused: %d, want 409", status)
	}
	ts.mustCall("POST", "/sandboxes/"+lease+"/pause", nil, &sb)
	if sb.Status != "paused" {
		t.Errorf("pause of a paused sandbox: %q", sb.Status)
	}
	ts.mustCall("POST", "/sandboxes/"+lease+"/resume", nil, &sb)
	waitStatus(t, ts, lease, "running")
	table, _ = proctree.Read()
	running := 0
	for _, p := range table.Tree(roots[0]) {
		if table.State(p) != 'T' && table.State(p) != 'D' {
			running++
		}
	}
	if running == 0 {
		t.Error("nothing runs after resume")
	}
	// A transition in progress refuses another.
	l.transition([]string{stateRunning}, statePausing)
	if status := ts.call("POST", "/sandboxes/"+lease+"/resume", nil, nil); status != http.StatusConflict {
		t.Errorf("resume while pausing: %d, want 409", status)
	}
	l.pause()
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
}

// waitStatus polls GET sandbox until it reports want.
func waitStatus(t *testing.T, ts *testServer, lease, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var sb sandboxData
		ts.mustCall("GET", "/sandboxes/"+lease, nil, &sb)
		if sb.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox stays %q, want %q", sb.Status, want)
		}
		time.Sleep(5 * time.Millisecond) // polling, as the protocol's clients do
	}
}

func TestProcessGroupFallback(t *testing.T) {
	// Commands run as uid 65534 and must reach the root by path.
	dir, err := os.MkdirTemp("", "sandboxd-fallback-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ts := startServer(t, Options{Isolation: IsolationProcessGroup, Root: filepath.Join(dir, "root")})
	if ts.srv.Isolation() != IsolationProcessGroup {
		t.Fatalf("isolation %q", ts.srv.Isolation())
	}
	lease := ts.createLease()
	var sb sandboxData
	ts.mustCall("GET", "/sandboxes/"+lease, nil, &sb)
	hostWorkspace := filepath.Join(ts.root, leasesDir, lease, "workspace")
	if sb.Isolation != "process-group" || sb.Workspace != hostWorkspace {
		t.Errorf("sandbox %+v: want process-group isolation and the host workspace", sb)
	}
	if ts.putFile(lease, hostWorkspace+"/f", "content") != http.StatusOK {
		t.Fatal("upload failed")
	}
	out := ts.run(lease, `pwd; cat f; echo; id -u; exit 4`)
	want := hostWorkspace + "\ncontent\n65534\n"
	if os.Geteuid() != 0 {
		want = hostWorkspace + "\ncontent\n" + strconv.Itoa(os.Geteuid()) + "\n"
	}
	if out.stdout.String() != want || out.last.ExitCode == nil || *out.last.ExitCode != 4 {
		t.Errorf("got %q %+v, want %q and exit 4", out.stdout.String(), out.last, want)
	}
	// The tree is held by a subreaper: a double-forked grandchild counts
	// and dies with it.
	pid := ts.startProcess(lease, strings.ReplaceAll(doubleFork, "/workspace", hostWorkspace))
	ts.connect(lease, pid, 0).drain(0)
	if w, status := ts.waitTree(lease, pid, 50*time.Millisecond); status != http.StatusOK || w.TreeExited {
		t.Errorf("wait with a grandchild alive: %d %+v, want the tree not exited", status, w)
	}
	var del struct {
		TreeExited bool `json:"tree_exited"`
	}
	ts.mustCall("DELETE", "/sandboxes/"+lease+"/processes/"+pid+"?grace_ms=0", nil, &del)
	if !del.TreeExited {
		t.Error("tree_exited false")
	}
	assertNoProcesses(t, ts.root)
}

func syscallKill0(pid int) error { return syscall.Kill(pid, 0) }

func TestLimitsApply(t *testing.T) {
	ts := startServer(t, Options{MaxProcesses: 40, MaxOpenFiles: 100})
	lease := ts.createLease()
	// The init's threads count against the limit too, so fewer than 40
	// background processes can start.
	// (dash, unlike bash, does not retry a failed fork.)
	r := ts.exec(lease, `ulimit -u; ulimit -n; sh -c 'i=0; while [ $i -lt 60 ]; do sleep 1000 & i=$((i+1)); done; echo all started'`)
	if r.Stdout != "40\n100\n" || !strings.Contains(r.Stderr, "fork") {
		t.Errorf("limits: %q %q: want 40 processes, 100 files and a failed fork", r.Stdout, r.Stderr)
	}
	// What the exec started in the background lives in the lease (before
	// leases had an init of their own, it died with the exec) until the
	// lease is destroyed.
	if st, _ := ts.srv.Stats(); st.Processes == 0 {
		t.Error("the exec's background processes died with it")
	}
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
	if st, _ := ts.srv.Stats(); st.Processes != 0 {
		t.Errorf("%d processes alive after destroy", st.Processes)
	}
}

func TestExitedProcessesAreForgottenInTime(t *testing.T) {
	ts := startServer(t, Options{KeepExited: 2})
	lease := ts.createLease()
	var pids []string
	for i := range 4 {
		pid := ts.startProcess(lease, fmt.Sprintf("echo %d", i))
		ts.waitTree(lease, pid, 10*time.Second)
		pids = append(pids, pid)
	}
	for i := range 20 {
		ts.exec(lease, fmt.Sprintf("echo %d", i))
	}
	for i, pid := range pids {
		_, status := ts.waitTree(lease, pid, time.Second)
		if want := map[bool]int{true: 404, false: 200}[i < 2]; status != want {
			t.Errorf("process %d: %d, want %d", i, status, want)
		}
	}
	ts.srv.mu.Lock()
	l := ts.srv.leases[lease]
	ts.srv.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.procs) != 2 {
		t.Errorf("the lease holds %d process records, want 2", len(l.procs))
	}
}

// The lease's /tmp is a Debian machine's: mode 1777, every user of the
// lease may make files there. Before, it was 0700 and the lease root's:
// apt's _apt user could not make its temporary files, `apt-get update`
// failed, and so did the Go SDK's custom-template example (its
// Dockerfile's RUN apt-get update) and every program of a user of its own.
// The lease directory is traversable by the lease's own ids only, so a
// host user reaches the lease's /tmp no more than before.
func TestLeaseTmpIsEveryLeaseUsersAndNoHostUsers(t *testing.T) {
	testenv.RequireRoot(t, "a lease of its own ids and a host user to try with")
	dir, err := os.MkdirTemp("", "sandboxd-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711) // the host user below gets as far as the server's root
	t.Cleanup(func() { os.RemoveAll(dir) })
	ts := startServer(t, Options{Root: filepath.Join(dir, "root")})
	if ts.srv.Isolation() != IsolationNamespaces {
		t.Fatalf("isolation %q, want namespaces", ts.srv.Isolation())
	}
	lease := ts.createLease()
	out := ts.exec(lease, `
		stat -c %a /tmp
		su -s /bin/sh _apt -c 'f=$(mktemp) && echo apt-wrote && rm "$f"'
		echo root > /tmp/of-root
		su -s /bin/sh nobody -c 'rm -f /tmp/of-root' 2>/dev/null || echo kept`)
	if out.Stdout != "1777\napt-wrote\nkept\n" || out.ExitCode != 0 {
		t.Errorf("in the lease: %q (exit %d), want /tmp 1777 (apt's _apt makes files there), sticky", out.Stdout, out.ExitCode)
	}
	host := exec.Command("/bin/ls", filepath.Join(ts.root, leasesDir, lease, "tmp"))
	host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 54321, Gid: 54321}}
	if b, err := host.CombinedOutput(); err == nil || !strings.Contains(string(b), "Permission denied") {
		t.Errorf("a host user listed the lease's /tmp: %q %v", b, err)
	}
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
}
