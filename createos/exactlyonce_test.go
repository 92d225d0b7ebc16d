package createos

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// A gate write whose answer is lost or a 5xx may have been delivered, and
// the command may be running: the write is repeated (the script reads one
// line; past its gate, its stdin answers 409), the process is followed to
// its end, never killed, and the command runs once.
func TestExecuteRepeatsAnAmbiguousGateWrite(t *testing.T) {
	for name, tc := range map[string]struct {
		first  func(f *fakeServer, w http.ResponseWriter, r *http.Request)
		inputs int // gate writes in all
	}{
		"500 after delivering": {func(f *fakeServer, w http.ResponseWriter, r *http.Request) {
			f.input(httptest.NewRecorder(), r)
			fail(w, http.StatusInternalServerError)
		}, 2},
		"answer lost after delivering": {func(f *fakeServer, w http.ResponseWriter, r *http.Request) {
			f.input(httptest.NewRecorder(), r)
			conn, _, err := http.NewResponseController(w).Hijack()
			require.NoError(t, err)
			conn.Close()
		}, 2},
		"503 before delivering": {func(f *fakeServer, w http.ResponseWriter, r *http.Request) {
			fail(w, http.StatusServiceUnavailable)
		}, 2}, // the transport repeats a 503 itself
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			runs := 0
			f.program = func(p *fakeProc) { runs++; p.write("stdout", "ok"); p.exit(0) }
			f.on("input", func(w http.ResponseWriter, r *http.Request, n int) bool {
				if n == 1 {
					tc.first(f, w, r)
					return true
				}
				return false
			})
			c := newTestClient(t, f)
			res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"echo"}}, nil)

			require.NoError(t, err)
			assert.Equal(t, "ok", res.Stdout)
			assert.Equal(t, 1, runs, "the command ran once")
			assert.Equal(t, 1, f.count("createProcess"))
			assert.Equal(t, tc.inputs, f.count("input"), "the gate was written again")
			assert.Zero(t, f.count("deleteProcess"), "the process was not killed")
			assert.Zero(t, f.count("exec"), "no file to remove")
		})
	}
}

// Inside one connection a data frame whose seq does not grow may carry
// output never delivered: it is not skipped as a duplicate. The stream is
// re-read from the cursor, and the output is whole.
func TestExecuteRereadsAStreamWhoseSequenceGoesBack(t *testing.T) {
	for name, first := range map[string][]string{
		"the last frame repeats the seq": {dataFrame(1, "stdout", "a\n"), dataFrame(2, "stdout", "b\n"), dataFrame(2, "stdout", "c\n"), exitFrame(0)},
		"a frame goes back":              {dataFrame(1, "stdout", "a\n"), dataFrame(2, "stdout", "b\n"), dataFrame(1, "stdout", "c\n"), exitFrame(0)},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
				if n == 1 {
					streamLines(w, first...)
					return true
				}
				streamLines(w, dataFrame(3, "stdout", "c\n"), exitFrame(0))
				return true
			})
			c := newTestClient(t, f)

			res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

			require.NoError(t, err)
			assert.Equal(t, "a\nb\nc\n", res.Stdout)
			assert.False(t, res.Truncated)
			connects := f.requests("connect")
			require.Len(t, connects, 2)
			assert.Equal(t, "2", connects[1].Query.Get("after"), "re-read after the cursor")
		})
	}
}

// A stream that keeps going back spends the reconnect budget and says so.
func TestExecuteSequenceThatKeepsGoingBackIsNotAResult(t *testing.T) {
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		streamLines(w, dataFrame(1, "stdout", "a"), dataFrame(1, "stdout", "b"), exitFrame(0))
		return true
	})
	c := newTestClient(t, f)

	_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

	var exhausted *sandbox.ConnectionExhaustedError
	require.ErrorAs(t, err, &exhausted)
	var protocol *sandbox.ProtocolError
	require.ErrorAs(t, err, &protocol)
	assert.Equal(t, sandbox.SequenceRegression, protocol.Kind)
}

// A server that beats every few milliseconds and then falls silent is
// taken for gone after a few missed heartbeats (at least a second), not
// after StreamIdleTimeout: the reconnect finds the exit.
func TestExecuteNoticesAStallByTheMissedHeartbeats(t *testing.T) {
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n > 1 {
			return false
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		for range 5 {
			io.WriteString(w, `{"type":"heartbeat"}`+"\n")
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond) // the server's heartbeat interval
		}
		<-r.Context().Done() // then silent until the client gives up
		return true
	})
	c := newTestClient(t, f, func(cfg *Config) { cfg.StreamIdleTimeout = time.Hour })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // bounds a broken test only
	defer cancel()

	res, err := c.Execute(ctx, f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

	require.NoError(t, err)
	assert.Zero(t, res.ExitCode)
	assert.Equal(t, 2, f.count("connect"), "the silent stream was given up and reconnected")
}
