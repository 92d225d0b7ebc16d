package localsandbox

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// The done-when of a lease as one machine: a server started in the
// background by one exec is reachable from the next over 127.0.0.1, and
// lives until the sandbox is destroyed. (Before leases had an init of their
// own, each exec had fresh namespaces and its background processes died
// with it.)
func TestBackgroundServerOutlivesItsExecAndIsReachable(t *testing.T) {
	testenv.RequireFile(t, "/usr/bin/python3")
	ts := startServer(t, Options{})
	lease := ts.createLease()
	r := ts.exec(lease, `sh -c 'nohup python3 -m http.server 8089 --bind 127.0.0.1 --directory /workspace &'`)
	if r.ExitCode != 0 {
		t.Fatalf("starting the server: %+v", r)
	}
	if ts.putFile(lease, "/workspace/hello.txt", "hello from the lease") != http.StatusOK {
		t.Fatal("upload failed")
	}
	r = ts.exec(lease, `for i in $(seq 1 500); do
		python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8089/hello.txt").read().decode())' 2>/dev/null && exit 0
		sleep 0.02
	done; exit 1`)
	if r.ExitCode != 0 || r.Stdout != "hello from the lease\n" {
		t.Fatalf("the server of the first exec is not reachable from the second: %+v", r)
	}
	// Another lease has a loopback of its own.
	other := ts.createLease()
	if r := ts.exec(other, `(exec 3<>/dev/tcp/127.0.0.1/8089) 2>/dev/null && echo reached || echo refused`); r.Stdout != "refused\n" {
		t.Errorf("another lease reached the server: %q", r.Stdout)
	}
	if len(hostPIDs(t, ts, lease, "python3\x00")) != 1 {
		t.Fatal("the server is not running in the lease")
	}
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
	if st, _ := ts.srv.Stats(); st.Processes != 0 {
		t.Errorf("%d processes alive after destroy", st.Processes)
	}
}

// ps in a lease shows the lease's processes, of every exec and managed
// process, and no others.
func TestPsShowsTheLeasesProcessesOnly(t *testing.T) {
	ts := startServer(t, Options{})
	lease, other := ts.createLease(), ts.createLease()
	ts.startProcess(other, `exec sleep 1001`)
	pid := ts.startProcess(lease, `exec sleep 1002`)
	ts.exec(lease, `(setsid sleep 1003 &)`)
	var r execResult
	for deadline := time.Now().Add(10 * time.Second); ; {
		r = ts.exec(lease, `ps -eo pid=,args= | grep -v 'ps -eo' | grep -v grep`)
		// Until both run (setsid execs sleep a moment after it forked).
		if strings.Contains(r.Stdout, " sleep 1002\n") && strings.Contains(r.Stdout, " sleep 1003\n") || time.Now().After(deadline) {
			break
		}
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	want := map[string]bool{"sleep 1002": false, "sleep 1003": false, leaseinit.Arg0: false}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		args := strings.Join(f[1:], " ")
		switch {
		case f[0] == "1" && strings.HasPrefix(args, leaseinit.Arg0):
			want[leaseinit.Arg0] = true
		case strings.HasPrefix(args, leaseinit.Arg0): // the supervisor of the managed sleep
		case args == "sleep 1002", args == "sleep 1003":
			want[args] = true
		case strings.HasPrefix(args, "/bin/bash -c ps"), strings.HasPrefix(args, "bash -c"):
		default:
			t.Errorf("the lease sees a process that is not its own: %q", line)
		}
	}
	for what, seen := range want {
		if !seen {
			t.Errorf("ps does not show %s:\n%s", what, r.Stdout)
		}
	}
	if strings.Contains(r.Stdout, "sleep 1001") {
		t.Error("the lease sees another lease's process")
	}
	// Killing the managed process's tree kills exactly its tree: the
	// exec's daemon lives on.
	ts.mustCall("DELETE", "/sandboxes/"+lease+"/processes/"+pid+"?grace_ms=0", nil, nil)
	if r := ts.exec(lease, `ps -eo args= | grep -c '^sleep 100[23]'`); r.Stdout != "1\n" {
		t.Errorf("after killing the managed process, the lease runs %q sleeps, want 1", r.Stdout)
	}
}

// minimalRootfs makes a directory of root file systems holding one, "tiny":
// dash and the C library, nothing else.
func minimalRootfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "tiny")
	for _, f := range []string{"/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"} {
		b, err := os.ReadFile(f)
		if err != nil {
			testenv.Missing(t, "no "+f+" on this host")
		}
		dst := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "os-release"), []byte("ID=tiny\n"), 0o644)
	return dir
}

func TestRootfsPicksTheLowerLayer(t *testing.T) {
	ts := startServer(t, Options{RootfsDir: minimalRootfs(t)})
	var sb struct {
		ID     string `json:"id"`
		Rootfs string `json:"rootfs"`
	}
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": "tiny"}, &sb)
	if sb.Rootfs != "tiny" {
		t.Errorf("rootfs %q", sb.Rootfs)
	}
	var out struct{ Result execResult }
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "/bin/dash", "args": []string{"-c",
		`read id < /etc/os-release; echo "$id"; echo changed > /etc/os-release; read id < /etc/os-release; echo "$id"; cd /; echo *`}}, &out)
	if out.Result.Stdout != "ID=tiny\nchanged\nbin dev etc lib lib64 proc tmp workspace\n" {
		t.Errorf("in the tiny rootfs: %+v", out.Result)
	}
	for _, name := range []string{"nope", "..", "tiny/../tiny", "a,b"} {
		if status := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": name}, nil); status != http.StatusBadRequest {
			t.Errorf("rootfs %q: %d, want 400", name, status)
		}
	}
}

func TestUnknownRootfsWithoutARootfsDir(t *testing.T) {
	ts := startServer(t, Options{})
	if status := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": "ubuntu-24.04"}, nil); status != http.StatusBadRequest {
		t.Errorf("rootfs on a server without any: %d, want 400", status)
	}
}

// The lease init leads a session of its own without a controlling
// terminal, and no command inherits a descriptor of it.
func TestLeaseInitHasNoTerminal(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.leaseInit(lease)
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid pgrp session tty_nr ...
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	if f[3] != strconv.Itoa(pid) || f[4] != "0" {
		t.Errorf("the lease init's session %s, tty %s: want its own session (%d) and no terminal", f[3], f[4], pid)
	}
	r := ts.exec(lease, `ls /proc/self/fd | sort -n | tr '\n' ' '; cat /dev/tty 2>/dev/null && echo "a terminal"`)
	if r.Stdout != "0 1 2 3 " { // 3: the directory ls reads
		t.Errorf("an exec's descriptors: %q", r.Stdout)
	}
}
