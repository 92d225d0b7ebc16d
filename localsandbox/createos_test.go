package localsandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// These tests drive the server with the project's real client, over
// loopback: the same pair that `make run` and the integration tests use.

func newClient(t *testing.T, ts *testServer) *createos.Client {
	t.Helper()
	c, err := createos.New(createos.Config{BaseURL: strings.TrimSuffix(ts.base, "/v1"), APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runs counts the managed processes whose command line contains s, on the
// server's side.
func runs(ts *testServer, s string) int {
	n := 0
	for _, r := range ts.srv.History() {
		if !r.Exec && len(r.Argv) > 0 && strings.Contains(strings.Join(r.Argv, " "), s) {
			n++
		}
	}
	return n
}

func TestClientEndToEnd(t *testing.T) {
	ts := startServer(t, Options{})
	c := newClient(t, ts)
	ctx := context.Background()

	lease, err := c.CreateLease(ctx, sandbox.LeaseSpec{Labels: map[string]string{"workflow": "wf-1"}, IdempotencyKey: "wf-1/attempt-1"})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Workspace != "/workspace" || lease.Status != sandbox.StatusRunning {
		t.Errorf("lease %+v", lease)
	}
	again, err := c.CreateLease(ctx, sandbox.LeaseSpec{Labels: map[string]string{"workflow": "wf-1"}, IdempotencyKey: "wf-1/attempt-1"})
	if err != nil || again.ID != lease.ID {
		t.Errorf("a repeated create with the key gave %+v, %v", again, err)
	}

	res, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, nil)
	if err != nil || res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" || res.TimedOut {
		t.Errorf("exit code: %+v, %v", res, err)
	}
	res, err = c.Execute(ctx, lease, sandbox.Command{Argv: []string{"cat"}, Stdin: []byte("from stdin\n")}, nil)
	if err != nil || res.Stdout != "from stdin\n" {
		t.Errorf("stdin: %+v, %v", res, err)
	}
	res, err = c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sh", "-c", `printf '%s|%s' "$A" "$HOME"`}, Env: map[string]string{"A": "it's \"quoted\" $x"}}, nil)
	if err != nil || res.Stdout != `it's "quoted" $x|/workspace` {
		t.Errorf("env: %+v, %v", res, err)
	}
	if _, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"mkdir", "-p", "sub/dir"}}, nil); err != nil {
		t.Fatal(err)
	}
	res, err = c.Execute(ctx, lease, sandbox.Command{Argv: []string{"pwd"}, Cwd: "sub/dir"}, nil)
	if err != nil || res.Stdout != "/workspace/sub/dir\n" {
		t.Errorf("cwd: %+v, %v", res, err)
	}
	res, err = c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sh", "-c", "kill -KILL $$"}}, nil)
	if err != nil || res.Signal != "SIGKILL" {
		t.Errorf("signal: %+v, %v", res, err)
	}

	// A timeout kills the whole tree, grandchildren included.
	res, err = c.Execute(ctx, lease, sandbox.Command{
		Argv:    []string{"sh", "-c", "(setsid sleep 1000 &); echo started; sleep 1000"},
		Timeout: 300 * time.Millisecond,
	}, nil)
	if err != nil || !res.TimedOut || res.Stdout != "started\n" {
		t.Errorf("timeout: %+v, %v", res, err)
	}
	if st, _ := ts.srv.Stats(); st.Processes != 0 {
		t.Errorf("%d processes alive after the timeout", st.Processes)
	}
	if n := runs(ts, "echo started"); n != 1 {
		t.Errorf("the timed-out command ran %d times", n)
	}

	// Output far beyond the journal arrives whole (only its tail is kept).
	var seen int
	res, err = c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' a; echo end"}},
		observer(func(ch sandbox.Chunk) { seen += ch.Bytes }))
	if err != nil || !res.Truncated || !strings.HasSuffix(res.Stdout, "aaa\nend\n"[4:]) || seen != 5000004 {
		t.Errorf("large output: %d bytes seen, truncated %v, err %v", seen, res.Truncated, err)
	}

	// No run left a file: the scripts removed their gates, the client the
	// rest (stdin, the gates of the runs killed or timed out).
	res, err = c.Execute(ctx, lease, sandbox.Command{Argv: []string{"ls", "-A", "/workspace/.sandboxflow"}}, nil)
	if err != nil || res.Stdout != "" {
		t.Errorf("files left in the staging directory: %q, %v", res.Stdout, err)
	}

	leases, err := c.ListLeases(ctx, map[string]string{"workflow": "wf-1"})
	if err != nil || len(leases) != 1 || leases[0].ID != lease.ID {
		t.Errorf("ListLeases: %+v, %v", leases, err)
	}
	if err := c.PauseLease(ctx, lease.ID); err != nil {
		t.Errorf("pause: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got, err := c.GetLease(ctx, lease.ID)
		if err == nil && got.Status == sandbox.StatusPaused {
			break
		}
		if err != nil || got.Status != sandbox.StatusPausing || time.Now().After(deadline) {
			t.Fatalf("after pause: %+v, %v", got, err)
		}
	}
	if err := c.ResumeLease(ctx, lease.ID); err != nil {
		t.Errorf("resume: %v", err)
	}

	if err := c.DestroyLease(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DestroyLease(ctx, lease.ID); err != nil {
		t.Errorf("destroying again: %v", err)
	}
	var gone *sandbox.LeaseGoneError
	if _, err := c.GetLease(ctx, lease.ID); !errors.As(err, &gone) {
		t.Errorf("GetLease after destroy: %v", err)
	}
	if _, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"true"}}, nil); !errors.As(err, &gone) {
		t.Errorf("Execute after destroy: %v", err)
	}
}

func TestClientAttachesToARunningCommandWithoutRerunningIt(t *testing.T) {
	ts := startServer(t, Options{})
	c := newClient(t, ts)
	ctx := context.Background()
	lease, err := c.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DestroyLease(ctx, lease.ID)

	// The first worker detaches after the first line (it "dies").
	script := `echo first; until [ -e /workspace/go-on ]; do sleep 0.01; done; echo second; exit 4`
	runCtx, detach := context.WithCancelCause(ctx)
	rec := &recorder{onOutput: func(sandbox.Chunk) { detach(sandbox.ErrDetached) }}
	if _, err := c.Execute(runCtx, lease, sandbox.Command{Argv: []string{"sh", "-c", script}}, rec); !errors.Is(err, sandbox.ErrDetached) {
		t.Fatalf("detached Execute: %v", err)
	}
	proc := rec.process()
	if proc.ID == "" {
		t.Fatal("no process reported")
	}
	if _, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"touch", "/workspace/go-on"}}, nil); err != nil {
		t.Fatal(err)
	}
	// Another worker attaches.
	res, err := c.Attach(ctx, lease, proc, nil)
	if err != nil || res.ExitCode != 4 || res.Stdout != "first\nsecond\n" {
		t.Errorf("Attach: %+v, %v", res, err)
	}
	if n := runs(ts, "echo second"); n != 1 {
		t.Errorf("the command ran %d times, want once", n)
	}
}

func TestClientConcurrentLeases(t *testing.T) {
	ts := startServer(t, Options{})
	c := newClient(t, ts)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			lease, err := c.CreateLease(ctx, sandbox.LeaseSpec{})
			if err != nil {
				t.Error(err)
				return
			}
			defer c.DestroyLease(ctx, lease.ID)
			for j := range 3 {
				res, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sh", "-c", "echo $0-$1", "x", strings.Repeat("y", i+j)}}, nil)
				if err != nil || res.Stdout != "x-"+strings.Repeat("y", i+j)+"\n" {
					t.Errorf("lease %d command %d: %+v, %v", i, j, res, err)
				}
			}
		})
	}
	wg.Wait()
}

// observer delivers output chunks to f.
type observer func(sandbox.Chunk)

func (observer) Started(sandbox.Process) error { return nil }
func (o observer) Output(c sandbox.Chunk)      { o(c) }

// recorder remembers the process an Execute started.
type recorder struct {
	mu       sync.Mutex
	proc     sandbox.Process
	onOutput func(sandbox.Chunk)
}

func (r *recorder) Started(p sandbox.Process) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proc = p
	return nil
}

func (r *recorder) Output(c sandbox.Chunk) { r.onOutput(c) }

func (r *recorder) process() sandbox.Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}
