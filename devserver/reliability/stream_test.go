package reliability

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// The output stream cannot be attached: four connects answered 503 and
// 429 spend the reconnect budget while the process waits behind its start
// gate. The process is left as it is, and the Execute retry re-attaches to
// it on the same lease and opens the gate: one process, run once. No
// compensation: the lease is clean.
func TestConnectFailsFourTimes(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "503", Method: http.MethodGet, Path: connectPath, Times: 2, Fault: faultproxy.Status(http.StatusServiceUnavailable)})
	e.proxy.AddRule(faultproxy.Rule{Name: "429", Method: http.MethodGet, Path: connectPath, Times: 2, Fault: faultproxy.Status(http.StatusTooManyRequests)})
	marker := newMarker()

	run := e.startRun(request(command(marker, "echo done")))
	res, err := e.result(run)
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)
	assert.Zero(t, res.FreshLeases, "a lost connection is retried, not compensated")
	assert.Equal(t, []string{res.LeaseID}, res.DestroyedLeases)
	assert.Equal(t, 1, res.Starts)

	e.requireFired("503", 2)
	e.requireFired("429", 2)
	h := e.readHistory(run)
	assert.Equal(t, []int32{2}, h.executeAttempts, "Execute ran a second attempt")
	assert.Equal(t, []string{sandbox.TypeConnectionExhausted}, h.retriedAfter)

	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	require.Len(t, records, 1, "the retry re-attached to the process: "+describe(records))
	assert.Equal(t, res.LeaseID, records[0].LeaseID)
}

// numbered prints lines 1…n, a little apart, so that they leave the
// process as separate frames.
func numbered(n int) (script, output string) {
	var out strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&out, "line %d\n", i)
	}
	return fmt.Sprintf("for i in $(seq 1 %d); do echo line $i; sleep 0.01; done", n), out.String()
}

// The stream is cut mid-output; the reconnect replays from the cursor,
// and a replay that repeats frames loses nothing and doubles nothing.
func TestStreamCutAndReplayed(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "cut", Method: http.MethodGet, Path: connectPath, Times: 1, Fault: faultproxy.CutStream(0, 200)})
	e.proxy.AddRule(faultproxy.Rule{Name: "duplicate", Method: http.MethodGet, Path: connectPath, Times: 1, Fault: faultproxy.DuplicateFrames()})
	marker := newMarker()
	script, output := numbered(40)

	run := e.startRun(request(command(marker, script)))
	res, err := e.result(run)
	require.NoError(t, err)
	assert.Equal(t, marker+"\n"+output, res.Stdout, "complete and in order")
	assert.False(t, res.Truncated)
	assert.Zero(t, res.FreshLeases)

	e.requireFired("cut", 1)
	e.requireFired("duplicate", 1)
	assert.Equal(t, []int32{1}, e.readHistory(run).executeAttempts, "one attempt: the reconnect did it")
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	assert.Len(t, records, 1)
}

// A frame goes missing: the stream breaks the contract, which no retry
// can fix. The run fails at once, the process is killed, the lease
// destroyed.
func TestSequenceGap(t *testing.T) {
	e := start(t, options{})
	e.proxy.AddRule(faultproxy.Rule{Name: "gap", Method: http.MethodGet, Path: connectPath, Times: 1, Fault: faultproxy.SequenceGap(2)})
	marker := newMarker()

	run := e.startRun(request(command(marker, "sleep 0.2; echo two; sleep 0.2; echo three; exec sleep 600")))
	_, err := e.result(run)
	requireApplicationError(t, err, sandbox.TypeProtocol)

	e.requireFired("gap", 1)
	assert.Equal(t, []int32{1}, e.readHistory(run).executeAttempts, "not retried")
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	require.Len(t, records, 1)
	assert.NoError(t, killed(records[0]), "the process was killed, not left to sleep")
	e.assertLeaseGone(records[0].LeaseID)
}

// The stream is cut while the command prints far more than the server's
// journal holds; with nobody reading, the journal evicts, and the
// reconnect finds its cursor gone. Output is lost, which no retry can
// undo.
func TestOutputEvicted(t *testing.T) {
	e := start(t, options{sandbox: localsandbox.Options{
		JournalBytes: 64 << 10, // the least allowed
		// A reader that vanished without the server noticing holds the
		// journal this long at most.
		StallTimeout: 200 * time.Millisecond,
	}})
	e.proxy.AddRule(faultproxy.Rule{Name: "cut", Method: http.MethodGet, Path: connectPath, Times: 1, Fault: faultproxy.CutStream(2, 0)})
	e.proxy.AddRule(faultproxy.Rule{Name: "reconnect", Method: http.MethodGet, Path: connectPath, Fault: faultproxy.Pass()})
	marker := newMarker()

	run := e.startRun(request(command(marker, "head -c 8000000 /dev/zero | tr '\\0' x")))
	_, err := e.result(run)
	requireApplicationError(t, err, sandbox.TypeOutputEvicted)

	e.requireFired("cut", 1)
	e.requireFired("reconnect", 1)
	assert.Equal(t, http.StatusGone, e.proxy.Log()[1].Status, "the reconnect was told its cursor is evicted")
	assert.Equal(t, []int32{1}, e.readHistory(run).executeAttempts, "not retried")
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
	require.Len(t, records, 1)
	e.assertLeaseGone(records[0].LeaseID)
}
