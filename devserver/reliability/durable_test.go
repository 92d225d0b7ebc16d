package reliability

// The rows of issue 28 items 1 and 3: worker deaths and detaches do not
// spend Execute's budget of failures, and a command whose output could not
// be read is read again, never run again.

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// shortHeartbeats is a request whose Execute notices a dead worker within
// 2 s, so that a row of many worker deaths stays short.
func shortHeartbeats(cmd sandbox.Command) workflows.Request {
	req := request(cmd)
	execute := *req.ActivityOptions.Execute
	execute.HeartbeatTimeout = 2 * time.Second
	req.ActivityOptions.Execute = &execute
	return req
}

// waitFollowing waits until attempt n (or a later one) of the workflow's
// Execute has started and recorded a heartbeat since: a worker follows the
// command. It returns the attempt.
func (e *env) waitFollowing(workflowID string, n int32) int32 {
	e.t.Helper()
	var attempt int32
	require.Eventually(e.t, func() bool {
		desc, err := e.stack.Client.DescribeWorkflowExecution(e.t.Context(), workflowID, "")
		if err != nil {
			return false
		}
		for _, a := range desc.GetPendingActivities() {
			if a.GetActivityType().GetName() != activities.NameExecute || a.GetState() != enumspb.PENDING_ACTIVITY_STATE_STARTED {
				continue
			}
			started, beat := a.GetLastStartedTime(), a.GetLastHeartbeatTime()
			if a.GetAttempt() >= n && started != nil && beat != nil && beat.AsTime().After(started.AsTime()) {
				attempt = a.GetAttempt()
				return true
			}
		}
		return false
	}, waitShort, poll, "attempt %d of Execute never followed the command", n)
	return attempt
}

// The worker is SIGKILLed six times while one command runs, each time
// after a new worker took the command over. Every death costs a heartbeat
// timeout and an attempt, none of them the budget of failures (4): the
// seventh attempt re-attaches, the command completes once, Starts 1,
// nothing leaked. On be7ee59 the fourth death failed the run with
// Temporal's untyped heartbeat timeout and left the command running.
func TestWorkerKilledSixTimesDuringOneCommand(t *testing.T) {
	e := start(t, options{noWorker: true})
	w := e.startWorker()
	marker := newMarker()

	run := e.startRun(shortHeartbeats(command(marker, heldScript)))
	rec := e.waitRunning(e.stack.Sandbox, marker)
	for kill := int32(1); kill <= 6; kill++ {
		e.waitFollowing(run.GetID(), kill)
		w.kill(t)
		w = e.startWorker()
	}
	e.waitFollowing(run.GetID(), 7)
	e.release(rec.LeaseID)
	res, err := e.result(run)

	require.NoError(t, err)
	assert.Equal(t, marker+"\nreleased\n", res.Stdout)
	assert.Equal(t, 1, res.Starts)
	assert.Equal(t, []int32{7}, e.readHistory(run).executeAttempts)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1, "one process ever: "+describe(records))
}

// The Temporal frontend answers the worker 3 s late each way for 30 s
// while a command runs: every attempt of Execute in that time misses its
// 2 s heartbeat timeout, and each retry detaches or times out in turn,
// none of it spending the budget of failures. Once Temporal is fast
// again an attempt re-attaches: the command completes once. On be7ee59
// the fourth timeout failed the run.
func TestTemporalSlowFor30SecondsMidCommand(t *testing.T) {
	e := start(t, options{noWorker: true})
	relay := newDelayRelay(t, e.stack.Temporal.FrontendHostPort())
	e.startWorkerVia(relay.addr())
	marker := newMarker()

	run := e.startRun(shortHeartbeats(command(marker, heldScript)))
	rec := e.waitRunning(e.stack.Sandbox, marker)
	e.waitFollowing(run.GetID(), 1)
	relay.setDelay(3 * time.Second)
	time.Sleep(30 * time.Second) // the fault's length: Temporal is slow this long
	relay.setDelay(0)
	attempt := e.waitFollowing(run.GetID(), 2)
	e.release(rec.LeaseID)
	res, err := e.result(run)

	require.NoError(t, err)
	assert.Equal(t, marker+"\nreleased\n", res.Stdout)
	assert.Equal(t, 1, res.Starts)
	assert.Greater(t, attempt, int32(4), "the fault cost more attempts than the budget of failures")
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1, "one process ever: "+describe(records))
}

// connectsPerAttempt is how many connects one Execute attempt makes before
// its output connection is exhausted: the first, createos's three
// reconnects, and the replay after the server said the process exited.
const connectsPerAttempt = 1 + 3 + 1

// Every connect of the first attempt is cut after 40 bytes, before a
// whole frame: the command exits, and its output cannot be read. The
// attempt leaves the exited process; the retry re-attaches and reads its
// output and exit status. One run, the exact output. On be7ee59 the
// attempt killed the exited process and the retry ran the command again.
func TestStreamCutOnEveryConnectAfterTheCommandExited(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "cut", Method: http.MethodGet, Path: connectPath, Times: connectsPerAttempt, Fault: faultproxy.CutStream(0, 40)})
	marker := newMarker()
	script, output := numbered(20)

	run := e.startRun(request(command(marker, script)))
	res, err := e.result(run)

	require.NoError(t, err)
	assert.Equal(t, marker+"\n"+output, res.Stdout, "exact output")
	assert.False(t, res.Truncated)
	assert.Equal(t, 1, res.Starts)
	e.requireFired("cut", connectsPerAttempt)
	h := e.readHistory(run)
	assert.Equal(t, []int32{2}, h.executeAttempts)
	assert.Equal(t, []string{sandbox.TypeConnectionExhausted}, h.retriedAfter)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1, describe(records))
}

// Every connect is cut, for good: the output can never be read. Each
// attempt re-attaches to the one process, and the fourth failure spends
// the budget: the run fails typed, OutputConnectionError, non-retryable,
// the command ran once. On be7ee59 it ran four times, each to exit 0.
func TestStreamCutOnEveryConnectForGood(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "cut", Method: http.MethodGet, Path: connectPath, Fault: faultproxy.CutStream(0, 40)})
	marker := newMarker()

	run := e.startRun(request(command(marker, "echo done")))
	_, err := e.result(run)

	appErr := requireApplicationError(t, err, sandbox.TypeConnectionExhausted)
	assert.True(t, appErr.NonRetryable())
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	assert.Equal(t, 1, d.Starts)
	e.requireFired("cut", 4*connectsPerAttempt)
	assert.Equal(t, []int32{4}, e.readHistory(run).executeAttempts)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1, describe(records))
}

// Temporal is slow (4 s each way, past the 2 s heartbeat timeout) until
// Execute's horizon — here a ScheduleToCloseTimeout of 10 s — runs out:
// no attempt can follow the command. The run fails typed,
// SandboxUnattended, not with Temporal's untyped timeout, and destroys
// the lease with the command, though the request keeps its lease: no
// command is left running without an owner. On be7ee59 the run failed
// with the untyped timeout and the lease stayed, the command running.
func TestUnattendedCommandIsKilledWithItsLease(t *testing.T) {
	e := start(t, options{noWorker: true})
	relay := newDelayRelay(t, e.stack.Temporal.FrontendHostPort())
	e.startWorkerVia(relay.addr())
	marker := newMarker()
	req := shortHeartbeats(command(marker, heldScript))
	req.ActivityOptions.Execute.ScheduleToCloseTimeout = 10 * time.Second
	req.KeepLease = true

	run := e.startRun(req)
	rec := e.waitRunning(e.stack.Sandbox, marker)
	e.waitFollowing(run.GetID(), 1)
	relay.setDelay(4 * time.Second)
	// Watched in the history, not with DescribeWorkflowExecution: the
	// Temporal server (1.32) races encoding a described pending activity's
	// heartbeat details against writing them into its timeout event.
	require.Eventually(t, func() bool {
		it := e.stack.Client.GetWorkflowHistory(t.Context(), run.GetID(), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			event, err := it.Next()
			if err != nil {
				return false
			}
			if event.GetEventType() == enumspb.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT {
				return true
			}
		}
		return false
	}, waitShort, poll, "Execute's horizon never ran out")
	relay.setDelay(0)
	_, err := e.result(run)

	appErr := requireApplicationError(t, err, sandbox.TypeUnattended)
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	assert.Equal(t, rec.LeaseID, d.LeaseID)
	e.assertLeaseGone(rec.LeaseID)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	require.Len(t, records, 1)
	assert.NoError(t, killed(records[0]), "the command was killed, not left to run")
}
