package reliability

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// inputPath is a process's stdin, where the start gate's line is written.
const inputPath = "/sandboxes/*/processes/*/input"

// The start gate's write reaches the process, and the command passes its
// gate and runs, but the worker is answered 500. An ambiguous gate write
// is repeated, not a reason to kill: the process is followed to its end
// and the command runs once.
func TestGateWriteDeliveredThenFailed(t *testing.T) {
	e := start(t, options{})
	marker := newMarker()
	// Hold the 500 until the command has printed its marker: it really
	// passed the gate that the "failed" upload wrote.
	passedGate := func() {
		deadline := time.Now().Add(waitShort)
		for ran(processes(e.stack.Sandbox, marker), marker) == 0 && time.Now().Before(deadline) {
			time.Sleep(poll)
		}
	}
	e.proxy.AddRule(faultproxy.Rule{Name: "500", Method: http.MethodPost, Path: inputPath, Times: 1,
		Fault: faultproxy.FailAfterForward(http.StatusInternalServerError, passedGate)})

	run := e.startRun(request(command(marker, "echo done")))
	res, err := e.result(run)
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)
	assert.Zero(t, res.FreshLeases)

	e.requireFired("500", 1)
	assert.Equal(t, http.StatusOK, e.proxy.Log()[0].Status, "the server delivered the gate's line")
	assert.Equal(t, []int32{1}, e.readHistory(run).executeAttempts, "one attempt")
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1, "one process ever")
}

// A command starts only once the Temporal server has recorded its process
// in Execute's heartbeat details: whatever happens to the worker or to the
// server from then on, the retry finds the process and re-attaches to it
// instead of starting the command again. The server has it even when the
// SDK is holding back heartbeats, as it does for its throttle interval
// after each one: the process create is held until a heartbeat has been
// recorded, and the start gate's write until the server's details have
// been read.
func TestProcessRecordedBeforeItsCommandStarts(t *testing.T) {
	e := start(t, options{})
	marker := newMarker()
	workflowID := make(chan string, 1) // the run's, once it started
	e.proxy.AddRule(faultproxy.Rule{Name: "create", Method: http.MethodPost, Path: processesPath, Times: 1, Fault: faultproxy.Hold(func() {
		id := <-workflowID
		workflowID <- id
		e.waitHeartbeat(id)
	})})
	atGate := make(chan activities.ExecuteProgress, 1)
	e.proxy.AddRule(faultproxy.Rule{Name: "gate", Method: http.MethodPost, Path: inputPath, Times: 1, Fault: faultproxy.Hold(func() {
		id := <-workflowID
		workflowID <- id
		recorded, _ := e.pendingExecute(id)
		atGate <- recorded
	})})

	run := e.startRun(request(command(marker, "echo done")))
	workflowID <- run.GetID()
	res, err := e.result(run)
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)

	e.requireFired("create", 1)
	e.requireFired("gate", 1)
	recorded := <-atGate
	records := processes(e.stack.Sandbox, marker)
	require.Len(t, records, 1, describe(records))
	assert.Equal(t, records[0].ProcessID, recorded.Process.ID, "the process the server had when the gate opened")
	assert.False(t, recorded.Ended)
	assert.Equal(t, 1, ran(records, marker))
}

// Inside one connection the last data frame comes with the seq of the
// frame before it. It is not a duplicate: skipping it would lose the last
// line and report a clean exit. The stream is re-read from the cursor.
func TestSequenceGoesBackwards(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "rewind", Method: http.MethodGet, Path: connectPath, Times: 1, Fault: faultproxy.RewindSequence(2)})
	e.proxy.AddRule(faultproxy.Rule{Name: "reconnect", Method: http.MethodGet, Path: connectPath, Fault: faultproxy.Pass()})
	marker := newMarker()

	run := e.startRun(request(command(marker, "sleep 0.3; echo last")))
	res, err := e.result(run)
	require.NoError(t, err)
	assert.Equal(t, marker+"\nlast\n", res.Stdout, "the last line is not lost")
	assert.False(t, res.Truncated)
	assert.Zero(t, res.ExitCode)

	e.requireFired("rewind", 1)
	e.requireFired("reconnect", 1)
	assert.Equal(t, []int32{1}, e.readHistory(run).executeAttempts, "the reconnect did it")
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1)
}

// An UpdateSession activity retried after its worker died sends its
// Update again, under the same Update id. When the session has continued
// as new in between, the server's deduplication (within one run) does not
// see the repeat: the session answers it from the answers it carried, and
// the command runs once.
func TestSessionUpdateRepeatedAfterContinueAsNew(t *testing.T) {
	e := start(t, options{})
	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, e.stack.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{CommandsPerRun: 1, ActivityOptions: fastActivities()})
	require.NoError(t, err)
	marker := newMarker()
	cmd := workflows.SessionCommand{Command: command(marker, "echo done")}
	execute := func() workflows.SessionResult {
		t.Helper()
		handle, err := e.stack.Client.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
			WorkflowID: sess.ID(), UpdateID: "caller-run/activity-5", UpdateName: workflows.UpdateExecute,
			Args: []any{cmd}, WaitForStage: client.WorkflowUpdateStageCompleted,
		})
		require.NoError(t, err)
		var res workflows.SessionResult
		require.NoError(t, handle.Get(ctx, &res))
		return res
	}

	first := execute()
	require.Eventually(t, func() bool { // the session continues as new after its one command
		desc, err := e.stack.Client.DescribeWorkflowExecution(ctx, sess.ID(), "")
		return err == nil && desc.GetWorkflowExecutionInfo().GetExecution().GetRunId() != sess.FirstRunID()
	}, waitShort, poll)
	again := execute()
	summary, err := sess.Close(ctx)
	require.NoError(t, err)

	assert.Equal(t, first, again, "the recorded answer")
	assert.Equal(t, marker+"\ndone\n", again.Stdout)
	assert.Equal(t, 1, summary.Commands)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1)
}
