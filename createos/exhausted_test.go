package createos

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// A command exits while its output cannot be read: every connect of the
// first run is dropped before a frame arrives. The exhaustion leaves the
// exited process with its result on the server, and an Attach reads it
// all: exit status and exact output, the command run once (issue 28 item
// 3). On be7ee59 the process was killed and a retry ran the command again.
func TestExhaustionLeavesTheProcessForAnAttach(t *testing.T) {
	f := newFakeServer(t)
	runs := 0
	f.program = func(p *fakeProc) {
		runs++
		p.write("stdout", "one\n")
		p.write("stderr", "two\n")
		p.exit(3)
	}
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n <= 1+maxReconnects+1 { // the first connect, the reconnects, the fallback's replay
			streamLines(w) // attached, then dropped with nothing read
			return true
		}
		return false
	})
	c := newTestClient(t, f)
	lease, rec := f.newLease(), &recorder{}

	_, err := c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"x"}}, rec)

	var exhausted *sandbox.ConnectionExhaustedError
	require.ErrorAs(t, err, &exhausted)
	assert.True(t, exhausted.Running)
	assert.True(t, sandbox.Retryable(err))
	assert.Zero(t, f.count("deleteProcess"), "a process whose output could not be read is not killed")
	require.Len(t, rec.started, 1)

	res, err := c.Attach(t.Context(), lease, rec.started[0], nil)

	require.NoError(t, err)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, "one\n", res.Stdout)
	assert.Equal(t, "two\n", res.Stderr)
	assert.False(t, res.Truncated)
	assert.Equal(t, 1, runs, "the command ran once")
	assert.Zero(t, f.count("deleteProcess"))
}

// A process left running is stopped by an Attach whose context has ended:
// its tree is killed, and no output is read.
func TestAttachWithAnEndedContextKills(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	lease := f.newLease()
	proc := f.newProc(lease, "tok", true)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := c.Attach(ctx, lease, sandbox.Process{ID: proc.id, Token: "tok"}, nil)

	require.ErrorIs(t, err, context.Canceled)
	assertKilled(t, f, proc.id)
	assert.Zero(t, f.count("connect"), "nothing read")
}
