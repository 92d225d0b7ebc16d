package createos

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

var forkLabels = map[string]string{"sandboxflow-run": "fork-run-1", "sandboxflow-generation": "0"}

// --- ForkLease

func TestForkLease(t *testing.T) {
	f := newFakeServer(t)
	src := f.pausedSource(t)
	c := newTestClient(t, f)

	lease, err := c.ForkLease(t.Context(), src.ID, sandbox.ForkSpec{Labels: forkLabels})

	require.NoError(t, err)
	assert.Equal(t, sandbox.Lease{ID: "sb-2", Status: sandbox.StatusRunning, Workspace: DefaultWorkspace, Labels: forkLabels}, lease)
	content, ok := f.file(lease.ID, DefaultWorkspace+"/f")
	assert.True(t, ok)
	assert.Equal(t, "original", string(content), "the fork's files are a copy of the source's")
	assert.Equal(t, []string{"getSandbox", "listSandboxes", "fork", "getSandbox", "exec"}, f.routes(),
		"the source's state, the forks before, the fork, its wait through forking, its staging directory")
	forks := f.requests("fork")
	require.Len(t, forks, 1)
	assert.JSONEq(t, `{"labels":{"sandboxflow-run":"fork-run-1","sandboxflow-generation":"0"}}`, string(forks[0].Body),
		"egress omitted: the fork inherits the source's")
	assert.Equal(t, "paused", f.sandboxOf(src.ID).status, "the source is left as it was")
}

func TestForkLeaseSendsEgress(t *testing.T) {
	f := newFakeServer(t)
	src := f.pausedSource(t)
	c := newTestClient(t, f)

	lease, err := c.ForkLease(t.Context(), src.ID, sandbox.ForkSpec{Egress: []string{"pypi.org:443"}})

	require.NoError(t, err)
	assert.Equal(t, []string{"pypi.org:443"}, f.sandboxOf(lease.ID).egress)
}

func TestForkLeaseRefusesBeforeSending(t *testing.T) {
	f := newFakeServer(t)
	running := f.newLease()
	c := newTestClient(t, f)

	_, err := c.ForkLease(t.Context(), running.ID, sandbox.ForkSpec{})
	var invalid *sandbox.InvalidInputError
	require.ErrorAs(t, err, &invalid, "a running source")
	assert.Equal(t, "source id", invalid.Field)
	assert.Contains(t, err.Error(), "is running: only a paused sandbox can be forked")

	_, err = c.ForkLease(t.Context(), "sb-404", sandbox.ForkSpec{})
	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone, "a source that does not exist")
	assert.Equal(t, "sb-404", gone.LeaseID)

	for _, spec := range []sandbox.ForkSpec{
		{Egress: []string{"a b"}},
		{Labels: map[string]string{"k=": "v"}},
	} {
		_, err = c.ForkLease(t.Context(), running.ID, spec)
		require.ErrorAs(t, err, &invalid, "%+v", spec)
	}
	_, err = c.ForkLease(t.Context(), "../x", sandbox.ForkSpec{})
	require.ErrorAs(t, err, &invalid)
	assert.Zero(t, f.count("fork"), "no fork was sent")
}

// The fork is made but its answer is lost: the fork is found by its
// labels, and it is the answer; nothing else is made.
func TestForkLeaseLostAnswerIsFoundByItsLabels(t *testing.T) {
	f := newFakeServer(t)
	src := f.pausedSource(t)
	f.on("fork", func(w http.ResponseWriter, r *http.Request, n int) bool {
		f.serveAndLoseAnswer(w, r) // the fork is made
		return true
	})
	c := newTestClient(t, f)

	lease, err := c.ForkLease(t.Context(), src.ID, sandbox.ForkSpec{Labels: forkLabels})

	require.NoError(t, err)
	assert.Equal(t, "sb-2", lease.ID)
	assert.Equal(t, sandbox.StatusRunning, lease.Status)
	assert.Equal(t, 1, f.count("fork"))
	assert.Equal(t, []string{src.ID, lease.ID}, f.ids(), "the source and its one fork")
}

// A fork that settles in a state other than running is gone, and
// destroyed.
func TestForkLeaseThatFailsIsDestroyed(t *testing.T) {
	f := newFakeServer(t)
	src := f.pausedSource(t)
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		id := strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/")
		if id == src.ID {
			return false
		}
		writeData(w, map[string]any{"id": id, "status": "error"})
		return true
	})
	c := newTestClient(t, f)

	_, err := c.ForkLease(t.Context(), src.ID, sandbox.ForkSpec{})

	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, sandbox.LeaseGoneError{LeaseID: "sb-2", Status: sandbox.StatusError}, *gone)
	assert.Equal(t, []string{src.ID}, f.ids(), "the failed fork is destroyed")
}

// --- on the hosted service: no labels

// The answer of a fork is lost on a server without labels: the fork is
// the one new sandbox forked from the source, told from an older fork of
// the same source by the list taken before the request.
func TestHostedLostForkAnswerIsFoundAsTheNewFork(t *testing.T) {
	f := newFakeServerIn(t, dialectHosted)
	src := f.pausedSource(t)
	f.addSandbox("").forkedFrom = src.ID // an older fork
	f.addSandbox("someone-else")
	f.on("fork", func(w http.ResponseWriter, r *http.Request, n int) bool {
		f.serveAndLoseAnswer(w, r)
		return true
	})
	c := newTestClient(t, f)

	lease, err := c.ForkLease(t.Context(), src.ID, sandbox.ForkSpec{Labels: forkLabels})

	require.NoError(t, err)
	assert.Equal(t, "sb_4", lease.ID, "the new fork, not the older one")
	assert.Equal(t, sandbox.StatusRunning, lease.Status)
	assert.Len(t, f.requests("fork"), 1)
	assert.Len(t, f.ids(), 4, "no second fork")
}

// The answer is lost and no fork can be found: one may still appear, so
// the failure is a cleanup error, not retryable, and nothing is sent again.
func TestHostedUnconfirmedForkIsACleanupError(t *testing.T) {
	for name, lose := range map[string]func(f *fakeServer, w http.ResponseWriter){
		// The server may have made it, but it is not listed (yet: still in
		// flight).
		"not listed yet": func(f *fakeServer, w http.ResponseWriter) { loseAnswer(w) },
		"500":            func(f *fakeServer, w http.ResponseWriter) { f.refuse(w, http.StatusInternalServerError, "") },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServerIn(t, dialectHosted)
			src := f.pausedSource(t)
			f.on("fork", func(w http.ResponseWriter, r *http.Request, n int) bool {
				lose(f, w)
				return true
			})
			c := newTestClient(t, f)

			_, err := c.ForkLease(t.Context(), src.ID, sandbox.ForkSpec{})

			var cleanup *sandbox.CleanupError
			require.ErrorAs(t, err, &cleanup)
			assert.Equal(t, sandbox.ForkUnconfirmed, cleanup.Reason)
			assert.Equal(t, src.ID, cleanup.LeaseID, "it names the source")
			assert.True(t, sandbox.IsCleanupError(err))
			assert.False(t, sandbox.Retryable(err))
			assert.Contains(t, err.Error(), "the fork could not be confirmed")
			assert.NotContains(t, err.Error(), bodySecret)
			assert.Len(t, f.requests("fork"), 1)
		})
	}
}

// An answer that proves nothing was made is returned as it is: 409 (the
// source was resumed meanwhile), and 503 (the server did not process it;
// repeated, then retryable).
func TestHostedForkRefusalsAreNotCleanupErrors(t *testing.T) {
	for status, retryable := range map[int]bool{http.StatusConflict: false, http.StatusServiceUnavailable: true} {
		f := newFakeServerIn(t, dialectHosted)
		src := f.pausedSource(t)
		f.on("fork", func(w http.ResponseWriter, r *http.Request, n int) bool {
			w.Header().Set("Retry-After", "0")
			f.refuse(w, status, "NO")
			return true
		})
		c := newTestClient(t, f)

		_, err := c.ForkLease(t.Context(), src.ID, sandbox.ForkSpec{})

		var api *sandbox.APIError
		require.ErrorAs(t, err, &api, "%d", status)
		assert.Equal(t, status, api.Status)
		assert.False(t, sandbox.IsCleanupError(err))
		assert.Equal(t, retryable, sandbox.Retryable(err), "%d", status)
		assert.Len(t, f.requests("listSandboxes"), 1, "%d: the list before the fork, and no lookup after", status)
	}
}

// --- SetEgress

func TestSetEgress(t *testing.T) {
	f := newFakeServer(t)
	lease := f.newLease()
	c := newTestClient(t, f)

	require.NoError(t, c.SetEgress(t.Context(), lease.ID, []string{"pypi.org:443", "10.0.0.0/8"}))
	require.NoError(t, c.SetEgress(t.Context(), lease.ID, nil))

	puts := f.requests("setEgress")
	require.Len(t, puts, 2)
	assert.JSONEq(t, `{"egress":["pypi.org:443","10.0.0.0/8"]}`, string(puts[0].Body))
	assert.JSONEq(t, `{"egress":[]}`, string(puts[1].Body), "none is sent as [], as the official SDKs do")
	assert.Equal(t, "/sandboxes/"+lease.ID+"/egress", puts[0].Path)

	err := c.SetEgress(t.Context(), "sb-404", []string{"*"})
	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone)

	err = c.SetEgress(t.Context(), lease.ID, []string{"ok:1", "bad rule"})
	var invalid *sandbox.InvalidInputError
	require.ErrorAs(t, err, &invalid)
	assert.Equal(t, "egress[1]", invalid.Field)
	assert.Len(t, f.requests("setEgress"), 3, "the bad rules were never sent")
}

func TestHostedSetEgress(t *testing.T) {
	f := newFakeServerIn(t, dialectHosted)
	sb := f.addSandbox("")
	c := newTestClient(t, f)

	require.NoError(t, c.SetEgress(t.Context(), sb.id, []string{"api.example.com:443"}))

	assert.Equal(t, []string{"api.example.com:443"}, f.sandboxOf(sb.id).egress)
}

// --- ingress at create

func TestCreateLeaseSendsIngress(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)

	_, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{Shape: "s-1vcpu-1gb", IngressEnabled: true, Egress: []string{"*"}})
	require.NoError(t, err)
	_, err = c.CreateLease(t.Context(), sandbox.LeaseSpec{Shape: "s-1vcpu-1gb"})
	require.NoError(t, err)

	creates := f.requests("createSandbox")
	require.Len(t, creates, 2)
	var on, off map[string]any
	require.NoError(t, json.Unmarshal(creates[0].Body, &on))
	require.NoError(t, json.Unmarshal(creates[1].Body, &off))
	assert.Equal(t, true, on["ingress_enabled"])
	assert.Equal(t, []any{"*"}, on["egress"])
	assert.Equal(t, false, off["ingress_enabled"])
	assert.NotContains(t, off, "egress")
}
