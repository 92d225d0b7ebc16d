package reliability

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// A session runs 100 commands; the response of the 50th command's process
// create is lost. That command fails with a cleanup error on the first
// lease, the session replaces the lease and runs it again on the fresh one,
// and says its workspace was reset. Every command completes, each ran
// exactly once, exactly one lease was replaced, the session continued as
// new along the way carrying its lease, and no lease is left after close.
func TestSessionOf100CommandsReplacesOneLeaseAfterACleanupError(t *testing.T) {
	const commands, lost, perRun = 100, 50, 30
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "lost", Method: http.MethodPost, Path: processesPath, After: lost - 1, Times: 1, Fault: faultproxy.DropResponse()})

	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, e.stack.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{CommandsPerRun: perRun, ActivityOptions: fastActivities()})
	require.NoError(t, err)

	// Each command appends to a file in the workspace and prints how many
	// commands this workspace has seen.
	markers := make([]string, commands)
	results := make([]workflows.SessionResult, commands)
	for i := range commands {
		markers[i] = newMarker()
		results[i], err = sess.Execute(ctx, workflows.SessionCommand{Command: command(markers[i], "echo x >> seen; wc -l < seen")})
		require.NoError(t, err, "command %d", i+1)
	}
	summary, err := sess.Close(ctx)
	require.NoError(t, err)

	first, second := results[0].LeaseID, results[commands-1].LeaseID
	require.NotEqual(t, first, second, "the lease was replaced")
	for i, res := range results {
		seq := i + 1
		wantLease, seen := first, seq
		if seq >= lost {
			wantLease, seen = second, seq-lost+1
		}
		assert.Equal(t, seq, res.Seq)
		assert.Equal(t, wantLease, res.LeaseID, "command %d", seq)
		assert.Equal(t, fmt.Sprintf("%s\n%s\n", markers[i], strconv.Itoa(seen)), res.Stdout, "command %d", seq)
		assert.Equal(t, seq == lost, res.WorkspaceReset, "command %d", seq)
		assert.Equal(t, map[bool]int{true: 1}[seq == lost], res.FreshLeases, "command %d", seq)
		records := processes(e.stack.Sandbox, markers[i])
		assert.Equal(t, 1, ran(records, markers[i]), "command %d ran once: %s", seq, describe(records))
	}
	e.requireFired("lost", 1)
	assert.Equal(t, workflows.SessionSummary{Commands: commands, FreshLeases: 1, DestroyedLeases: []string{first, second}}, summary)
	e.assertLeaseGone(first)
	e.assertLeaseGone(second)

	// It continued as new (every perRun commands) and then completed.
	desc, err := e.stack.Client.DescribeWorkflowExecution(ctx, sess.ID(), "")
	require.NoError(t, err)
	assert.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	assert.NotEqual(t, sess.FirstRunID(), desc.GetWorkflowExecutionInfo().GetExecution().GetRunId(), "the session continued as new")
	assert.Equal(t, 1+(commands-1)/perRun, countRuns(t, e, sess.ID()), "runs of the session")
}

// countRuns counts the runs of a workflow id, as visibility lists them.
func countRuns(t *testing.T, e *env, workflowID string) int {
	t.Helper()
	query := fmt.Sprintf("WorkflowId = %q", workflowID)
	var n int
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := e.stack.Client.ListWorkflow(t.Context(), &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		require.NoError(c, err)
		n = len(resp.GetExecutions())
		closed := 0
		for _, ex := range resp.GetExecutions() {
			if ex.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
				closed++
			}
		}
		assert.Equal(c, n, closed, "visibility has caught up")
	}, waitShort, poll)
	return n
}

// Cancelling a session while a command runs kills the command and
// destroys the lease.
func TestCancelledSessionReleasesItsLease(t *testing.T) {
	e := start(t, options{})
	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, e.stack.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{ActivityOptions: fastActivities()})
	require.NoError(t, err)
	first, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"true"}}})
	require.NoError(t, err)

	marker := newMarker()
	failed := make(chan error, 1)
	go func() {
		_, err := sess.Execute(ctx, workflows.SessionCommand{Command: command(marker, heldScript)})
		failed <- err
	}()
	e.waitRunning(e.stack.Sandbox, marker)
	require.NoError(t, e.stack.Client.CancelWorkflow(ctx, sess.ID(), ""))
	require.Error(t, <-failed, "the running command's Update fails")
	err = e.stack.Client.GetWorkflow(ctx, sess.ID(), "").Get(ctx, nil)
	var canceled *temporal.CanceledError
	require.ErrorAs(t, err, &canceled, "the session ends canceled once it has cleaned up")
	e.assertLeaseGone(first.LeaseID)
	records := processes(e.stack.Sandbox, marker)
	require.Len(t, records, 1)
	assert.NoError(t, killed(records[0]))
}

// The Temporal server restarts, on its database, while a session's
// command runs: the command's Update still gets its result, the session
// keeps its lease and workspace, and close releases everything. The
// command runs once: its Execute attempt loses the server and leaves the
// command running, and the retry re-attaches to the process that the
// server recorded before the command started. The process create waits
// until Execute has recorded a heartbeat, so that the SDK holds back the
// next ones (for its throttle interval) when the server goes away.
func TestSessionSurvivesATemporalRestart(t *testing.T) {
	e := start(t, options{persistent: true})
	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, e.stack.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{ActivityOptions: fastActivities()})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			e.logHistory(sess.ID())
		}
	})
	first, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", "echo kept > f"}}})
	require.NoError(t, err)

	// The process create waits for a heartbeat of its Execute attempt: the
	// SDK then holds back the next ones.
	e.proxy.AddRule(faultproxy.Rule{Name: "create", Method: http.MethodPost, Path: processesPath, Times: 1, Fault: faultproxy.Hold(func() {
		e.waitHeartbeat(sess.ID())
	})})
	marker := newMarker()
	held := make(chan workflows.SessionResult, 1)
	heldErr := make(chan error, 1)
	go func() {
		res, err := sess.Execute(ctx, workflows.SessionCommand{Command: command(marker, heldScript)})
		held <- res
		heldErr <- err
	}()
	running := e.waitRunning(e.stack.Sandbox, marker)
	require.NoError(t, e.stack.RestartTemporal(ctx))
	e.release(running.LeaseID)
	require.NoError(t, <-heldErr, "the Update's result arrives across the restart")
	e.requireFired("create", 1)
	assert.Equal(t, marker+"\nreleased\n", (<-held).Stdout)

	after, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"cat", "f"}}})
	require.NoError(t, err)
	assert.Equal(t, "kept\n", after.Stdout)
	assert.Equal(t, first.LeaseID, after.LeaseID)
	assert.False(t, after.WorkspaceReset)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))

	summary, err := sess.Close(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{first.LeaseID}, summary.DestroyedLeases)
}
