package reliability

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// The worker dies by SIGKILL mid-command. Once Execute's heartbeat times
// out, its retry on another worker re-attaches to the running process:
// the command runs once and its output arrives whole. The process create
// waits until Execute has recorded a heartbeat, so that the SDK holds back
// the next ones (for its throttle interval) when the worker dies: the
// server has the process all the same, since the command started only
// once the server had it.
func TestWorkerKilled(t *testing.T) {
	e := start(t, options{noWorker: true})
	e.proxy.AddRule(faultproxy.Rule{Name: "connect", Method: http.MethodGet, Path: connectPath, Fault: faultproxy.Pass()})
	first := e.startWorker()
	marker := newMarker()
	req := request(command(marker, heldScript))
	// Short, so that the dead worker's attempt times out soon, but well
	// above the SDK's heartbeat throttle: the server hears from a living
	// attempt only every min(0.8 × timeout, the worker's 2 s
	// MaxHeartbeatThrottleInterval). 2 s left a 0.4 s margin, which a
	// loaded machine missed.
	const heartbeatTimeout = 5 * time.Second
	req.ActivityOptions.Execute.HeartbeatTimeout = heartbeatTimeout

	workflowID := make(chan string, 1)
	e.proxy.AddRule(faultproxy.Rule{Name: "create", Method: http.MethodPost, Path: processesPath, Times: 1, Fault: faultproxy.Hold(func() {
		e.waitHeartbeat(<-workflowID)
	})})
	run := e.startRun(req)
	workflowID <- run.GetID()
	t.Cleanup(func() {
		if t.Failed() {
			e.logHistory(run.GetID())
		}
	})
	running := e.waitRunning(e.stack.Sandbox, marker)
	first.kill(t)
	e.startWorker()

	// The retry attaches to the process (a second connect), and its
	// heartbeats keep it alive past the heartbeat timeout.
	require.Eventually(t, func() bool { return e.proxy.Fired("connect") >= 2 }, waitLong, poll, "no re-attach")
	require.Eventually(t, func() bool {
		desc, err := e.stack.Client.DescribeWorkflowExecution(t.Context(), run.GetID(), run.GetRunID())
		if err != nil {
			return false
		}
		for _, a := range desc.GetPendingActivities() {
			if a.GetActivityType().GetName() == activities.NameExecute && a.GetAttempt() == 2 &&
				a.GetLastHeartbeatTime().AsTime().Sub(a.GetLastStartedTime().AsTime()) > heartbeatTimeout {
				return true
			}
		}
		return false
	}, waitLong, poll, "the second attempt does not outlive its heartbeat timeout")
	e.release(running.LeaseID)

	res, err := e.result(run)
	require.NoError(t, err)
	e.requireFired("create", 1)
	assert.Equal(t, marker+"\nreleased\n", res.Stdout, "the whole output, from the start")
	assert.Zero(t, res.FreshLeases)
	assert.Equal(t, []int32{2}, e.readHistory(run).executeAttempts)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1, "never started again")
}

// The Temporal server restarts, on its database, while the command runs:
// the worker reconnects and the run completes, the command run once.
func TestTemporalRestart(t *testing.T) {
	e := start(t, options{persistent: true})
	marker := newMarker()

	run := e.startRun(request(command(marker, heldScript)))
	running := e.waitRunning(e.stack.Sandbox, marker)
	before := e.stack.Temporal
	require.NoError(t, e.stack.RestartTemporal(t.Context()))
	require.NotSame(t, before, e.stack.Temporal)
	records := processes(e.stack.Sandbox, marker)
	require.Len(t, records, 1)
	require.True(t, records[0].End.IsZero(), "the command ran through the restart")
	e.release(running.LeaseID)

	res, err := e.result(run)
	require.NoError(t, err)
	assert.Equal(t, marker+"\nreleased\n", res.Stdout)
	assert.Zero(t, res.FreshLeases)
	records = processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1)
}

// The sandbox server restarts while the command runs: it kills everything
// and forgets every lease. The run either compensates — the lease is
// gone, a fresh one runs the command again — or fails with a typed error;
// nothing leaks either way.
func TestSandboxServerRestart(t *testing.T) {
	e := start(t, options{})
	marker := newMarker()

	run := e.startRun(request(command(marker, heldScript)))
	old := e.stack.Sandbox
	e.waitRunning(old, marker)
	require.NoError(t, e.stack.RestartSandbox(t.Context()))
	require.NotSame(t, old, e.stack.Sandbox)
	before := processes(old, marker)
	require.Len(t, before, 1)
	require.NoError(t, killed(before[0]), "the restart killed the command")

	// Wait until the command runs again on the new server, or the run ends.
	var again []string
	require.Eventually(t, func() bool {
		for _, r := range processes(e.stack.Sandbox, marker) {
			if ran([]localsandbox.ProcessRecord{r}, marker) == 1 {
				again = append(again, r.LeaseID)
				return true
			}
		}
		desc, err := e.stack.Client.DescribeWorkflowExecution(t.Context(), run.GetID(), run.GetRunID())
		return err == nil && desc.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	}, waitLong, poll)
	for _, lease := range again {
		e.release(lease)
	}

	res, err := e.result(run)
	after := processes(e.stack.Sandbox, marker)
	if err == nil {
		t.Logf("outcome: compensation (%d fresh leases)", res.FreshLeases)
		assert.Positive(t, res.FreshLeases, "a lease that vanished is replaced")
		assert.Equal(t, marker+"\nreleased\n", res.Stdout)
		assert.Equal(t, 1, ran(after, marker), "once more, on the fresh lease"+describe(after))
		return
	}
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	t.Logf("outcome: typed failure %s: %v", appErr.Type(), err)
	assert.Contains(t, []string{workflows.TypeCompensationExhausted, sandbox.TypeConnectionExhausted, sandbox.TypeUnavailable}, appErr.Type())
	assert.Zero(t, ran(after, marker), describe(after))
}
