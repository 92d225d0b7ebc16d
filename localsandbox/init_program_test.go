package localsandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// buildInitProgram builds cmd/sandboxflow-init into a temporary directory.
func buildInitProgram(t *testing.T) string {
	t.Helper()
	prog := filepath.Join(t.TempDir(), leaseinit.Program)
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", prog, "github.com/sandboxflow/sandboxflow/localsandbox/cmd/"+leaseinit.Program)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return prog
}

// TestLeasesRunTheInitProgram: given a build of cmd/sandboxflow-init, a
// server runs each lease's init and each managed process's supervisor
// from it, not from its own (here the test's) binary, and commands behave
// as they do under the server's own binary.
func TestLeasesRunTheInitProgram(t *testing.T) {
	prog := buildInitProgram(t)
	ts := startServer(t, Options{InitProgram: prog})
	lease := ts.createLease()
	init := ts.leaseInit(lease)
	if exe := hostExe(t, init); exe != prog {
		t.Errorf("the lease init runs %s, want the init program %s", exe, prog)
	}

	pid := ts.startProcess(lease, "sleep 30")
	defer ts.call("POST", "/sandboxes/"+lease+"/processes/"+pid+"/kill", nil, nil)
	children, err := os.ReadFile("/proc/" + strconv.Itoa(init) + "/task/" + strconv.Itoa(init) + "/children")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(children))
	if len(fields) != 1 {
		t.Fatalf("the lease init has children %q, want one supervisor", fields)
	}
	supervisor, _ := strconv.Atoi(fields[0])
	if exe := hostExe(t, supervisor); exe != prog {
		t.Errorf("the supervisor runs %s, want the init program %s", exe, prog)
	}
	// ps names them by the marker, not by the descriptor they were run from.
	for _, pid := range []int{init, supervisor} {
		if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); string(comm) != leaseinit.Arg0[:15]+"\n" {
			t.Errorf("pid %d is named %q in ps", pid, comm)
		}
	}

	if res := ts.exec(lease, "echo exec; exit 3"); res.Stdout != "exec\n" || res.ExitCode != 3 {
		t.Errorf("exec: %+v", res)
	}
	if out := ts.run(lease, "echo managed; exit 4"); out.stdout.String() != "managed\n" || out.last.ExitCode == nil || *out.last.ExitCode != 4 {
		t.Errorf("managed process: %q %+v", out.stdout.String(), out.last)
	}

	// In process-group mode the server starts each supervisor on the host,
	// as an unprivileged uid, from the same open descriptor.
	dir, err := os.MkdirTemp("", "sandboxd-init-program-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711) // commands run as uid 65534 and reach the root by path
	t.Cleanup(func() { os.RemoveAll(dir) })
	pg := startServer(t, Options{InitProgram: prog, Isolation: IsolationProcessGroup, Root: filepath.Join(dir, "root")})
	if out := pg.run(pg.createLease(), "echo managed; exit 5"); out.stdout.String() != "managed\n" || out.last.ExitCode == nil || *out.last.ExitCode != 5 {
		t.Errorf("managed process, process-group mode: %q %+v", out.stdout.String(), out.last)
	}
}

// hostExe is the program pid runs, as the host sees it.
func hostExe(t *testing.T, pid int) string {
	t.Helper()
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		t.Fatalf("the program of pid %d: %v", pid, err)
	}
	return exe
}

// TestAnInitProgramThatDoesNotSpeakTheProtocolIsRefused: a server refuses
// to start with an init program that is stale (another ProtocolVersion) or
// no init program at all, and says which and where it came from, rather
// than failing at its first lease or, worse, misreading one.
func TestAnInitProgramThatDoesNotSpeakTheProtocolIsRefused(t *testing.T) {
	notExecutable := filepath.Join(t.TempDir(), leaseinit.Program)
	if err := os.WriteFile(notExecutable, []byte("\x7fELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, program, env string
		want               []string
	}{
		// echo answers the handshake with its arguments: another version.
		{name: "another protocol", program: "/bin/echo", want: []string{"/bin/echo (Options.InitProgram)", `speaks "- version"`, leaseinit.ProtocolVersion}},
		{name: "no answer", program: "/bin/true", want: []string{"does not answer as an init program", "cmd/" + leaseinit.Program}},
		{name: "missing", program: "/nonexistent/" + leaseinit.Program, want: []string{"no such file"}},
		{name: "not executable", program: notExecutable, want: []string{"not an executable file"}},
		{name: "from the environment", env: "/bin/echo", want: []string{"/bin/echo ($" + InitProgramEnv + ")", "speaks"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(InitProgramEnv, c.env)
			root := filepath.Join(t.TempDir(), "root")
			_, err := New(Options{InsecureNoAuth: true, Root: root, InitProgram: c.program})
			if err == nil {
				t.Fatal("New accepted it")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			// Nothing held: the root is free for a server that starts.
			t.Setenv(InitProgramEnv, "")
			startServer(t, Options{Root: root})
		})
	}
}
