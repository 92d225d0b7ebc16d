package stack_test

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// freePort returns a port that was free a moment ago: for a stack with
// fixed ports.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestTwoStacksOnDifferentPortsRunSideBySide(t *testing.T) {
	// Both took the one default sandbox root; the second failed with "root
	// ... is in use by another server".
	t.Setenv("TMPDIR", t.TempDir())
	var stacks []*stack.Stack
	for range 2 {
		s, err := stack.Start(t.Context(), stack.Options{
			Temporal:    temporalserver.Options{FrontendPort: freePort(t), UIPort: temporalserver.NoUI, Logger: quiet()},
			SandboxPort: freePort(t),
			Logger:      quiet(),
		})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, s.Stop()) })
		stacks = append(stacks, s)
	}
	a, b := stacks[0], stacks[1]
	assert.NotEqual(t, a.Sandbox.Root(), b.Sandbox.Root())
	base := filepath.Join(os.TempDir(), "sandboxflow-"+strconv.Itoa(os.Geteuid()))
	for _, s := range stacks {
		_, port, _ := net.SplitHostPort(s.Temporal.FrontendHostPort())
		assert.Equal(t, filepath.Join(base, "stack-127.0.0.1-"+port, "sandbox"), s.Sandbox.Root(),
			"the sandbox root is in the stack's directory, named for its address")
	}

	// Both run a command at the same time.
	runs := make([]client.WorkflowRun, len(stacks))
	for i, s := range stacks {
		var err error
		runs[i], err = s.Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
			workflows.WorkflowName, workflows.Request{Command: sandbox.Command{Argv: []string{"sh", "-c", "echo hello"}}})
		require.NoError(t, err)
	}
	for i, run := range runs {
		var res workflows.Result
		require.NoError(t, run.Get(t.Context(), &res), "stack %d", i)
		assert.Equal(t, "hello\n", res.Stdout, "stack %d", i)
	}
}

func TestNoSandboxStartsNoSandboxServer(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	_, err := stack.Start(t.Context(), stack.Options{NoSandbox: true, Logger: quiet()})
	require.ErrorContains(t, err, "a worker or a fault proxy needs a SandboxURL", "checked before anything starts")

	for _, opts := range []stack.Options{
		{NoSandbox: true, NoWorker: true},
		{SandboxURL: "http://127.0.0.1:1", SandboxAPIKey: "k"}, // the worker's, not called until a run
	} {
		opts.Temporal = temporalserver.Options{UIPort: temporalserver.NoUI, Logger: quiet()}
		opts.Logger = quiet()
		s, err := stack.Start(t.Context(), opts)
		require.NoError(t, err)
		assert.Nil(t, s.Sandbox)
		assert.Equal(t, opts.SandboxURL, s.SandboxURL)
		require.NoError(t, s.Stop())
		entries, _ := os.ReadDir(os.TempDir())
		assert.Empty(t, entries, "no stack directory: nothing to keep in it")
	}
}

func TestEgressWithoutTheInProcessSandboxServerIsRefused(t *testing.T) {
	// Silently ignored, the run would have had no network and no word why.
	for name, opts := range map[string]stack.Options{
		"sandbox url": {SandboxURL: "http://127.0.0.1:1", Sandbox: localsandbox.Options{Egress: localsandbox.EgressAny}},
		"no sandbox":  {NoSandbox: true, NoWorker: true, Sandbox: localsandbox.Options{EgressHostLoopback: true}},
	} {
		t.Run(name, func(t *testing.T) {
			opts.Temporal = temporalserver.Options{UIPort: temporalserver.NoUI, Logger: quiet()}
			_, err := stack.Start(t.Context(), opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "configures the in-process sandbox server, and with SandboxURL or NoSandbox there is none")
		})
	}
}
