package createos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The client on the hosted service (the fake in dialectHosted): no labels,
// no Idempotency-Key, a create held until its sandbox runs, paginated
// lists. The proof first: the whole lease/execute/sweep path.

// staticSecrets is a Secrets of fixed values.
type staticSecrets map[string]string

func (s staticSecrets) Secret(_ context.Context, name string) (string, error) {
	v, ok := s[name]
	if !ok {
		return "", fmt.Errorf("secret %q is not set", name)
	}
	return v, nil
}

// runSpec is a lease of a run as the activities ask for it: labelled with
// the run and generation, under an idempotency key derived from them.
func runSpec(run string, generation int) sandbox.LeaseSpec {
	gen := strconv.Itoa(generation)
	return sandbox.LeaseSpec{
		Labels:         map[string]string{"sandboxflow-run": run, "sandboxflow-generation": gen, "sandboxflow-workflow-id": "wf-" + run},
		IdempotencyKey: "sandboxflow-" + run + "-" + gen,
	}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func TestHostedLeaseExecuteAndSweep(t *testing.T) {
	f := newFakeServerIn(t, dialectHosted)
	others := []string{f.addSandbox("someone-else").id, f.addSandbox("").id, f.addSandbox("").id}
	c := newTestClient(t, f, func(cfg *Config) { cfg.Secrets = staticSecrets{"deploy-token": "secret-value-9d"} })
	spec := runSpec("run-1", 0)
	spec.NamePrefix = "ci"
	spec.Env = map[string]string{"MODE": "test"}
	spec.SecretEnv = map[string]string{"TOKEN": "deploy-token"}
	spec.Egress = []string{"api.example.com:443"}
	spec.DiskMiB = 8192
	spec.AutoPauseAfter = 10 * time.Minute

	lease, err := c.CreateLease(t.Context(), spec)

	require.NoError(t, err)
	assert.Equal(t, sandbox.Lease{ID: "sb_4", Status: sandbox.StatusRunning, Workspace: DefaultWorkspace}, lease)
	creates := f.requests("createSandbox")
	require.Len(t, creates, 1)
	var body map[string]any
	require.NoError(t, json.Unmarshal(creates[0].Body, &body))
	name, _ := body["name"].(string)
	assert.Regexp(t, dnsLabel, name)
	assert.True(t, strings.HasPrefix(name, "ci--"), name)
	assert.Equal(t, createName("ci", spec.Labels, spec.IdempotencyKey), name, "the name is deterministic")
	assert.Equal(t, map[string]any{"MODE": "test", "TOKEN": "secret-value-9d"}, body["envs"], "the secret is resolved just before the create")
	assert.Equal(t, []any{"api.example.com:443"}, body["egress"])
	assert.Equal(t, 8192.0, body["disk_mib"])
	assert.Equal(t, 600.0, body["auto_pause_after_seconds"])
	for _, rq := range f.requests("") {
		if rq.Method == http.MethodGet {
			assert.NotContains(t, fmt.Sprint(rq), "secret-value-9d")
		}
	}

	f.program = func(p *fakeProc) { p.write("stdout", "hosted\n"); p.exit(0) }
	res, err := c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"echo", "hi"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, sandbox.Result{ProcessID: "proc_5", ExitCode: 0, Stdout: "hosted\n"}, res)

	// A held command: its wait is answered with the running process at the
	// timeout, which is not an exit.
	f.program = func(p *fakeProc) { p.write("stdout", "held\n") }
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	held, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sleep", "600"}, Timeout: 50 * time.Millisecond}, nil)
	cancel()
	require.NoError(t, err)
	assert.True(t, held.TimedOut)
	assert.Equal(t, "held\n", held.Stdout)

	next, err := c.CreateLease(t.Context(), runSpec("run-1", 1))
	require.NoError(t, err)
	other, err := c.CreateLease(t.Context(), runSpec("run-2", 0))
	require.NoError(t, err)

	// The release sweep: the run's leases are found by their names.
	leases, err := c.ListLeases(t.Context(), map[string]string{"sandboxflow-run": "run-1"})
	require.NoError(t, err)
	var ids []string
	for _, l := range leases {
		ids = append(ids, l.ID)
		assert.Equal(t, "run-1", l.Labels["sandboxflow-run"])
	}
	assert.Equal(t, []string{lease.ID, next.ID}, ids)
	var offsets []string
	for _, rq := range f.requests("listSandboxes") {
		offsets = append(offsets, rq.Query["offset"][0])
	}
	assert.Equal(t, []string{"0", "2", "4"}, offsets, "every page of 2")
	for _, l := range leases {
		require.NoError(t, c.DestroyLease(t.Context(), l.ID))
	}

	_, err = c.GetLease(t.Context(), lease.ID)
	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone, "a GET right after a destroy reads destroying")
	assert.Equal(t, sandbox.StatusDestroying, gone.Status)
	_, err = c.GetLease(t.Context(), lease.ID)
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, sandbox.StatusDestroyed, gone.Status)
	leases, err = c.ListLeases(t.Context(), map[string]string{"sandboxflow-run": "run-1"})
	require.NoError(t, err)
	for _, l := range leases {
		assert.True(t, l.Status.Terminal(), "%s is %s", l.ID, l.Status)
	}
	assert.Equal(t, append(others, other.ID), f.ids(), "nothing of run-1 is left; nobody else's was touched")
}

// The create's answer is lost after the sandbox was made: the same call
// finds it by its name; so does a repeat of the create (409: the name is
// taken). Nothing is left that the client does not know of.
func TestHostedLostCreateResponse(t *testing.T) {
	f := newFakeServerIn(t, dialectHosted)
	other := f.addSandbox("someone-else").id
	f.on("createSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n == 1 {
			f.serveAndLoseAnswer(w, r) // the sandbox is made and runs
			return true
		}
		return false
	})
	c := newTestClient(t, f)
	spec := runSpec("run-1", 0)

	lease, err := c.CreateLease(t.Context(), spec)

	require.NoError(t, err, "found by name")
	assert.Equal(t, sandbox.Lease{ID: "sb_2", Status: sandbox.StatusRunning, Workspace: DefaultWorkspace}, lease,
		"the sandbox whose answer was lost")
	// net/http itself may send the POST again on the reused connection (it
	// carries an Idempotency-Key); the hosted service ignores the key, and
	// the taken name (409) leads to the same lookup.
	posts := len(f.requests("createSandbox"))
	assert.Equal(t, []string{other, lease.ID}, f.ids())

	// The activity's retry, had the first attempt given up before it
	// looked: the name is taken, and finding it is the answer.
	again, err := c.CreateLease(t.Context(), spec)
	require.NoError(t, err)
	assert.Equal(t, lease.ID, again.ID)
	assert.Len(t, f.requests("createSandbox"), posts+1)
	assert.Equal(t, []string{other, lease.ID}, f.ids(), "no second sandbox")

	leases, err := c.ListLeases(t.Context(), map[string]string{"sandboxflow-run": "run-1"})
	require.NoError(t, err)
	require.Len(t, leases, 1)
	require.NoError(t, c.DestroyLease(t.Context(), leases[0].ID))
	assert.Equal(t, []string{other}, f.ids(), "nothing leaked")
}

// The hosted service holds a create until the sandbox runs; one that
// outlasts CreateTimeout is given up, and the sandbox, still booting, is
// found by its name and waited for.
func TestHostedCreateOutlastsItsBudget(t *testing.T) {
	f := newFakeServerIn(t, dialectHosted)
	booting, lookedUp := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.boot = func(*fakeSandbox) {
		close(booting)
		<-lookedUp // the boot ends only once the client gave up and looks
	}
	f.on("listSandboxes", func(http.ResponseWriter, *http.Request, int) bool {
		select {
		case <-booting:
			once.Do(func() { close(lookedUp) })
		default:
		}
		return false
	})
	c := newTestClient(t, f, func(cfg *Config) { cfg.CreateTimeout = 50 * time.Millisecond })

	lease, err := c.CreateLease(t.Context(), runSpec("run-1", 0))

	require.NoError(t, err)
	assert.Equal(t, sandbox.StatusRunning, lease.Status)
	assert.Len(t, f.requests("createSandbox"), 1)
	assert.Equal(t, []string{lease.ID}, f.ids())
}

// A name that the lookup finds destroyed is a gone lease, naming the
// sandbox, so that the caller creates the next one under another key (and
// so another name), as activities.create does.
func TestHostedNameOfAGoneSandbox(t *testing.T) {
	for _, hideGone := range []bool{false, true} {
		t.Run(fmt.Sprintf("gone ones listed: %v", !hideGone), func(t *testing.T) { nameOfAGoneSandbox(t, hideGone) })
	}
}

func nameOfAGoneSandbox(t *testing.T, hideGone bool) {
	f := newFakeServerIn(t, dialectHosted)
	f.hideGone = hideGone
	spec := runSpec("run-1", 0)
	gone := f.addSandbox(createName("", spec.Labels, spec.IdempotencyKey))
	gone.status = "destroyed"
	c := newTestClient(t, f)

	_, err := c.CreateLease(t.Context(), spec)

	var goneErr *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &goneErr)
	assert.Equal(t, sandbox.LeaseGoneError{LeaseID: gone.id, Status: sandbox.StatusDestroyed}, *goneErr)

	spec.IdempotencyKey += "/" + gone.id
	lease, err := c.CreateLease(t.Context(), spec)
	require.NoError(t, err)
	assert.NotEqual(t, gone.id, lease.ID)
}

func TestHostedFailures(t *testing.T) {
	t.Run("no credit", func(t *testing.T) {
		f := newFakeServerIn(t, dialectHosted)
		f.on("createSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
			f.refuse(w, http.StatusPaymentRequired, "INSUFFICIENT_CREDIT")
			return true
		})
		c := newTestClient(t, f)

		_, err := c.CreateLease(t.Context(), runSpec("run-1", 0))

		var payment *sandbox.PaymentRequiredError
		require.ErrorAs(t, err, &payment)
		assert.Equal(t, sandbox.PaymentRequiredError{Operation: "create sandbox", Code: "INSUFFICIENT_CREDIT", RequestID: "req-1"}, *payment)
		assert.Equal(t, "create sandbox: HTTP 402 payment required INSUFFICIENT_CREDIT (request req-1)", err.Error())
		assert.False(t, sandbox.Retryable(err))
		assert.Len(t, f.requests("createSandbox"), 1)
		assert.Empty(t, f.requests("listSandboxes"), "402 proves nothing was created: no lookup")
		assert.Empty(t, f.ids())
	})
	t.Run("no capacity, then capacity", func(t *testing.T) {
		f := newFakeServerIn(t, dialectHosted)
		f.on("createSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
			if n > 2 {
				return false
			}
			w.Header().Set("Retry-After", "0")
			f.refuse(w, []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}[n-1], "NO_CAPACITY")
			return true
		})
		c := newTestClient(t, f, func(cfg *Config) {})
		c.retryBase = time.Hour // only Retry-After lets the repeats happen

		lease, err := c.CreateLease(t.Context(), runSpec("run-1", 0))

		require.NoError(t, err)
		assert.Len(t, f.requests("createSandbox"), 3, "429 and 503 mean the server did not process the create")
		assert.Equal(t, []string{lease.ID}, f.ids())
	})
	t.Run("unknown sandbox", func(t *testing.T) {
		f := newFakeServerIn(t, dialectHosted)
		c := newTestClient(t, f)

		_, err := c.GetLease(t.Context(), "sb_404")

		var gone *sandbox.LeaseGoneError
		require.ErrorAs(t, err, &gone)
	})
}

func TestHostedStates(t *testing.T) {
	f := newFakeServerIn(t, dialectHosted)
	c := newTestClient(t, f)
	for status, gone := range map[string]bool{
		"creating": false, "running": false, "pausing": false, "paused": false, "resuming": false,
		"forking": false, "error": false, "failed": true, "destroying": true, "destroyed": true,
	} {
		sb := f.addSandbox("")
		sb.status = status
		lease, err := c.GetLease(t.Context(), sb.id)
		if gone {
			var goneErr *sandbox.LeaseGoneError
			require.ErrorAs(t, err, &goneErr, status)
			assert.Equal(t, sandbox.LeaseStatus(status), goneErr.Status)
			continue
		}
		require.NoError(t, err, status)
		assert.Equal(t, sandbox.LeaseStatus(status), lease.Status)
	}
}

// A lease this client did not create has no staging directory, and the
// hosted service does not make a file's parents: the upload is refused,
// the directory made, and the upload sent again.
func TestHostedStagingDirectoryOfALeaseCreatedElsewhere(t *testing.T) {
	f := newFakeServerIn(t, dialectHosted)
	sb := f.addSandbox("made-elsewhere")
	f.program = func(p *fakeProc) { p.write("stdout", "ok\n"); p.exit(0) }
	c := newTestClient(t, f)
	lease, err := c.GetLease(t.Context(), sb.id)
	require.NoError(t, err)

	res, err := c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"cat"}, Stdin: []byte("in")}, nil)

	require.NoError(t, err)
	assert.Equal(t, "ok\n", res.Stdout)
	puts := f.requests("putFile")
	require.Len(t, puts, 2, "the stdin twice (refused, then sent)")
	assert.Equal(t, puts[0].Query["path"], puts[1].Query["path"])
	execs := f.requests("exec")
	require.NotEmpty(t, execs)
	assert.Contains(t, string(execs[0].Body), `"mkdir"`)
}
