package createos

import (
	"encoding/base64"
	"net/http"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testToken = "TOKEN234567ABCDEFGHIJKLMNO"

func TestAttachReplaysFromTheStart(t *testing.T) {
	for name, started := range map[string]bool{
		"the command ran already":         true,
		"its caller died before the gate": false,
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			lease := f.newLease()
			p := f.newProc(lease, testToken, started)
			run := func(p *fakeProc) {
				p.write("stdout", "one\n")
				p.write("stderr", "two\n")
				p.exit(2)
			}
			if started {
				run(p)
			} else {
				f.program = run
			}
			c := newTestClient(t, f)
			rec := &recorder{}

			res, err := c.Attach(t.Context(), lease, sandbox.Process{ID: p.id, Token: testToken}, rec)

			require.NoError(t, err)
			assert.Equal(t, sandbox.Result{ProcessID: p.id, ExitCode: 2, Stdout: "one\n", Stderr: "two\n"}, res)
			assert.Empty(t, rec.started, "Attach does not report a start")
			assert.Len(t, rec.chunks, 2)
			assert.Equal(t, []string{"connect", "putFile", "input", "exec"}, f.routes(), "no process is created, none is killed")
			assert.Equal(t, "0", f.requests("connect")[0].Query.Get("after"))
			assert.JSONEq(t, `{"data_base64":"`+base64.StdEncoding.EncodeToString([]byte(testToken+"\n"))+`"}`,
				string(f.requests("input")[0].Body), "the gate's line")
			assert.Equal(t, "/workspace/.sandboxflow/"+testToken+".gate", f.requests("putFile")[0].Query.Get("path"), "the legacy gate")
			assert.Equal(t, []string{"-f", "--", "/workspace/.sandboxflow/" + testToken + ".gate", "/workspace/.sandboxflow/" + testToken + ".stdin", "/workspace/.sandboxflow/" + testToken + ".sh"},
				execArgs(t, f.requests("exec")[0]), "the legacy gate, a staged stdin and an uploaded script are removed")
		})
	}
}

// A process that an earlier version of the client started and left
// behind its gate file (its worker died before writing it) is let go by
// Attach all the same.
func TestAttachOpensTheLegacyGate(t *testing.T) {
	f := newFakeServer(t)
	lease := f.newLease()
	p := f.newLegacyProc(lease, testToken)
	f.program = func(p *fakeProc) { p.write("stdout", "legacy\n"); p.exit(0) }
	c := newTestClient(t, f)

	res, err := c.Attach(t.Context(), lease, sandbox.Process{ID: p.id, Token: testToken}, nil)

	require.NoError(t, err)
	assert.Equal(t, "legacy\n", res.Stdout)
	assert.Equal(t, []string{"connect", "putFile", "input", "exec"}, f.routes())
}

func TestAttachAfterEviction(t *testing.T) {
	f := newFakeServer(t)
	lease := f.newLease()
	p := f.newProc(lease, testToken, true)
	for range 3 {
		p.write("stdout", "lost")
	}
	p.exit(3)
	p.evictedThrough = 2 // the start of the journal is gone
	c := newTestClient(t, f)
	rec := &recorder{}

	res, err := c.Attach(t.Context(), lease, sandbox.Process{ID: p.id, Token: testToken}, rec)

	require.NoError(t, err)
	assert.Equal(t, sandbox.Result{ProcessID: p.id, ExitCode: 3, Truncated: true}, res)
	assert.Empty(t, rec.chunks)
	assert.Equal(t, []string{"connect", "wait", "exec"}, f.routes(), "waited for the exit status, killed nothing")
}

func TestAttachPastItsDeadline(t *testing.T) {
	t.Run("exited in time", func(t *testing.T) {
		f := newFakeServer(t)
		lease := f.newLease()
		p := f.newProc(lease, testToken, true)
		p.write("stdout", "done")
		p.exit(0)
		c := newTestClient(t, f)

		res, err := c.Attach(t.Context(), lease, sandbox.Process{ID: p.id, Token: testToken, Deadline: time.Now().Add(-time.Second)}, nil)

		require.NoError(t, err)
		assert.Equal(t, sandbox.Result{ProcessID: p.id, Stdout: "done"}, res)
		assert.Equal(t, []string{"wait", "connect", "putFile", "input", "exec"}, f.routes())
	})
	t.Run("still running", func(t *testing.T) {
		f := newFakeServer(t)
		lease := f.newLease()
		p := f.newProc(lease, testToken, true)
		p.write("stdout", "forever")
		c := newTestClient(t, f)

		res, err := c.Attach(t.Context(), lease, sandbox.Process{ID: p.id, Token: testToken, Deadline: time.Now().Add(-time.Second)}, nil)

		require.NoError(t, err)
		assert.Equal(t, sandbox.Result{ProcessID: p.id, TimedOut: true, Truncated: true}, res)
		assert.Equal(t, []string{"wait", "deleteProcess", "exec"}, f.routes())
	})
}

func TestAttachTimesOutAtTheDeadline(t *testing.T) {
	f := newFakeServer(t)
	lease := f.newLease()
	p := f.newProc(lease, testToken, true)
	p.write("stdout", "partial")
	c := newTestClient(t, f)

	res, err := c.Attach(t.Context(), lease, sandbox.Process{ID: p.id, Token: testToken, Deadline: time.Now().Add(200 * time.Millisecond)}, nil)

	require.NoError(t, err)
	assert.Equal(t, sandbox.Result{ProcessID: p.id, TimedOut: true, Stdout: "partial"}, res)
	assert.Equal(t, 1, f.count("deleteProcess"))
}

func TestAttachUnknownProcess(t *testing.T) {
	f := newFakeServer(t)
	lease := f.newLease()
	c := newTestClient(t, f)

	_, err := c.Attach(t.Context(), lease, sandbox.Process{ID: "p-404", Token: testToken}, nil)

	// No proof that its command never ran: its result is lost, typed, and
	// the caller must not run the command again.
	var lost *sandbox.OutputEvictedError
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.Gone)
	assert.NotErrorIs(t, err, sandbox.ErrNeverStarted)
	assert.Equal(t, []string{"connect", "getSandbox", "exec", "deleteProcess", "exec"}, f.routes())
	assert.Equal(t, http.MethodGet, f.requests("connect")[0].Method)
}

func TestAttachRejectsBadIDs(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	lease := f.newLease()
	for name, tc := range map[string]struct {
		lease sandbox.Lease
		proc  sandbox.Process
	}{
		"process id":    {lease, sandbox.Process{ID: "p/1"}},
		"empty process": {lease, sandbox.Process{}},
		"token":         {lease, sandbox.Process{ID: "p-1", Token: "../../etc/passwd"}},
		"lease id":      {sandbox.Lease{ID: "sb 1"}, sandbox.Process{ID: "p-1"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Attach(t.Context(), tc.lease, tc.proc, nil)
			var invalid *sandbox.InvalidInputError
			require.ErrorAs(t, err, &invalid)
		})
	}
	assert.Empty(t, f.routes())
}
