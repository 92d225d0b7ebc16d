package confine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"syscall"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"golang.org/x/sys/unix"
)

// The tests that prove confinement run in a child: Apply is irreversible,
// so the test binary re-executes itself with childEnv naming what the child
// should do (see children), and the test reads the child's JSON report.
const childEnv = "CONFINE_TEST_CHILD"

// children are the roles a re-executed test binary can play, by name. Each
// writes its report to stdout (or execs a program that does) and exits.
var children = map[string]func() error{}

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		run, ok := children[role]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
			os.Exit(2)
		}
		runtime.LockOSThread()
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child prepares the test binary to run as role.
func child(t testing.TB, role string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"="+role)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// runChild runs cmd and decodes its stdout as JSON into report.
func runChild(t testing.TB, cmd *exec.Cmd, report any) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child %v: %v\nstdout:\n%s\nstderr:\n%s", cmd.Env[len(cmd.Env)-1], err, stdout.String(), stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), report); err != nil {
		t.Fatalf("child report: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
}

// requireRoot skips where the kernel would refuse the control cases for
// want of privilege, which would make them prove nothing.
func requireRoot(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "needs root: the control cases must be able to do what the confined ones cannot")
}

// outcome says how a syscall ended: "ok" or the errno's name.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		if name := unix.ErrnoName(e); name != "" {
			return name
		}
	}
	return err.Error()
}

// sortedKeys returns m's keys in order, for stable logs.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
