package e2e

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// needForks skips a test that forks leases unless the sandbox server runs
// as root (forking copies a lease's namespaced root), except under CI,
// where that fails it.
func needForks(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "forking leases needs a sandbox server running as root")
}

// run runs a shell script in a session and returns its result, which must
// be a success.
func run(t *testing.T, sess *sandboxclient.SessionClient, script string) workflows.SessionResult {
	t.Helper()
	res, err := sess.Execute(t.Context(), workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", script}}})
	require.NoError(t, err, script)
	require.Equal(t, 0, res.ExitCode, "%s: %s", script, res.Stderr)
	return res
}

// The fork scenario, through sessions on the real stack: write a
// file, fork, change it in the fork, read both; closing both leaves
// nothing behind. The sessions' histories replay on the current code, and
// the Web UI's summaries name the fork.
func TestSessionForkCopiesTheWorkspaceAndBothSessionsClose(t *testing.T) {
	needForks(t)
	t.Cleanup(func() { assertNothingLeaked(t) })
	s := stackOf(t)
	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, s.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue}, workflows.SessionRequest{})
	require.NoError(t, err)
	first := run(t, sess, "echo original > f; echo machine > /etc/forked")

	forked, err := sess.Fork(ctx)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(forked.ID(), sess.ID()+"/fork-"), forked.ID())

	changed := run(t, forked, "cat f /etc/forked; echo changed > f")
	assert.Equal(t, "original\nmachine\n", changed.Stdout, "the fork starts with the session's files, the root's included")
	assert.NotEqual(t, first.LeaseID, changed.LeaseID, "on a lease of its own")
	assert.Equal(t, 1, changed.Seq)
	assert.False(t, changed.WorkspaceReset)
	source := run(t, sess, "cat f")
	assert.Equal(t, "original\n", source.Stdout, "the fork's change is not the session's")
	assert.Equal(t, first.LeaseID, source.LeaseID, "the session's lease, resumed after the fork")
	assert.False(t, source.WorkspaceReset)
	assert.Equal(t, "changed\n", run(t, forked, "cat f").Stdout)
	run(t, sess, "echo later > f")
	assert.Equal(t, "changed\n", run(t, forked, "cat f").Stdout, "nor the session's later change the fork's")

	forkSummary, err := forked.Close(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{changed.LeaseID}, forkSummary.DestroyedLeases)
	summary, err := sess.Close(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{first.LeaseID}, summary.DestroyedLeases)

	parent := replayed(t, s.Client, sess.ID())
	replayed(t, s.Client, forked.ID())
	assert.Contains(t, activitySummaries(t, parent), "create lease (egress: default)")
	assert.Contains(t, activitySummaries(t, parent), fmt.Sprintf("fork lease %s into session %s", first.LeaseID, forked.ID()))
}

// replayed returns the history of a session's latest run, once it has
// replayed on the current workflow code.
func replayed(t *testing.T, c client.Client, workflowID string) *historypb.History {
	t.Helper()
	h := &historypb.History{}
	iter := c.GetWorkflowHistory(t.Context(), workflowID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		event, err := iter.Next()
		require.NoError(t, err)
		h.Events = append(h.Events, event)
	}
	replayer := worker.NewWorkflowReplayer()
	replayer.RegisterWorkflowWithOptions(workflows.SessionWorkflow, workflow.RegisterOptions{Name: workflows.SessionWorkflowName})
	require.NoError(t, replayer.ReplayWorkflowHistoryWithOptions(sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)), h,
		worker.ReplayWorkflowHistoryOptions{OriginalExecution: workflow.Execution{ID: workflowID}}), "replay %s", workflowID)
	return h
}

// activitySummaries returns the summaries of the activities a history
// scheduled: what the Web UI shows of each.
func activitySummaries(t *testing.T, h *historypb.History) []string {
	t.Helper()
	var out []string
	for _, event := range h.Events {
		if event.GetEventType() != enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED {
			continue
		}
		var summary string
		require.NoError(t, converter.GetDefaultDataConverter().FromPayload(event.GetUserMetadata().GetSummary(), &summary))
		out = append(out, summary)
	}
	return out
}

// forkFromAWorkflow uses fork and set_egress from workflow code, through
// the UpdateSession activity: it writes a file in a session, forks it,
// and reads the file in the fork.
func forkFromAWorkflow(ctx workflow.Context) ([]string, error) {
	sess, err := workflows.OpenSession(ctx, workflows.SessionRequest{})
	if err != nil {
		return nil, err
	}
	if _, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", "echo copied > f"}}}); err != nil {
		return nil, err
	}
	state, err := sess.SetEgress(ctx, []string{"*"})
	if err != nil {
		return nil, err
	}
	forked, err := sess.Fork(ctx)
	if err != nil {
		return nil, err
	}
	read, err := forked.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"cat", "f"}}})
	if err != nil {
		return nil, err
	}
	if _, err := forked.Close(ctx); err != nil {
		return nil, err
	}
	if _, err := sess.Close(ctx); err != nil {
		return nil, err
	}
	return append(state.Egress, read.Stdout), nil
}

func TestAWorkflowForksASessionAndSetsItsEgress(t *testing.T) {
	needForks(t)
	t.Cleanup(func() { assertNothingLeaked(t) })
	queue := sessionWorker(t, func(w worker.Worker) { w.RegisterWorkflow(forkFromAWorkflow) })
	run, err := stackOf(t).Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: queue}, forkFromAWorkflow)
	require.NoError(t, err)
	var got []string
	require.NoError(t, run.Get(t.Context(), &got))
	assert.Equal(t, []string{"*", "copied\n"}, got)
}

// set_egress on the real stack: a rule changed between two commands of a
// session applies to the next command's connection.
func TestSessionSetEgressChangesTheNextConnection(t *testing.T) {
	needLeaseNetworks(t, true)
	s, _ := startOwnStack(t, stack.Options{
		Sandbox: localsandbox.Options{Egress: localsandbox.EgressAny, EgressHostLoopback: true},
	})
	port := hostHTTPServer(t)
	ctx := t.Context()
	allowed := fmt.Sprintf("10.0.2.2:%d", port)
	sess, err := sandboxclient.StartSession(ctx, s.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{Lease: sandbox.LeaseSpec{Egress: []string{allowed}}})
	require.NoError(t, err)
	fetch := workflows.SessionCommand{Command: sandbox.Command{Argv: fetchArgv(port)}}

	res, err := sess.Execute(ctx, fetch)
	require.NoError(t, err)
	assert.Equal(t, "200\n", res.Stdout, res.Stderr)

	state, err := sess.SetEgress(ctx, []string{"10.0.2.2:1"}) // the same host, another port
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.2.2:1"}, state.Egress)
	refused, err := sess.Execute(ctx, fetch)
	require.NoError(t, err)
	assert.Equal(t, 1, refused.ExitCode, "python's exit code for an uncaught URLError")
	assert.Contains(t, refused.Stderr, "urllib.error.URLError")
	assert.Equal(t, res.LeaseID, refused.LeaseID, "the same lease, its rules changed")

	_, err = sess.SetEgress(ctx, []string{"*"})
	require.NoError(t, err)
	again, err := sess.Execute(ctx, fetch)
	require.NoError(t, err)
	assert.Equal(t, "200\n", again.Stdout, again.Stderr)

	_, err = sess.SetEgress(ctx, []string{"two words"})
	assert.True(t, sandbox.IsInvalidInputError(err), "refused before anything is sent: %v", err)
	_, err = sess.Close(ctx)
	require.NoError(t, err)
}
