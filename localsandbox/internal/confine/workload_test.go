package confine

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"golang.org/x/sys/unix"
)

func init() {
	children["workload"] = workloadChild
	children["nested-userns"] = nestedUserNSChild
}

// workloadScript is what the confined, exec'd shell runs: the package-tool
// staples, a C program with a thread and a fork (glibc tries clone3 first
// and must fall back to clone), and the confinement as the kernel reports it.
const workloadScript = `set -e
cd "$CONFINE_WORK"
echo shell ok
touch owned
chown 1:1 owned
echo "chown $(stat -c %u:%g owned)"
echo "id $(id -u)"
grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status
cat > t.c <<'CSRC'
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
static void *run(void *arg) { return arg; }
int main(void) {
	pthread_t th;
	void *out;
	if (pthread_create(&th, 0, run, (void *)42) || pthread_join(th, &out) || out != (void *)42) return 1;
	pid_t pid = fork();
	if (pid == 0) _exit(7);
	int st;
	if (waitpid(pid, &st, 0) != pid || WEXITSTATUS(st) != 7) return 2;
	printf("c thread and fork ok\n");
	return 0;
}
CSRC
gcc -pthread -o t t.c
./t
if command -v python3 >/dev/null; then
	python3 -c 'import subprocess, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
assert subprocess.run(["true"]).returncode == 0
print("python thread and subprocess ok")'
fi
`

// TestApplyKeepsOrdinaryWork runs a confined command the way a lease does:
// root of its own user namespace (uids 1.. mapped, so that chown and
// setuid have somewhere to go) and mount namespace, Apply, then exec.
func TestApplyKeepsOrdinaryWork(t *testing.T) {
	requireRoot(t)
	testenv.RequireCommand(t, "gcc") // for the threaded C program
	cmd := child(t, "workload")
	cmd.Env = append(cmd.Env, "CONFINE_WORK="+t.TempDir())
	userns(cmd)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("confined workload: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	t.Logf("confined workload:\n%s", out)
	want := []string{
		"go threads ok", "go loopback tcp ok", "go setuid 1000 ok",
		"shell ok", "chown 1:1", "id 0", "c thread and fork ok",
		fmt.Sprintf("CapBnd:\t%016x", keptMask()),
		fmt.Sprintf("CapEff:\t%016x", keptMask()),
		fmt.Sprintf("CapPrm:\t%016x", keptMask()),
		"CapInh:\t0000000000000000", "CapAmb:\t0000000000000000",
		"NoNewPrivs:\t1", "Seccomp:\t2",
	}
	if _, err := exec.LookPath("python3"); err == nil {
		want = append(want, "python thread and subprocess ok")
	}
	for _, w := range want {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("confined workload output lacks %q", w)
		}
	}
}

// userns puts cmd in a new user and mount namespace as root, with uid and
// gid 1..65535 mapped as well.
func userns(cmd *exec.Cmd) {
	cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS
	maps := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: 1, HostID: 100001, Size: 65535}}
	cmd.SysProcAttr.UidMappings = maps
	cmd.SysProcAttr.GidMappings = maps
	cmd.SysProcAttr.GidMappingsEnableSetgroups = true
}

func workloadChild() error {
	// An init may hand down inheritable capabilities; for root, execve
	// would add them to the new permitted set past the bounding set.
	if err := raiseInheritable(unix.CAP_SYS_ADMIN); err != nil {
		return err
	}
	if err := Apply(Policy{}); err != nil {
		return err
	}
	if err := goThreads(); err != nil {
		return fmt.Errorf("threads: %w", err)
	}
	fmt.Println("go threads ok")
	if err := loopbackTCP(); err != nil {
		return fmt.Errorf("loopback tcp: %w", err)
	}
	fmt.Println("go loopback tcp ok")
	id := exec.Command("/usr/bin/id", "-u")
	id.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{1000}}}
	if out, err := id.Output(); err != nil || strings.TrimSpace(string(out)) != "1000" {
		return fmt.Errorf("setuid 1000: %q, %v", out, err)
	}
	fmt.Println("go setuid 1000 ok")
	return syscall.Exec("/bin/sh", []string{"sh", "-c", workloadScript}, os.Environ())
}

func raiseInheritable(c uint) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[c/32].Inheritable |= 1 << (c % 32)
	return unix.Capset(&hdr, &data[0])
}

// goThreads makes the runtime start OS threads (each goroutine locks one
// and keeps it to its end, so the runtime must make more) and has them run.
func goThreads() error {
	var wg sync.WaitGroup
	tids := make(chan int, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // the thread ends with the goroutine
			tids <- syscall.Gettid()
		}()
	}
	wg.Wait()
	close(tids)
	seen := map[int]bool{}
	for tid := range tids {
		seen[tid] = true
	}
	if len(seen) != 8 {
		return fmt.Errorf("%d distinct threads, want 8", len(seen))
	}
	return nil
}

func loopbackTCP() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = io.Copy(c, c)
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil {
		return err
	}
	if string(got) != "ping" {
		return fmt.Errorf("echo %q", got)
	}
	return <-accepted
}

// TestAllowNestedUserNS: with the option a confined command can make a
// user namespace of its own, and still cannot mount.
func TestAllowNestedUserNS(t *testing.T) {
	requireRoot(t)
	cmd := child(t, "nested-userns")
	userns(cmd)
	var report map[string]string
	runChild(t, cmd, &report)
	if report["clone(CLONE_NEWUSER)"] != "ok" || report["mount"] != "EPERM" {
		t.Errorf("with AllowNestedUserNS: %v, want clone(CLONE_NEWUSER) ok and mount EPERM", report)
	}
}

func nestedUserNSChild() error {
	dir, err := os.MkdirTemp("", "confine-nested")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	if err := Apply(Policy{AllowNestedUserNS: true}); err != nil {
		return err
	}
	nested := exec.Command("/bin/true")
	nested.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	report := map[string]string{
		"clone(CLONE_NEWUSER)": outcome(nested.Run()),
		"mount":                outcome(syscall.Mount("confine", dir, "tmpfs", 0, "")),
	}
	return jsonOut(report)
}
