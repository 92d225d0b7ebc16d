// Package e2e runs sandboxflow end to end: the real starter code against a
// real in-process Temporal server, the real local sandbox server over
// loopback and a real worker. Every test checks that nothing leaked.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/localsandbox/localsandboxtest"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

var dev *stack.Stack

func TestMain(m *testing.M) {
	s, err := stack.Start(context.Background(), stack.Options{
		Temporal: temporalserver.Options{UIPort: temporalserver.NoUI},
		Sandbox:  localsandbox.Options{Root: mustTempDir()},
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the dev stack:", err)
		os.Exit(1)
	}
	dev = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the dev stack:", err)
	}
	os.Exit(code)
}

func mustTempDir() string {
	dir, err := os.MkdirTemp("", "sandboxflow-e2e-")
	if err != nil {
		panic(err)
	}
	return dir
}

// stackOf is TestMain's stack.
func stackOf(t *testing.T) *stack.Stack {
	t.Helper()
	require.NotNil(t, dev, "TestMain starts the stack")
	return dev
}

// runStarter runs the starter exactly as the binary would, and returns its
// exit code and output.
func runStarter(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = starterapp.Main(t.Context(), waitingForRelease(args), starterapp.IO{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut},
		client.Options{HostPort: stackOf(t).Temporal.FrontendHostPort(), Namespace: stackOf(t).Temporal.Namespace()}, nil)
	t.Cleanup(func() { assertNothingLeaked(t) })
	return code, out.String(), errOut.String()
}

// waitingForRelease makes the starter wait for the run's release before it
// exits (--wait-release), as `devserver run` does: these tests check that
// nothing leaked as soon as it returns, and that its stderr holds only the
// command's. Without it a release slower than the starter's grace period
// (a loaded CI machine) adds a "goes on releasing" line and a live lease.
// devserver/reliability/result_test.go tests the starter without it.
func waitingForRelease(args []string) []string {
	return append([]string{"--wait-release"}, args...)
}

// assertNothingLeaked checks the sandbox side: no lease left, no process
// of any sandbox alive on this machine.
func assertNothingLeaked(t *testing.T) {
	t.Helper()
	assert.NoError(t, localsandboxtest.CheckNothingLeaked(stackOf(t).Sandbox))
}

func TestOutputAndExitCode(t *testing.T) {
	code, stdout, stderr := runStarter(t, "", "--", "sh", "-c", "echo to stdout; echo to stderr >&2; exit 3")
	assert.Equal(t, 3, code)
	assert.Equal(t, "to stdout\n", stdout)
	assert.Equal(t, "to stderr\n", stderr)
}

func TestNonZeroExitIsTheCommandsExitCode(t *testing.T) {
	code, _, _ := runStarter(t, "", "--", "false")
	assert.Equal(t, 1, code)
}

func TestStdinEnvAndCwd(t *testing.T) {
	code, stdout, stderr := runStarter(t, "piped input\n",
		"--stdin", "-", "--env", "GREETING=hello world", "--cwd", "/tmp",
		"--", "sh", "-c", `echo "$GREETING"; pwd; cat`)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "hello world\n/tmp\npiped input\n", stdout)
}

func TestTimeoutKillsTheCommand(t *testing.T) {
	code, stdout, stderr := runStarter(t, "", "--timeout", "1s", "--", "sh", "-c", "echo started; exec sleep 600")
	assert.Equal(t, 124, code)
	assert.Equal(t, "started\n", stdout)
	assert.Contains(t, stderr, "timed out")
}

func TestJSONResult(t *testing.T) {
	code, stdout, _ := runStarter(t, "", "--json", "--workflow-id", "e2e-json", "--", "sh", "-c", "echo out; exit 7")
	assert.Equal(t, 7, code)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &got))
	assert.Equal(t, "e2e-json", got["workflowId"])
	assert.Equal(t, float64(7), got["exitCode"])
	assert.Equal(t, "out\n", got["stdout"])
	assert.Equal(t, false, got["timedOut"])
	assert.NotEmpty(t, got["runId"])
	assert.True(t, strings.HasPrefix(got["leaseId"].(string), "sb"), "leaseId %v", got["leaseId"])
	assert.Equal(t, float64(0), got["freshLeases"])
}

func TestCancelDestroysTheLease(t *testing.T) {
	s := stackOf(t)
	t.Cleanup(func() { assertNothingLeaked(t) })
	ctx := t.Context()
	run, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, workflows.Request{Command: sandbox.Command{Argv: []string{"sleep", "600"}}})
	require.NoError(t, err)

	// Cancel once the command really runs: its process exists on the server.
	require.Eventually(t, func() bool {
		stats, err := s.Sandbox.Stats()
		return err == nil && stats.Processes > 0
	}, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, s.Client.CancelWorkflow(ctx, run.GetID(), run.GetRunID()))

	err = run.Get(ctx, nil)
	var canceled *temporal.CanceledError
	require.ErrorAs(t, err, &canceled)
}

func TestRunIsFoundByItsSearchAttributes(t *testing.T) {
	s := stackOf(t)
	code, stdout, _ := runStarter(t, "", "--json", "--", "true")
	require.Equal(t, 0, code)
	var res struct{ WorkflowID, RunID, LeaseID string }
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))

	query := fmt.Sprintf(`%s = %q AND %s = %q`, workflows.SearchAttributeLeaseID, res.LeaseID, workflows.SearchAttributePhase, workflows.PhaseCompleted)
	require.Eventually(t, func() bool {
		resp, err := s.Client.ListWorkflow(t.Context(), &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		return err == nil && len(resp.GetExecutions()) == 1 && resp.GetExecutions()[0].GetExecution().GetRunId() == res.RunID
	}, 10*time.Second, 50*time.Millisecond, "the run is found by lease and phase")

	desc, err := s.Client.DescribeWorkflowExecution(t.Context(), res.WorkflowID, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
}

func TestFailedRunExitsWithItsTypeAndReleasesEverything(t *testing.T) {
	code, stdout, stderr := runStarter(t, "", "--shape", "s-no-such-shape", "--", "true")
	assert.Equal(t, starterapp.ExitRunFailed, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "failed: SandboxAPIError: ")
	assert.Contains(t, stderr, "HTTP 400")
	assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
}
