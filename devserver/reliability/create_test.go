package reliability

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Paths of the requests the rows break, as FaultProxy rules match them.
const (
	sandboxesPath = "/sandboxes"
	processesPath = "/sandboxes/*/processes"
	processPath   = "/sandboxes/*/processes/*"
	connectPath   = "/sandboxes/*/processes/*/connect"
)

// The sandbox was created but its id never reached the worker: the
// CreateLease retry, with the same idempotency key, gets the same sandbox.
func TestLostSandboxCreateResponse(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "lost", Method: http.MethodPost, Path: sandboxesPath, Times: 1, Fault: faultproxy.DropResponse()})
	marker := newMarker()

	res, err := e.run(request(command(marker, "echo done")))
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)
	assert.Zero(t, res.FreshLeases)
	assert.Equal(t, []string{res.LeaseID}, res.DestroyedLeases)

	e.requireFired("lost", 1)
	lost := e.proxy.Log()[0]
	require.Equal(t, http.StatusOK, lost.Status, "the server created the sandbox")
	var created struct{ Data struct{ ID string } }
	require.NoError(t, json.Unmarshal(lost.Response, &created))
	assert.Equal(t, res.LeaseID, created.Data.ID, "the retry got the sandbox whose id was lost")

	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1)
}

// createRow runs a row in which the first process create goes wrong in a
// way that leaves its outcome unknown: the run must compensate on a fresh
// lease and run the command there, once.
func createRow(t *testing.T, o options, fault faultproxy.Fault, forwarded bool) {
	e := start(t, o)
	e.proxy.AddRule(faultproxy.Rule{Name: "create", Method: http.MethodPost, Path: processesPath, Times: 1, Fault: fault})
	marker := newMarker()

	run := e.startRun(request(command(marker, "echo done")))
	res, err := e.result(run)
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)
	assert.Equal(t, 1, res.FreshLeases, "one compensation")
	require.Len(t, res.DestroyedLeases, 2, "the suspect lease and the one the command ran on")
	suspect := res.DestroyedLeases[0]
	assert.NotEqual(t, suspect, res.LeaseID)
	assert.Equal(t, res.LeaseID, res.DestroyedLeases[1])
	e.assertLeaseGone(suspect)

	e.requireFired("create", 1)
	h := e.readHistory(run)
	assert.Equal(t, []sandbox.CleanupReason{sandbox.CreationUnconfirmed}, reasons(h.cleanups))
	assert.Equal(t, suspect, h.cleanups[0].LeaseID)

	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	if !forwarded {
		assert.Len(t, records, 1, "the broken create never reached the server"+describe(records))
		return
	}
	require.Len(t, records, 2, "the server created the process whose id was lost"+describe(records))
	orphan := records[0]
	assert.Equal(t, suspect, orphan.LeaseID)
	assert.Empty(t, orphan.Stdout, "the orphan never passed its start gate")
	assert.NoError(t, killed(orphan), "the orphan died with its lease")
	assert.Equal(t, res.LeaseID, records[1].LeaseID)
}

// The process was created but its id never reached the worker.
func TestLostProcessCreateResponse(t *testing.T) {
	createRow(t, options{}, faultproxy.DropResponse(), true)
}

// The process create is answered only after the worker gave up waiting.
func TestProcessCreateTimesOut(t *testing.T) {
	createRow(t, options{client: createos.Config{OperationTimeout: 3 * time.Second}}, faultproxy.Stall(time.Minute), true)
}

// The process create is answered 502: it may or may not have happened.
func TestProcessCreate5xx(t *testing.T) {
	createRow(t, options{}, faultproxy.Status(http.StatusBadGateway), false)
}

// Every lease turns out unusable: with one fresh lease allowed, the second
// cleanup error ends the run, and every lease is destroyed.
func TestCompensationExhausted(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "lost", Method: http.MethodPost, Path: processesPath, Times: 2, Fault: faultproxy.DropResponse()})
	marker := newMarker()
	req := request(command(marker, "echo done"))
	req.MaxFreshLeases = 1

	_, err := e.run(req)
	appErr := requireApplicationError(t, err, workflows.TypeCompensationExhausted)
	var details workflows.CompensationDetails
	require.NoError(t, appErr.Details(&details))
	assert.Equal(t, 1, details.FreshLeases)
	require.Len(t, details.DestroyedLeases, 2)
	for _, id := range details.DestroyedLeases {
		e.assertLeaseGone(id)
	}

	e.requireFired("lost", 2)
	records := processes(e.stack.Sandbox, marker)
	assert.Zero(t, ran(records, marker), describe(records))
	require.Len(t, records, 2, "one orphan per lease"+describe(records))
	for i, r := range records {
		assert.Equal(t, details.DestroyedLeases[i], r.LeaseID)
		assert.NoError(t, killed(r))
	}
}
