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
	"go.temporal.io/sdk/worker"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// gatedScript prints "line 1".."line n"; after each line g of gates it
// waits for the file gate-g to appear in its workspace.
func gatedScript(n int, gates ...int) (script, want string) {
	var s, w strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&s, "echo line %d; ", i)
		fmt.Fprintf(&w, "line %d\n", i)
		for _, g := range gates {
			if g == i {
				fmt.Fprintf(&s, "while [ ! -e gate-%d ]; do sleep 0.05; done; ", g)
			}
		}
	}
	return s.String() + "true", w.String()
}

// A gate opens once the starter's stdout holds "line <line>\n", after
// before (if not nil) has run.
type gate struct {
	line   int
	before func()
}

func TestStarterPrintsOutputLiveWhileTheCommandRuns(t *testing.T) {
	script, want := gatedScript(20, 1)
	// The command cannot go past line 1 until the test has seen line 1 on
	// the starter's stdout, so line 1 must have come live, through the
	// heartbeats; if it did not, the command times out (exit 124).
	code, stdout, stderr := runGatedStarter(t, []gate{{line: 1}}, "--timeout", "60s", "--", "sh", "-c", script)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, want, stdout, "each line once, in order")
	assert.NotContains(t, stderr, "skipped")
}

func TestStarterPrintsSessionOutputLive(t *testing.T) {
	script, want := gatedScript(5, 1)
	code, stdout, stderr := runGatedStarter(t, []gate{{line: 1}}, "--timeout", "60s", "--then", "echo second; echo command",
		"--", "sh", "-c", script)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, want+"second\ncommand\n", stdout, "each line once, in order, command after command")
}

func TestStarterLiveOutputContinuesAcrossAWorkerCrash(t *testing.T) {
	s := stackOf(t)
	queue := "e2e-live-crash"
	provider, err := s.Provider(createos.Config{})
	require.NoError(t, err)
	startWorker := func() worker.Worker {
		w := worker.New(s.Client, queue, worker.Options{})
		workflows.Register(w, provider)
		require.NoError(t, w.Start())
		return w
	}
	first := startWorker()
	script, want := gatedScript(10, 1, 5)
	// Line 1 has been printed live; the worker that runs the command goes
	// away (its attempt detaches), and another one re-attaches to the
	// command, which goes on only then. Lines 2..5 must come live from the
	// new attempt's heartbeats, continuing the same stream.
	code, stdout, stderr := runGatedStarter(t, []gate{
		{line: 1, before: func() {
			first.Stop()
			t.Cleanup(startWorker().Stop)
		}},
		{line: 5},
	}, "--task-queue", queue, "--timeout", "60s", "--", "sh", "-c", script)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, want, stdout, "one stream: each line once, in order")
	assert.NotContains(t, stderr, "runs anew", "the command ran once")
}

// runGatedStarter runs the starter on a gatedScript: as the starter's
// stdout reaches each gate's line, the test opens the gate by creating
// its file through a second process in the (only) lease. It returns what
// runStarter does.
func runGatedStarter(t *testing.T, gates []gate, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	s := stackOf(t)
	t.Cleanup(func() { assertNothingLeaked(t) })
	out := &watchedBuffer{}
	seen := make([]<-chan struct{}, len(gates))
	for i, g := range gates {
		seen[i] = out.when(fmt.Sprintf("line %d\n", g.line))
	}
	var errOut bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		code = starterapp.Main(t.Context(), waitingForRelease(args), starterapp.IO{Stdin: strings.NewReader(""), Stdout: out, Stderr: &errOut},
			client.Options{HostPort: s.Temporal.FrontendHostPort(), Namespace: s.Temporal.Namespace()}, nil)
	}()
	t.Cleanup(func() { <-done }) // t.Context() has ended, so the starter returns
	for i, g := range gates {
		select {
		case <-seen[i]:
			if g.before != nil {
				g.before()
			}
			openGate(t, s, fmt.Sprintf("gate-%d", g.line))
		case <-done:
			t.Fatalf("the starter ended before printing line %d: %s", g.line, errOut.String())
		}
	}
	<-done
	return code, out.String(), errOut.String()
}

// openGate creates the file name in the workspace of the stack's only
// lease.
func openGate(t *testing.T, s *stack.Stack, name string) {
	t.Helper()
	direct, err := s.Provider(createos.Config{})
	require.NoError(t, err)
	leases, err := direct.ListLeases(t.Context(), nil)
	require.NoError(t, err)
	require.Len(t, leases, 1)
	res, err := direct.Execute(t.Context(), leases[0], sandbox.Command{Argv: []string{"touch", name}}, nil)
	require.NoError(t, err)
	require.True(t, res.Succeeded(), "%+v", res)
}

// watchedBuffer is a buffer that tells when it holds given text.
type watchedBuffer struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	watchers []watcher
}

type watcher struct {
	want string
	seen chan struct{}
}

// when returns a channel closed once the buffer holds want.
func (w *watchedBuffer) when(want string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(chan struct{})
	w.watchers = append(w.watchers, watcher{want, seen})
	w.check()
	return seen
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	w.check()
	return n, err
}

// check closes the channels of the watchers whose text has come; w.mu is
// held.
func (w *watchedBuffer) check() {
	kept := w.watchers[:0]
	for _, x := range w.watchers {
		if strings.Contains(w.buf.String(), x.want) {
			close(x.seen)
		} else {
			kept = append(kept, x)
		}
	}
	w.watchers = kept
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestStarterJoinsATruncatedResultToTheLiveOutputExactly(t *testing.T) {
	s := stackOf(t)
	t.Cleanup(func() { assertNothingLeaked(t) })
	// A worker whose Results keep only the last 2 KiB of each stream.
	queue := "e2e-live-truncated"
	provider, err := s.Provider(createos.Config{CaptureBytes: 2 << 10})
	require.NoError(t, err)
	w := worker.New(s.Client, queue, worker.Options{})
	workflows.Register(w, provider)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	// 500 identical lines come live; then, once the starter has printed
	// them, 100 more end the command. The Result's 2 KiB tail begins
	// inside what was printed live, and since every line is the same, only
	// its offset can say where.
	const tick = "tick\n"
	script := "for i in $(seq 500); do echo tick; done; while [ ! -e gate ]; do sleep 0.05; done; for i in $(seq 100); do echo tick; done"
	out := &watchedBuffer{}
	printedLive := out.when(strings.Repeat(tick, 500))
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- starterapp.Main(t.Context(), waitingForRelease([]string{"--task-queue", queue, "--", "sh", "-c", script}),
			starterapp.IO{Stdin: strings.NewReader(""), Stdout: out, Stderr: &errOut},
			client.Options{HostPort: s.Temporal.FrontendHostPort(), Namespace: s.Temporal.Namespace()}, nil)
	}()
	select {
	case <-printedLive:
	case code := <-done:
		t.Fatalf("the starter ended (%d) before printing 500 lines: %s", code, errOut.String())
	}
	openGate(t, s, "gate")
	require.Equal(t, 0, <-done, errOut.String())
	assert.Equal(t, strings.Repeat(tick, 600), out.String(), "each line once")
	assert.Empty(t, errOut.String(), "nothing skipped")
}
