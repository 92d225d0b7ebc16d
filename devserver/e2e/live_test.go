package e2e

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/internal/starter"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// gatedScript prints "line 1", waits for the file gate to appear in its
// workspace, then prints "line 2".."line n".
func gatedScript(n int) (script, want string) {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return fmt.Sprintf(`echo line 1; while [ ! -e gate ]; do sleep 0.05; done; i=2; while [ $i -le %d ]; do echo line $i; i=$((i+1)); done`, n), b.String()
}

func TestStarterPrintsOutputLiveWhileTheCommandRuns(t *testing.T) {
	script, want := gatedScript(20)
	// The command cannot go past line 1 until the test has seen line 1 on
	// the starter's stdout, so line 1 must have come live, through the
	// heartbeats; if it did not, the command times out (exit 124).
	code, stdout, stderr := runGatedStarter(t, "--timeout", "60s", "--", "sh", "-c", script)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, want, stdout, "each line once, in order")
	assert.NotContains(t, stderr, "skipped")
}

func TestStarterPrintsSessionOutputLive(t *testing.T) {
	script, want := gatedScript(5)
	code, stdout, stderr := runGatedStarter(t, "--timeout", "60s", "--then", "echo second; echo command",
		"--", "sh", "-c", script)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, want+"second\ncommand\n", stdout, "each line once, in order, command after command")
}

// runGatedStarter runs the starter on a command that prints "line 1" and
// then waits for a file named gate in its workspace: once the starter has
// printed line 1, the test creates the gate through a second process in
// the (only) lease. It returns what runStarter does.
func runGatedStarter(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	s := stackOf(t)
	t.Cleanup(func() { assertNothingLeaked(t) })
	out := newWatchedBuffer("line 1\n")
	var errOut bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		code = starter.Main(t.Context(), args, starter.IO{Stdin: strings.NewReader(""), Stdout: out, Stderr: &errOut},
			client.Options{HostPort: s.Temporal.FrontendHostPort(), Namespace: s.Temporal.Namespace()}, nil)
	}()
	t.Cleanup(func() { <-done }) // t.Context() has ended, so the starter returns
	select {
	case <-out.seen:
		openGate(t, s)
	case <-done:
		t.Fatalf("the starter ended before printing line 1: %s", errOut.String())
	}
	<-done
	return code, out.String(), errOut.String()
}

// openGate creates the file gate in the workspace of the stack's only
// lease.
func openGate(t *testing.T, s *stack.Stack) {
	t.Helper()
	direct, err := s.Provider(createos.Config{})
	require.NoError(t, err)
	leases, err := direct.ListLeases(t.Context(), nil)
	require.NoError(t, err)
	require.Len(t, leases, 1)
	res, err := direct.Execute(t.Context(), leases[0], sandbox.Command{Argv: []string{"touch", "gate"}}, nil)
	require.NoError(t, err)
	require.True(t, res.Succeeded(), "%+v", res)
}

// watchedBuffer is a buffer that closes seen once it holds want.
type watchedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
}

func newWatchedBuffer(want string) *watchedBuffer {
	return &watchedBuffer{want: want, seen: make(chan struct{})}
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(w.buf.String(), w.want)
	n, err := w.buf.Write(p)
	if !had && strings.Contains(w.buf.String(), w.want) {
		close(w.seen)
	}
	return n, err
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
