package reliability

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// The kill of a timed-out command is answered 503, on each of its three
// attempts (a DELETE is retried): its end cannot be confirmed, so the lease
// is replaced and the command runs again on a fresh one — twice in all,
// the documented price of an unconfirmed kill.
func TestProcessKillUnconfirmed(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "kill", Method: http.MethodDelete, Path: processPath, Times: 3, Fault: faultproxy.Status(http.StatusServiceUnavailable)})
	marker := newMarker()
	cmd := command(marker, "exec sleep 600")
	cmd.Timeout = time.Second

	run := e.startRun(request(cmd))
	res, err := e.result(run)
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
	assert.Equal(t, marker+"\n", res.Stdout)
	assert.Equal(t, 1, res.FreshLeases)
	require.Len(t, res.DestroyedLeases, 2)
	suspect := res.DestroyedLeases[0]
	e.assertLeaseGone(suspect)

	e.requireFired("kill", 3)
	records := processes(e.stack.Sandbox, marker)
	require.Len(t, records, 2, describe(records))
	assert.Equal(t, 2, ran(records, marker), "once per lease"+describe(records))
	h := e.readHistory(run)
	assert.Equal(t, []sandbox.CleanupReason{sandbox.TerminationUnconfirmed}, reasons(h.cleanups))
	assert.Equal(t, suspect, h.cleanups[0].LeaseID)
	assert.Equal(t, records[0].ProcessID, h.cleanups[0].ProcessID)
	for _, r := range records {
		assert.NoError(t, killed(r))
	}
	assert.Equal(t, suspect, records[0].LeaseID)
	assert.Equal(t, res.LeaseID, records[1].LeaseID)
}

// Cancelling a run kills the command's process tree and destroys the
// lease; the workflow ends canceled.
func TestCancelMidRun(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "kill", Method: http.MethodDelete, Path: processPath, Fault: faultproxy.Pass()})
	marker := newMarker()

	run := e.startRun(request(command(marker, heldScript)))
	running := e.waitRunning(e.stack.Sandbox, marker)
	require.NoError(t, e.stack.Client.CancelWorkflow(t.Context(), run.GetID(), run.GetRunID()))
	_, err := e.result(run)
	var canceled *temporal.CanceledError
	require.ErrorAs(t, err, &canceled)
	assert.True(t, e.readHistory(run).canceled)

	e.requireFired("kill", 1)
	assert.Equal(t, http.StatusOK, e.proxy.Log()[0].Status, "the activity killed the tree itself")
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	require.Len(t, records, 1)
	assert.NoError(t, killed(records[0]))
	e.assertLeaseGone(running.LeaseID)
}

// A storm of 429s: most requests of every kind are refused until the storm
// has answered 10 of them. Each failure is retried by the client or by the
// activity retry policy (or, where a 429 hides a cleanup, compensated) and
// the run completes, the command run once.
func TestRateLimitStorm(t *testing.T) {
	// The worker paces its requests, as it would for the hosted service.
	e := start(t, options{client: createos.Config{PaceInterval: 20 * time.Millisecond}})
	const storm = 10
	e.proxy.AddRule(faultproxy.Rule{Name: "storm", Probability: 0.7, Times: storm, Fault: faultproxy.Status(http.StatusTooManyRequests)})
	e.proxy.AddRule(faultproxy.Rule{Name: "calm", Fault: faultproxy.Pass()})
	marker := newMarker()
	req := request(command(marker, "echo done"))
	// The storm is bounded, so retrying without limit must end; a cleanup
	// error takes two 429s at least, so the storm cannot use up the fresh
	// leases.
	for _, o := range []**temporal.RetryPolicy{&req.ActivityOptions.CreateLease.RetryPolicy, &req.ActivityOptions.Execute.RetryPolicy} {
		*o = fastRetry(0)
	}
	req.MaxFreshLeases = storm/2 + 1

	res, err := e.run(req)
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)

	e.requireFired("storm", storm) // the storm ran its course
	t.Logf("%d requests passed; %d compensations", e.proxy.Fired("calm"), res.FreshLeases)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
}
