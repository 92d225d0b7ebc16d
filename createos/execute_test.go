package createos

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The failure scenarios of PROTOCOL.md §7, and where they are tested:
//
//	exec 503 while preparing a lease          TestCreateLeaseDestroysASandboxItCannotPrepare,
//	                                          TestCreateLeaseCleanupUnconfirmed
//	process create 502                        TestExecuteCreateFailures/502
//	stream dropped inside a character         TestExecuteReconnectsInsideACharacter
//	seq gap, malformed JSON, exit w/o status  TestExecuteProtocolBreaches
//	410, output_offset_expired                TestExecuteOutputEvicted
//	timeout, fresh deadline for the DELETE    TestExecuteTimeoutKeepsPartialOutput
//	process DELETE 503                        TestExecuteFailedKillKeepsFirstError
//	env name BAD;KEY                          TestExecuteRejectsInvalidInputBeforeAnyRequest
//	401                                       TestUnauthorizedErrorHasNoSecrets
//	unsafe base URLs                          TestNewRejectsUnsafeBaseURLs
//	pacing                                    TestPacingSpacesConcurrentRequests,
//	                                          TestPacingAbortedWaiterDoesNotBlockTheNext

// execArgs returns the args of a one-shot exec request.
func execArgs(t *testing.T, rq fakeRequest) []string {
	t.Helper()
	var body struct {
		Cmd  string   `json:"cmd"`
		Args []string `json:"args"`
	}
	require.NoError(t, json.Unmarshal(rq.Body, &body))
	return append([]string{}, body.Args...)
}

// assertKilled checks that the process was killed once, with a grace.
func assertKilled(t *testing.T, f *fakeServer, pid string) {
	t.Helper()
	kills := f.requests("deleteProcess")
	require.Len(t, kills, 1, "the process must be killed once")
	assert.Equal(t, "/sandboxes/sb-1/processes/"+pid, kills[0].Path)
	assert.Equal(t, "1000", kills[0].Query.Get("grace_ms"))
}

func TestExecuteRunsCommand(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) {
		p.write("stdout", "got: "+string(p.stdin()))
		p.write("stderr", "warn\n")
		p.exit(3)
	}
	c := newTestClient(t, f)
	lease := f.newLease()
	rec := &recorder{}

	before := time.Now()
	res, err := c.Execute(t.Context(), lease, sandbox.Command{
		Argv:    []string{"cat", "-"},
		Cwd:     "src",
		Env:     map[string]string{"GREETING": "it's $HOME"},
		Stdin:   []byte("input"),
		Timeout: time.Minute,
	}, rec)

	require.NoError(t, err)
	assert.Equal(t, sandbox.Result{ProcessID: "p-2", ExitCode: 3, Stdout: "got: input", Stderr: "warn\n"}, res)
	require.Len(t, rec.started, 1)
	proc := rec.started[0]
	assert.Equal(t, "p-2", proc.ID)
	require.NoError(t, sandbox.CheckID("token", proc.Token))
	assert.WithinRange(t, proc.Deadline, before.Add(time.Minute), time.Now().Add(time.Minute))
	assert.Equal(t, []sandbox.Chunk{
		{Seq: 1, Stream: sandbox.Stdout, Text: "got: input", Bytes: 10},
		{Seq: 2, Stream: sandbox.Stderr, Text: "warn\n", Bytes: 5},
	}, rec.chunks)

	// Stdin staged, process created, stream attached, gate opened (the
	// token's line on the process's stdin), the staged stdin removed;
	// nothing killed.
	assert.Equal(t, []string{"putFile", "createProcess", "connect", "input", "exec"}, f.routes())
	puts := f.requests("putFile")
	stdinFile := "/workspace/.sandboxflow/" + proc.Token + ".stdin"
	assert.Equal(t, stdinFile, puts[0].Query.Get("path"))
	assert.Equal(t, "input", string(puts[0].Body))
	assert.JSONEq(t, `{"data_base64":"`+base64.StdEncoding.EncodeToString([]byte(proc.Token+"\n"))+`"}`, string(f.requests("input")[0].Body))
	assert.Equal(t, "0", f.requests("connect")[0].Query.Get("after"))

	var create map[string]any
	require.NoError(t, json.Unmarshal(f.requests("createProcess")[0].Body, &create))
	assert.NotContains(t, create, "env", "API-level env is never sent")
	assert.Equal(t, "/bin/sh", create["cmd"])
	assert.Equal(t, "/workspace", create["cwd"])
	args := create["args"].([]any)
	require.Len(t, args, 2)
	assert.Equal(t, "-c", args[0])
	script := args[1].(string)
	assert.Contains(t, script, `IFS= read -r gate && [ "$gate" = '`+proc.Token+"' ] || ")
	assert.Contains(t, script, "cd -- '/workspace/src' || exit 1\n")
	assert.Contains(t, script, `export GREETING='it'\''s $HOME'`+"\n")
	assert.Contains(t, script, "exec 'cat' '-' < '"+stdinFile+"'\n")

	assert.Equal(t, []string{"-f", "--", "/workspace/.sandboxflow/" + proc.Token + ".gate", stdinFile, "/workspace/.sandboxflow/" + proc.Token + ".sh"}, execArgs(t, f.requests("exec")[0]))
	_, left := f.file(lease.ID, stdinFile)
	assert.False(t, left, "the staged stdin is removed")
}

func TestExecuteWithoutStdinReadsDevNull(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

	require.NoError(t, err)
	assert.Equal(t, sandbox.Result{ProcessID: "p-2"}, res)
	// Three requests, and no file staged: none to remove.
	assert.Equal(t, []string{"createProcess", "connect", "input"}, f.routes())
	var create struct{ Args []string }
	require.NoError(t, json.Unmarshal(f.requests("createProcess")[0].Body, &create))
	assert.Contains(t, create.Args[1], "exec 'true' < '/dev/null'\n")
}

// A script longer than maxInlineScript travels as a file, like stdin:
// the process is `sh FILE`, its gate the same, and the file is removed
// with the run's other files.
func TestExecuteUploadsALongScript(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	lease := f.newLease()
	rec := &recorder{}
	big := strings.Repeat("x", 100_000)

	res, err := c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"echo", big, big}}, rec)

	require.NoError(t, err)
	assert.Equal(t, sandbox.Result{ProcessID: "p-2"}, res)
	assert.Equal(t, []string{"putFile", "createProcess", "connect", "input", "exec"}, f.routes())
	token := rec.started[0].Token
	scriptFile := "/workspace/.sandboxflow/" + token + ".sh"
	put := f.requests("putFile")[0]
	assert.Equal(t, scriptFile, put.Query.Get("path"))
	assert.Contains(t, string(put.Body), `IFS= read -r gate && [ "$gate" = '`+token+"' ] || ")
	assert.Contains(t, string(put.Body), "exec 'echo' '"+big+"' '"+big+"' < '/dev/null'\n")
	var create struct {
		Cmd  string
		Args []string
	}
	require.NoError(t, json.Unmarshal(f.requests("createProcess")[0].Body, &create))
	assert.Equal(t, "/bin/sh", create.Cmd)
	assert.Equal(t, []string{scriptFile}, create.Args)
	assert.Contains(t, execArgs(t, f.requests("exec")[0]), scriptFile)
	_, left := f.file(lease.ID, scriptFile)
	assert.False(t, left, "the uploaded script is removed")
}

func TestExecuteRejectsInvalidInputBeforeAnyRequest(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	lease := f.newLease()
	for name, tc := range map[string]struct {
		lease sandbox.Lease
		cmd   sandbox.Command
		field string
	}{
		"env name":                  {lease, sandbox.Command{Argv: []string{"env"}, Env: map[string]string{"BAD;KEY": "env-secret-value"}}, "env"},
		"NUL in argument":           {lease, sandbox.Command{Argv: []string{"echo", "a\x00b"}}, "argv[1]"},
		"no program":                {lease, sandbox.Command{}, "argv"},
		"bad lease id":              {sandbox.Lease{ID: "../sb-1"}, sandbox.Command{Argv: []string{"true"}}, "lease id"},
		"empty lease id":            {sandbox.Lease{}, sandbox.Command{Argv: []string{"true"}}, "lease id"},
		"relative workspace":        {sandbox.Lease{ID: "sb-1", Workspace: "work"}, sandbox.Command{Argv: []string{"true"}}, "lease workspace"},
		"one argument over 128 KiB": {lease, sandbox.Command{Argv: []string{"echo", strings.Repeat("a", sandbox.MaxArgBytes+1)}}, "argv[1]"},
		"one variable over 128 KiB": {lease, sandbox.Command{Argv: []string{"env"}, Env: map[string]string{"V": strings.Repeat("env-secret-value", 9000)}}, "env"},
		"argv and env over the budget": {lease, sandbox.Command{Argv: []string{"echo", strings.Repeat("a", 100_000)},
			Env: map[string]string{"A": strings.Repeat("b", 120_000), "B": strings.Repeat("b", 120_000), "C": strings.Repeat("b", 120_000),
				"D": strings.Repeat("b", 120_000), "E": strings.Repeat("b", 120_000), "F": strings.Repeat("b", 120_000),
				"G": strings.Repeat("b", 120_000), "H": strings.Repeat("b", 120_000)}}, "argv"},
		"stdin over its limit": {lease, sandbox.Command{Argv: []string{"cat"}, Stdin: make([]byte, sandbox.MaxStdinBytes+1)}, "stdin"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Execute(t.Context(), tc.lease, tc.cmd, nil)
			var invalid *sandbox.InvalidInputError
			require.ErrorAs(t, err, &invalid)
			assert.Equal(t, tc.field, invalid.Field)
			assert.NotContains(t, err.Error(), "env-secret-value")
		})
	}
	assert.Empty(t, f.routes(), "no request may be sent")
}

func TestExecuteReconnectsAfterServerError(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) { p.write("stdout", "ok"); p.exit(0) }
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n == 1 {
			fail(w, http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	c := newTestClient(t, f)

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"echo"}}, nil)

	require.NoError(t, err)
	assert.Equal(t, "ok", res.Stdout)
	connects := f.requests("connect")
	require.Len(t, connects, 2)
	assert.Equal(t, "0", connects[1].Query.Get("after"))
	assert.Equal(t, 1, f.count("createProcess"))
	assert.Zero(t, f.count("deleteProcess"))
}

func TestExecuteWaitsBeforeReconnecting(t *testing.T) {
	require.Equal(t, 250*time.Millisecond, defaultReconnectDelay)
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n == 1 {
			fail(w, http.StatusTooManyRequests)
			return true
		}
		return false
	})
	c := newTestClient(t, f)
	c.reconnectDelay = defaultReconnectDelay

	_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

	require.NoError(t, err)
	connects := f.requests("connect")
	require.Len(t, connects, 2)
	assert.GreaterOrEqual(t, connects[1].At.Sub(connects[0].At), defaultReconnectDelay)
}

func TestExecuteConnectionExhausted(t *testing.T) {
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusBadGateway)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

	var exhausted *sandbox.ConnectionExhaustedError
	require.ErrorAs(t, err, &exhausted)
	assert.Equal(t, 4, exhausted.Attempts)
	assert.Equal(t, "p-2", exhausted.ProcessID)
	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusBadGateway, api.Status)
	assert.True(t, sandbox.Retryable(err), "a retry attaches to the process")
	assert.True(t, exhausted.Running, "left behind its gate for a retry to attach to")
	assert.Equal(t, []string{"createProcess", "connect", "connect", "connect", "connect"}, f.routes(),
		"the gate never opened, and nothing was killed")
}

func TestExecuteReconnectsInsideACharacter(t *testing.T) {
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		switch n {
		case 1: // the first byte of "é", then the stream drops
			streamLines(w, dataFrame(1, "stdout", "\xc3"))
		default: // a replay that repeats seq 1
			streamLines(w, dataFrame(1, "stdout", "\xc3"), dataFrame(2, "stdout", "\xa9!"), exitFrame(0))
		}
		return true
	})
	c := newTestClient(t, f)
	rec := &recorder{}

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"echo"}}, rec)

	require.NoError(t, err)
	assert.Equal(t, "é!", res.Stdout)
	assert.False(t, res.Truncated)
	assert.Equal(t, []sandbox.Chunk{
		{Seq: 1, Stream: sandbox.Stdout, Text: "", Bytes: 1},
		{Seq: 2, Stream: sandbox.Stdout, Text: "é!", Bytes: 2},
	}, rec.chunks)
	connects := f.requests("connect")
	require.Len(t, connects, 2)
	assert.Equal(t, "0", connects[0].Query.Get("after"))
	assert.Equal(t, "1", connects[1].Query.Get("after"))
	assert.Equal(t, 1, f.count("createProcess"))
	assert.Equal(t, 1, f.count("input"), "the gate opens once")
	assert.Zero(t, f.count("deleteProcess"))
}

// Duplicates are skipped: a frame repeated as it was, and the replay of a
// reconnect that starts before the cursor.
func TestExecuteSkipsDuplicateFrames(t *testing.T) {
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n == 1 {
			streamLines(w, dataFrame(1, "stdout", "a"), dataFrame(1, "stdout", "a"), dataFrame(2, "stderr", "b"))
			return true
		}
		streamLines(w, dataFrame(1, "stdout", "a"), dataFrame(2, "stderr", "b"),
			"", `{"type":"heartbeat"}`, dataFrame(3, "stdout", "c"), exitFrame(0))
		return true
	})
	c := newTestClient(t, f)
	rec := &recorder{}

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, rec)

	require.NoError(t, err)
	assert.Equal(t, "ac", res.Stdout)
	assert.Equal(t, "b", res.Stderr)
	var seqs []int64
	for _, c := range rec.chunks {
		seqs = append(seqs, c.Seq)
	}
	assert.Equal(t, []int64{1, 2, 3}, seqs)
}

func TestExecuteOutputEvicted(t *testing.T) {
	for name, second := range map[string]func(http.ResponseWriter){
		"410 on reconnect": func(w http.ResponseWriter) { fail(w, http.StatusGone) },
		"error frame": func(w http.ResponseWriter) {
			streamLines(w, dataFrame(1, "stdout", "a"), `{"type":"error","error":"output_offset_expired"}`)
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
				if n == 1 {
					streamLines(w, dataFrame(1, "stdout", "a"))
				} else {
					second(w)
				}
				return true
			})
			c := newTestClient(t, f)

			_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

			var evicted *sandbox.OutputEvictedError
			require.ErrorAs(t, err, &evicted)
			assert.Equal(t, sandbox.OutputEvictedError{ProcessID: "p-2", After: 1}, *evicted)
			assert.False(t, sandbox.Retryable(err))
			assertKilled(t, f, "p-2")
			assert.Equal(t, []string{"createProcess", "connect", "input", "connect", "deleteProcess"}, f.routes())
		})
	}
}

func TestExecuteProtocolBreaches(t *testing.T) {
	tooLarge := `{"type":"heartbeat","pad":"` + strings.Repeat("x", maxFrame) + `"}`
	for name, tc := range map[string]struct {
		lines []string
		kind  sandbox.ProtocolKind
	}{
		"sequence gap":        {[]string{dataFrame(1, "stdout", "a"), dataFrame(3, "stdout", "c")}, sandbox.SequenceGap},
		"exit without status": {[]string{`{"type":"exit"}`}, sandbox.MissingExitStatus},
		"exit code not int":   {[]string{`{"type":"exit","exit_code":"0"}`}, sandbox.MissingExitStatus},
		"bad signal":          {[]string{`{"type":"exit","signal":"kill"}`}, sandbox.MissingExitStatus},
		"malformed JSON":      {[]string{`{"type":"data","seq":1,`}, sandbox.InvalidFrame},
		"not an object":       {[]string{`[1,2]`}, sandbox.InvalidFrame},
		"unknown stream":      {[]string{`{"type":"data","seq":1,"stream":"stdin","data_base64":""}`}, sandbox.InvalidFrame},
		"bad base64":          {[]string{`{"type":"data","seq":1,"stream":"stdout","data_base64":"YQ"}`}, sandbox.BadBase64},
		"unknown event":       {[]string{`{"type":"progress"}`}, sandbox.UnknownEvent},
		"error frame":         {[]string{`{"type":"error","error":"disk_full"}`}, sandbox.ErrorEvent},
		"frame over 1 MiB":    {[]string{tooLarge}, sandbox.FrameTooLarge},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
				streamLines(w, tc.lines...)
				return true
			})
			c := newTestClient(t, f)

			_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

			var protocol *sandbox.ProtocolError
			require.ErrorAs(t, err, &protocol)
			assert.Equal(t, tc.kind, protocol.Kind)
			assert.False(t, sandbox.Retryable(err))
			assert.Less(t, len(err.Error()), 200, "error text never quotes a frame")
			assertKilled(t, f, "p-2")
			assert.Equal(t, []string{"createProcess", "connect", "input", "deleteProcess"}, f.routes(),
				"a breach is not retried")
		})
	}
}

func TestExecuteTimeoutKeepsPartialOutput(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) { p.write("stdout", "partial\n") } // and never exits
	killed := make(chan struct{})
	f.on("deleteProcess", func(w http.ResponseWriter, r *http.Request, n int) bool {
		close(killed)
		return false // the default kill answers tree_exited:true
	})
	c := newTestClient(t, f)

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"sleep", "inf"}, Timeout: 300 * time.Millisecond}, nil)

	// The kill reached the server, and its answer reached the client: an
	// expired deadline would have made the kill unconfirmed.
	require.NoError(t, err)
	<-killed
	assert.Equal(t, sandbox.Result{ProcessID: "p-2", TimedOut: true, Stdout: "partial\n"}, res)
	assert.Equal(t, 124, res.ShellExitCode())
	assertKilled(t, f, "p-2")
	assert.Equal(t, []string{"createProcess", "connect", "input", "deleteProcess"}, f.routes())
}

func TestExecuteCancelled(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) { p.write("stdout", "started\n") }
	c := newTestClient(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	rec := &recorder{onOutput: func(sandbox.Chunk) { cancel() }}

	_, err := c.Execute(ctx, f.newLease(), sandbox.Command{Argv: []string{"sleep", "inf"}}, rec)

	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "cancelled")
	assert.Empty(t, sandbox.ErrorType(err))
	assertKilled(t, f, "p-2") // with a fresh deadline: ctx had ended
	assert.Equal(t, []string{"createProcess", "connect", "input", "deleteProcess"}, f.routes())
}

func TestExecuteDetachedLeavesTheProcessForAttach(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) { p.write("stdout", "started\n") } // and runs on
	c := newTestClient(t, f)
	ctx, detach := context.WithCancelCause(t.Context())
	rec := &recorder{onOutput: func(sandbox.Chunk) { detach(sandbox.ErrDetached) }}
	lease := f.newLease()

	_, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sleep", "inf"}}, rec)

	require.ErrorIs(t, err, sandbox.ErrDetached)
	assert.Empty(t, sandbox.ErrorType(err))
	assert.Equal(t, []string{"createProcess", "connect", "input"}, f.routes(),
		"neither killed nor its files removed")

	// A later Attach (another worker) follows the same process to its end.
	require.Len(t, rec.started, 1)
	proc := rec.started[0]
	f.mu.Lock()
	running := f.sandboxes[lease.ID].procs[proc.ID]
	f.mu.Unlock()
	running.exit(0)
	res, err := c.Attach(t.Context(), lease, proc, nil)
	require.NoError(t, err)
	assert.Equal(t, "started\n", res.Stdout)
	assert.Equal(t, 1, f.count("createProcess"), "the command ran once")
}

// An observer that cannot record the process refuses it: the command never
// passes its start gate, and the process is killed even when the caller
// detaches, since nobody could attach to it.
func TestExecuteRefusedByTheObserverNeverStartsTheCommand(t *testing.T) {
	errRefused := errors.New("not recorded")
	for _, detach := range []bool{false, true} {
		t.Run(fmt.Sprintf("detach=%v", detach), func(t *testing.T) {
			f := newFakeServer(t)
			f.program = func(p *fakeProc) { t.Error("the command ran") }
			c := newTestClient(t, f)
			ctx, cancel := context.WithCancelCause(t.Context())
			rec := &recorder{onStarted: func(sandbox.Process) error {
				if detach {
					cancel(sandbox.ErrDetached)
				}
				return errRefused
			}}

			lease := f.newLease()
			_, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"x"}, Stdin: []byte("in")}, rec)

			require.Error(t, err)
			assert.NotErrorIs(t, err, sandbox.ErrDetached)
			// The refusal survives a ctx that ended meanwhile: it is not
			// "command cancelled", so the caller knows the command never ran.
			require.ErrorIs(t, err, errRefused)
			assert.Contains(t, err.Error(), "process p-2 not started")
			assert.Empty(t, sandbox.ErrorType(err))
			assertKilled(t, f, "p-2")
			assert.Equal(t, []string{"putFile", "createProcess", "putFile", "deleteProcess", "exec"}, f.routes(),
				"no connect, no gate; the refusal's evidence written, the stdin file removed")
			token := strings.TrimSuffix(strings.TrimPrefix(f.requests("putFile")[0].Query.Get("path"), "/workspace/.sandboxflow/"), ".stdin")
			assert.Equal(t, "/workspace/.sandboxflow/"+token+".refused", f.requests("putFile")[1].Query.Get("path"))

			// A retry that looks for the process finds it gone, and the
			// evidence that its command never ran.
			f.mu.Lock()
			delete(f.sandboxes[lease.ID].procs, "p-2") // the server forgets a killed process, as sandboxd does
			f.mu.Unlock()
			_, err = c.Attach(t.Context(), lease, sandbox.Process{ID: "p-2", Token: token}, nil)
			require.ErrorIs(t, err, sandbox.ErrNeverStarted)
		})
	}
}

func TestExecuteCreateFailures(t *testing.T) {
	reset := func(w http.ResponseWriter, r *http.Request) {
		// The request reached the server (it is recorded), but its answer
		// never reaches the client: the connection is reset.
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	}
	for name, tc := range map[string]struct {
		answer func(http.ResponseWriter, *http.Request)
		check  func(t *testing.T, err error)
	}{
		"502": {
			answer: func(w http.ResponseWriter, r *http.Request) { fail(w, http.StatusBadGateway) },
			check: func(t *testing.T, err error) {
				assertCreationUnconfirmed(t, err)
				var api *sandbox.APIError
				require.ErrorAs(t, err, &api)
				assert.Equal(t, http.StatusBadGateway, api.Status)
			},
		},
		"connection reset": {
			answer: reset,
			check: func(t *testing.T, err error) {
				assertCreationUnconfirmed(t, err)
				var unavailable *sandbox.UnavailableError
				require.ErrorAs(t, err, &unavailable)
			},
		},
		"400 means not created": {
			answer: func(w http.ResponseWriter, r *http.Request) { fail(w, http.StatusBadRequest) },
			check: func(t *testing.T, err error) {
				var api *sandbox.APIError
				require.ErrorAs(t, err, &api)
				assert.Equal(t, sandbox.TypeAPI, sandbox.ErrorType(err))
			},
		},
		"404 means the lease is gone": {
			answer: func(w http.ResponseWriter, r *http.Request) { fail(w, http.StatusNotFound) },
			check: func(t *testing.T, err error) {
				var gone *sandbox.LeaseGoneError
				require.ErrorAs(t, err, &gone)
				assert.Equal(t, "sb-1", gone.LeaseID)
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.on("createProcess", func(w http.ResponseWriter, r *http.Request, n int) bool {
				tc.answer(w, r)
				return true
			})
			c := newTestClient(t, f)

			_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

			tc.check(t, err)
			assert.Equal(t, []string{"createProcess"}, f.routes(), "never retried, nothing to kill or remove")
		})
	}
}

func assertCreationUnconfirmed(t *testing.T, err error) {
	t.Helper()
	var cleanup *sandbox.CleanupError
	require.ErrorAs(t, err, &cleanup)
	assert.Equal(t, sandbox.CreationUnconfirmed, cleanup.Reason)
	assert.Equal(t, "sb-1", cleanup.LeaseID)
	assert.Empty(t, cleanup.ProcessID)
	assert.False(t, sandbox.Retryable(err))
	assert.Contains(t, err.Error(), "destroy the lease before reusing it")
}

func TestExecuteUnconfirmedKillOverridesTimeout(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) { p.write("stdout", "partial\n") }
	f.on("deleteProcess", func(w http.ResponseWriter, r *http.Request, n int) bool {
		writeData(w, map[string]any{"tree_exited": false})
		return true
	})
	c := newTestClient(t, f)

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"sleep", "inf"}, Timeout: 100 * time.Millisecond}, nil)

	var cleanup *sandbox.CleanupError
	require.ErrorAs(t, err, &cleanup)
	assert.Equal(t, sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sb-1", ProcessID: "p-2", Err: errTreeAlive}, *cleanup)
	assert.Equal(t, sandbox.Result{}, res, "the cleanup error replaces the timed-out result")
	assert.Equal(t, sandbox.TypeCleanup, sandbox.ErrorType(err))
}

func TestExecuteFailedKillKeepsFirstError(t *testing.T) {
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		streamLines(w, dataFrame(2, "stdout", "b"))
		return true
	})
	f.on("deleteProcess", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusServiceUnavailable)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

	var cleanup *sandbox.CleanupError
	require.ErrorAs(t, err, &cleanup)
	assert.Equal(t, sandbox.TerminationUnconfirmed, cleanup.Reason)
	assert.Contains(t, err.Error(), "process termination is unconfirmed")
	var protocol *sandbox.ProtocolError
	require.ErrorAs(t, err, &protocol, "the first error stays reachable")
	assert.Equal(t, sandbox.SequenceGap, protocol.Kind)
	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusServiceUnavailable, api.Status)
	assert.NotContains(t, err.Error(), bodySecret)
}

func TestExecuteWaitFallbackAfterReconnectBudget(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) { p.write("stdout", "a"); p.exit(7) }
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		streamLines(w, dataFrame(1, "stdout", "a")) // every stream drops before the exit frame
		return true
	})
	c := newTestClient(t, f)

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

	require.NoError(t, err, "the whole journal was read: the exit status of wait is enough")
	assert.Equal(t, sandbox.Result{ProcessID: "p-2", ExitCode: 7, Stdout: "a"}, res)
	assert.Equal(t, 4, f.count("connect"))
	waits := f.requests("wait")
	require.Len(t, waits, 1)
	assert.Equal(t, "tree", waits[0].Query.Get("scope"))
	assert.Zero(t, f.count("deleteProcess"))
}

func TestExecuteWaitFallbackReplaysOnce(t *testing.T) {
	for name, tc := range map[string]struct {
		replay func(w http.ResponseWriter, r *http.Request) bool
		ok     bool
	}{
		"catches up":     {func(http.ResponseWriter, *http.Request) bool { return false }, true},
		"still behind":   {func(w http.ResponseWriter, r *http.Request) bool { streamLines(w); return true }, false},
		"replay refused": {func(w http.ResponseWriter, r *http.Request) bool { fail(w, 503); return true }, false},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.program = func(p *fakeProc) { p.write("stdout", "a"); p.exit(0) }
			f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
				if n <= 4 {
					streamLines(w) // attached, then dropped with nothing read
					return true
				}
				assert.Equal(t, "0", r.URL.Query().Get("after"))
				return tc.replay(w, r)
			})
			c := newTestClient(t, f)

			res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

			assert.Equal(t, 5, f.count("connect"))
			assert.Equal(t, 1, f.count("wait"))
			if tc.ok {
				require.NoError(t, err)
				assert.Equal(t, "a", res.Stdout)
				assert.Zero(t, f.count("deleteProcess"))
				return
			}
			var exhausted *sandbox.ConnectionExhaustedError
			require.ErrorAs(t, err, &exhausted)
			assert.Equal(t, 5, exhausted.Attempts)
			assert.True(t, exhausted.Running, "the exited process is left with its result, for a retry to read")
			assert.Zero(t, f.count("deleteProcess"))
		})
	}
}

func TestExecuteReconnectsASilentStream(t *testing.T) {
	f := newFakeServer(t)
	dropped := make(chan struct{})
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n > 1 {
			return false
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // silent until the client gives up
		close(dropped)
		return true
	})
	c := newTestClient(t, f, func(cfg *Config) { cfg.StreamIdleTimeout = 50 * time.Millisecond })

	_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

	require.NoError(t, err)
	<-dropped
	assert.Equal(t, 2, f.count("connect"))
}

func TestExecuteProcessNotFound(t *testing.T) {
	for name, tc := range map[string]struct {
		leaseGone bool
		check     func(t *testing.T, err error)
	}{
		"lease gone": {true, func(t *testing.T, err error) {
			var gone *sandbox.LeaseGoneError
			require.ErrorAs(t, err, &gone)
		}},
		"lease still there": {false, func(t *testing.T, err error) {
			var api *sandbox.APIError
			require.ErrorAs(t, err, &api)
			assert.Equal(t, http.StatusNotFound, api.Status)
			assert.Equal(t, sandbox.TypeAPI, sandbox.ErrorType(err))
		}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
				fail(w, http.StatusNotFound)
				return true
			})
			if tc.leaseGone {
				f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
					fail(w, http.StatusNotFound)
					return true
				})
			}
			c := newTestClient(t, f)

			_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

			tc.check(t, err)
			assert.Equal(t, 1, f.count("connect"), "404 is not retried")
			assert.Equal(t, 1, f.count("getSandbox"))
		})
	}
}

// A 403 on connect, or on the start gate's write (which then wrote
// nothing: the process is still behind its gate), is fatal and not
// repeated: the process is killed.
func TestExecuteForbiddenIsFatal(t *testing.T) {
	for _, route := range []string{"connect", "input"} {
		t.Run(route, func(t *testing.T) {
			f := newFakeServer(t)
			f.on(route, func(w http.ResponseWriter, r *http.Request, n int) bool {
				fail(w, http.StatusForbidden)
				return true
			})
			c := newTestClient(t, f)

			_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

			var api *sandbox.APIError
			require.ErrorAs(t, err, &api)
			assert.Equal(t, http.StatusForbidden, api.Status)
			assert.Equal(t, 1, f.count(route), "not repeated")
			assertKilled(t, f, "p-2")
		})
	}
}

func TestExecuteKeepsATailOfTheOutput(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) {
		p.write("stdout", "0123456789")
		p.write("stdout", "abcdé") // é is 2 bytes
		p.write("stderr", "short")
		p.exit(0)
	}
	c := newTestClient(t, f, func(cfg *Config) { cfg.CaptureBytes = 5 })
	rec := &recorder{}

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, rec)

	require.NoError(t, err)
	assert.Equal(t, "bcdé", res.Stdout, "the last 5 bytes")
	assert.Equal(t, "short", res.Stderr)
	assert.True(t, res.Truncated)
	assert.Equal(t, "0123456789abcdé", rec.text(sandbox.Stdout), "live output is complete")
	assert.Equal(t, int64(11), res.StdoutStart, "the tail's offset in the stream")
	assert.Equal(t, res.Stdout, rec.text(sandbox.Stdout)[res.StdoutStart:], "the tail is the live output from its offset on")
	assert.Zero(t, res.StderrStart, "a stream kept whole starts at 0")
}

func TestExecuteFlushesAnIncompleteCharacter(t *testing.T) {
	f := newFakeServer(t)
	f.program = func(p *fakeProc) { p.write("stdout", "a\xe2\x82"); p.exit(0) }
	c := newTestClient(t, f)
	rec := &recorder{}

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, rec)

	require.NoError(t, err)
	assert.Equal(t, "a\uFFFD", res.Stdout)
	assert.Equal(t, []sandbox.Chunk{
		{Seq: 1, Stream: sandbox.Stdout, Text: "a", Bytes: 3},
		{Seq: 1, Stream: sandbox.Stdout, Text: "\uFFFD"},
	}, rec.chunks)
}

func TestExecuteSignalExit(t *testing.T) {
	f := newFakeServer(t)
	f.on("connect", func(w http.ResponseWriter, r *http.Request, n int) bool {
		streamLines(w, `{"type":"exit","signal":"SIGSEGV"}`)
		return true
	})
	c := newTestClient(t, f)

	res, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"x"}}, nil)

	require.NoError(t, err)
	assert.Equal(t, "SIGSEGV", res.Signal)
	assert.Equal(t, 139, res.ShellExitCode())
	// No file was staged: there is none to remove.
	assert.Equal(t, []string{"createProcess", "connect", "input"}, f.routes())
}

func TestExecuteRetryableTypedErrors(t *testing.T) {
	// A stdin upload the server refuses is an APIError; nothing else is
	// sent but the removal of what may have been staged.
	f := newFakeServer(t)
	f.on("putFile", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusInternalServerError)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.Execute(t.Context(), f.newLease(), sandbox.Command{Argv: []string{"cat"}, Stdin: []byte("stdin-secret")}, nil)

	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.True(t, sandbox.Retryable(err))
	assert.Equal(t, []string{"putFile", "exec"}, f.routes())
	assert.NotContains(t, err.Error(), "stdin-secret")
	assert.False(t, errors.Is(err, context.Canceled))
}

func TestExecuteCancelledBeforeCreateIsNotUnconfirmed(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	_, err := c.Execute(ctx, f.newLease(), sandbox.Command{Argv: []string{"true"}}, nil)

	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, sandbox.ErrorType(err), "the create request was never sent: no cleanup error")
	assert.Empty(t, f.routes())
}
