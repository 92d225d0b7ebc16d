package localsandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// A test binary started with childServerEnv set runs a server on that root
// instead of the tests, prints its address, and serves until killed: the
// server whose crash TestRestartSweepsWhatACrashedServerLeft simulates.
const (
	childServerEnv    = "LOCALSANDBOX_TEST_CHILD_ROOT"
	childIsolationEnv = "LOCALSANDBOX_TEST_CHILD_ISOLATION"
)

func TestMain(m *testing.M) {
	if root := os.Getenv(childServerEnv); root != "" {
		srv, err := New(Options{InsecureNoAuth: true, Root: root, Isolation: Isolation(os.Getenv(childIsolationEnv)),
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(ln.Addr())
		srv.Serve(ln)
		os.Exit(0)
	}
	if err := ensureTestImage(); err != nil {
		fmt.Fprintf(os.Stderr, "localsandbox tests: the default image: %v\n", err)
		if os.Getenv("CI") == "true" {
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// sharedRoot returns a root that uid 65534 can reach (process-group mode
// needs that), removed after the test.
func sharedRoot(t *testing.T) string {
	dir, err := os.MkdirTemp("", "sandboxd-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "root")
}

func TestRestartSweepsWhatACrashedServerLeft(t *testing.T) {
	for _, isolation := range []Isolation{IsolationNamespaces, IsolationProcessGroup} {
		t.Run(string(isolation), func(t *testing.T) {
			root := sharedRoot(t)
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), childServerEnv+"="+root, childIsolationEnv+"="+string(isolation))
			stdout, _ := child.StdoutPipe()
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { child.Process.Kill(); child.Wait() })
			addr, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || strings.HasPrefix(addr, "error") {
				t.Fatalf("child server: %q %v", addr, err)
			}
			ts := &testServer{t: t, base: "http://" + strings.TrimSpace(addr) + "/v1", root: root}
			lease := ts.createLease()
			workspace := "/workspace"
			if isolation == IsolationProcessGroup {
				workspace = filepath.Join(root, leasesDir, lease, "workspace")
			}
			// A daemon that leaves its process group and session.
			ts.startProcess(lease, `(setsid sleep 1000 &); echo started > `+workspace+`/started; exec sleep 1000`)
			for ts.exec(lease, "cat "+workspace+"/started").Stdout != "started\n" {
				time.Sleep(5 * time.Millisecond)
			}
			if pids, _ := SandboxProcesses(root); len(pids) < 3 {
				t.Fatalf("%d processes before the crash, want the init and two sleeps", len(pids))
			}

			child.Process.Kill()
			child.Wait()
			// The inits die with their server (parent-death signal); in
			// process-group mode the daemon survives: that is what the
			// sweep is for.
			leftovers := waitForLeftovers(t, root, isolation == IsolationProcessGroup)
			t.Logf("%d processes survived the crash", leftovers)
			if _, err := os.Stat(filepath.Join(root, leasesDir, lease)); err != nil {
				t.Fatalf("the crash left no workspace to sweep: %v", err)
			}

			srv, err := New(Options{InsecureNoAuth: true, Root: root, Isolation: isolation, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			assertNoProcesses(t, root)
			if entries, _ := os.ReadDir(filepath.Join(root, leasesDir)); len(entries) != 0 {
				t.Errorf("%d workspaces of the crashed server left", len(entries))
			}
		})
	}
}

// waitForLeftovers waits until only the processes that outlive their
// server's crash remain, and returns how many there are. In namespace mode
// none may remain; with survivors, at least one must.
func waitForLeftovers(t *testing.T, root string, survivors bool) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		pids, err := SandboxProcesses(root)
		if err != nil {
			t.Fatal(err)
		}
		inits := 0
		for _, pid := range pids {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.HasPrefix(string(cmdline), leaseinit.Arg0+"\x00") {
				inits++
			}
		}
		if inits == 0 && (len(pids) > 0) == survivors {
			return len(pids)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the crash: %d processes of which %d inits", len(pids), inits)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSweepKillsLeftoverInits leaves a lease init (with a supervisor and
// its command) and a process-group supervisor started without the
// parent-death signal that normally takes it down with its server running,
// and checks that a new server on the root kills them all.
func TestSweepKillsLeftoverInits(t *testing.T) {
	root := sharedRoot(t)
	s, err := New(Options{InsecureNoAuth: true, Root: root, Isolation: IsolationNamespaces, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := s.createLease(leaseSpec{shape: shapes[0]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.start([]string{"sleep", "1000"}, "", nil, false, nil); err != nil {
		t.Fatal(err)
	}

	cfg := leaseinit.SupervisorConfig{Argv: []string{"sleep", "1000"}, Cwd: "/", Env: []string{"PATH=" + sandboxPath},
		WorkspacePath: lease.workspaceHost}
	configR, configW, _ := os.Pipe()
	statusR, statusW, _ := os.Pipe()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{leaseinit.Arg0, root}
	cmd.ExtraFiles = []*os.File{configR, statusW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	configR.Close()
	statusW.Close()
	json.NewEncoder(configW).Encode(cfg)
	configW.Close()
	line, _ := bufio.NewReader(statusR).ReadString('\n')
	statusR.Close()
	if !strings.Contains(line, `"started":true`) {
		t.Fatalf("supervisor: %s", line)
	}
	reaped := make(chan struct{})
	go func() { cmd.Wait(); close(reaped) }() // once the sweep kills it
	t.Cleanup(func() { cmd.Process.Kill(); <-reaped })

	if pids, _ := SandboxProcesses(root); len(pids) != 5 {
		t.Fatalf("%d processes, want a lease init, two supervisors and two sleeps", len(pids))
	}
	// The server "crashes": it releases the root without cleaning up.
	s.lock.Close()

	srv, err := New(Options{InsecureNoAuth: true, Root: root, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	assertNoProcesses(t, root)
	if _, err := os.Stat(lease.dir); !os.IsNotExist(err) {
		t.Errorf("the old lease directory survived the sweep: %v", err)
	}
}

func TestRootIsExclusive(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	quiet := slog.New(slog.DiscardHandler)
	first, err := New(Options{InsecureNoAuth: true, Root: root, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Shutdown(context.Background())
	if _, err := New(Options{InsecureNoAuth: true, Root: root, Logger: quiet}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second server on the same root: %v", err)
	}
	foreign := t.TempDir()
	os.WriteFile(filepath.Join(foreign, "precious"), []byte("x"), 0o644)
	if _, err := New(Options{InsecureNoAuth: true, Root: foreign, Logger: quiet}); err == nil || !strings.Contains(err.Error(), "not a sandboxd root") {
		t.Errorf("server on a foreign directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(foreign, "precious")); err != nil {
		t.Errorf("the foreign directory was touched: %v", err)
	}
}
