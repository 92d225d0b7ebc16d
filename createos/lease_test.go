package createos

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCreateLease(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f, func(cfg *Config) { cfg.Rootfs = "ubuntu-24.04" })

	lease, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{Region: "fra"})

	require.NoError(t, err)
	assert.Equal(t, sandbox.Lease{ID: "sb-1", Status: sandbox.StatusRunning, Workspace: "/workspace"}, lease)
	assert.Equal(t, []string{"createSandbox", "exec"}, f.routes(), "a sandbox created running is not polled")
	var body map[string]any
	require.NoError(t, json.Unmarshal(f.requests("createSandbox")[0].Body, &body))
	assert.Regexp(t, `^sandboxflow--[0-9a-z]+$`, body["name"], "every create is named, for the lookup after a lost answer")
	delete(body, "name")
	assert.Equal(t, map[string]any{"shape": DefaultShape, "rootfs": "ubuntu-24.04", "region": "fra", "ingress_enabled": false}, body)
	var mkdir struct {
		Cmd  string   `json:"cmd"`
		Args []string `json:"args"`
	}
	require.NoError(t, json.Unmarshal(f.requests("exec")[0].Body, &mkdir))
	assert.Equal(t, "mkdir", mkdir.Cmd)
	assert.Equal(t, []string{"-p", "/workspace/.sandboxflow"}, mkdir.Args)
}

func TestCreateLeaseWaitsThroughCreating(t *testing.T) {
	f := newFakeServer(t)
	f.creatingPolls = 3
	f.workspace = "/home/user/work"
	c := newTestClient(t, f)

	lease, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{})

	require.NoError(t, err)
	assert.Equal(t, sandbox.Lease{ID: "sb-1", Status: sandbox.StatusRunning, Workspace: "/home/user/work"}, lease)
	assert.Equal(t, []string{"createSandbox", "getSandbox", "getSandbox", "getSandbox", "exec"}, f.routes())
	assert.Contains(t, string(f.requests("exec")[0].Body), `"/home/user/work/.sandboxflow"`)
}

func TestCreateLeaseSendsIdempotencyKeyAndLabels(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	spec := sandbox.LeaseSpec{
		Shape:          "s-2vcpu-4gb",
		Labels:         map[string]string{"workflow": "wf-1", "attempt": "2"},
		IdempotencyKey: "wf-1/2",
	}

	first, err := c.CreateLease(t.Context(), spec)
	require.NoError(t, err)
	again, err := c.CreateLease(t.Context(), spec)
	require.NoError(t, err)

	assert.Equal(t, first.ID, again.ID, "the server honours the key")
	creates := f.requests("createSandbox")
	require.Len(t, creates, 2)
	assert.Equal(t, "wf-1/2", creates[0].Header.Get("Idempotency-Key"))
	var body struct {
		Shape  string            `json:"shape"`
		Labels map[string]string `json:"labels"`
	}
	require.NoError(t, json.Unmarshal(creates[0].Body, &body))
	assert.Equal(t, "s-2vcpu-4gb", body.Shape)
	assert.Equal(t, spec.Labels, body.Labels)
}

func TestCreateLeaseDestroysASandboxItCannotPrepare(t *testing.T) {
	f := newFakeServer(t)
	f.on("exec", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusServiceUnavailable)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{})

	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusServiceUnavailable, api.Status)
	assert.Equal(t, sandbox.TypeAPI, sandbox.ErrorType(err), "the sandbox was destroyed: no cleanup error")
	assert.Equal(t, []string{"createSandbox", "exec", "exec", "exec", "deleteSandbox"}, f.routes(), "503 means not processed: the exec is tried three times")
	assert.Equal(t, "/sandboxes/sb-1", f.requests("deleteSandbox")[0].Path)
}

func TestCreateLeaseCleanupUnconfirmed(t *testing.T) {
	f := newFakeServer(t)
	f.on("exec", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusServiceUnavailable)
		return true
	})
	f.on("deleteSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusInternalServerError)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{})

	var cleanup *sandbox.CleanupError
	require.ErrorAs(t, err, &cleanup)
	assert.Equal(t, sandbox.TerminationUnconfirmed, cleanup.Reason)
	assert.Equal(t, "sb-1", cleanup.LeaseID, "the error names the sandbox that may remain")
	assert.Contains(t, err.Error(), "sandbox sb-1")
	assert.Contains(t, err.Error(), "unconfirmed")
	var api *sandbox.APIError
	require.ErrorAs(t, err, &api, "the first failure stays reachable")
	assert.Equal(t, http.StatusServiceUnavailable, api.Status)
	assert.NotContains(t, err.Error(), bodySecret)
}

func TestCreateLeaseThatFailsToRun(t *testing.T) {
	f := newFakeServer(t)
	f.creatingPolls = 1
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		writeData(w, map[string]any{"id": "sb-1", "status": "failed"})
		return true
	})
	c := newTestClient(t, f)

	_, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{})

	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, sandbox.LeaseGoneError{LeaseID: "sb-1", Status: sandbox.StatusFailed}, *gone)
	assert.Equal(t, []string{"createSandbox", "getSandbox", "deleteSandbox"}, f.routes())
}

func TestCreateLeaseReadyTimeout(t *testing.T) {
	f := newFakeServer(t)
	f.creatingPolls = 1 << 30 // never runs
	c := newTestClient(t, f, func(cfg *Config) { cfg.ReadyTimeout = 30 * time.Millisecond })

	_, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{})

	var unavailable *sandbox.UnavailableError
	require.ErrorAs(t, err, &unavailable)
	assert.ErrorIs(t, err, errNotReady)
	assert.True(t, sandbox.Retryable(err))
	assert.Equal(t, 1, f.count("deleteSandbox"))
}

func TestCreateLeaseRejectsBadSpec(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	for name, spec := range map[string]sandbox.LeaseSpec{
		"label key with =":      {Labels: map[string]string{"a=b": "c"}},
		"empty label key":       {Labels: map[string]string{"": "c"}},
		"newline in label":      {Labels: map[string]string{"a": "b\nc"}},
		"newline in the key":    {IdempotencyKey: "k\r\nX-Evil: 1"},
		"six labels":            {Labels: map[string]string{"a": "", "b": "", "c": "", "d": "", "e": "", "f": ""}},
		"bad env name":          {Env: map[string]string{"BAD;KEY": "x"}},
		"secret without source": {SecretEnv: map[string]string{"TOKEN": "deploy-token"}},
		"upper-case prefix":     {NamePrefix: "Team"},
		"double hyphen":         {NamePrefix: "a--b"},
		"auto pause too short":  {AutoPauseAfter: 59 * time.Second},
		"negative disk":         {DiskMiB: -1},
		"empty egress rule":     {Egress: []string{""}},
	} {
		_, err := c.CreateLease(t.Context(), spec)
		var invalid *sandbox.InvalidInputError
		assert.ErrorAs(t, err, &invalid, name)
	}
	assert.Empty(t, f.routes())
}

func TestGetLease(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	lease := f.newLease()

	got, err := c.GetLease(t.Context(), lease.ID)
	require.NoError(t, err)
	assert.Equal(t, lease, got)

	_, err = c.GetLease(t.Context(), "sb-404")
	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, "sb-404", gone.LeaseID)

	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		switch n {
		case 3:
			writeData(w, map[string]any{"id": "sb-1", "status": "destroyed"})
		case 4:
			writeData(w, map[string]any{"id": "sb-2", "status": "running"})
		case 5:
			writeData(w, map[string]any{"id": "sb-1", "status": "sleeping"})
		default:
			w.Write([]byte(`{"status":"success","data":[]}`))
		}
		return true
	})
	_, err = c.GetLease(t.Context(), lease.ID)
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, sandbox.StatusDestroyed, gone.Status)

	for range 3 { // another id, an unknown state, a data that is no object
		_, err = c.GetLease(t.Context(), lease.ID)
		var protocol *sandbox.ProtocolError
		require.ErrorAs(t, err, &protocol)
		assert.Equal(t, sandbox.InvalidResponse, protocol.Kind)
	}

	_, err = c.GetLease(t.Context(), "sb/../x")
	var invalid *sandbox.InvalidInputError
	require.ErrorAs(t, err, &invalid)
	assert.Equal(t, 6, f.count(""), "the invalid id was not sent")
}

func TestDestroyLease(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	lease := f.newLease()

	require.NoError(t, c.DestroyLease(t.Context(), lease.ID))
	require.NoError(t, c.DestroyLease(t.Context(), lease.ID), "already gone is success")

	f.on("deleteSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusBadGateway)
		return true
	})
	err := c.DestroyLease(t.Context(), lease.ID)
	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.True(t, sandbox.Retryable(err))
	assert.Equal(t, 2+3, f.count("deleteSandbox"), "a DELETE answered 502 is tried three times")
}

func TestListLeases(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	mine, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{Labels: map[string]string{"workflow": "wf-1", "attempt": "1"}})
	require.NoError(t, err)
	_, err = c.CreateLease(t.Context(), sandbox.LeaseSpec{Labels: map[string]string{"workflow": "wf-2"}})
	require.NoError(t, err)

	leases, err := c.ListLeases(t.Context(), map[string]string{"workflow": "wf-1", "attempt": "1"})

	require.NoError(t, err)
	require.Len(t, leases, 1)
	assert.Equal(t, mine.ID, leases[0].ID)
	assert.Equal(t, "wf-1", leases[0].Labels["workflow"])
	lists := f.requests("listSandboxes")
	require.Len(t, lists, 1)
	assert.Equal(t, []string{"attempt=1", "workflow=wf-1"}, lists[0].Query["label"])
	assert.Equal(t, "500", lists[0].Query.Get("limit"))

	// The labels are the view's, not those asked for (the name carries
	// only a hash of those).
	leases, err = c.ListLeases(t.Context(), map[string]string{"workflow": "wf-1"})
	require.NoError(t, err)
	require.Len(t, leases, 1)
	assert.Equal(t, map[string]string{"workflow": "wf-1", "attempt": "1"}, leases[0].Labels)
}

func TestListLeasesFiltersWhatTheServerIgnores(t *testing.T) {
	f := newFakeServer(t)
	f.on("listSandboxes", func(w http.ResponseWriter, r *http.Request, n int) bool {
		// A server without the label filter lists everything, and reports
		// labels for some sandboxes only.
		writeData(w, map[string]any{"sandboxes": []map[string]any{
			{"id": "sb-mine", "status": "running", "labels": map[string]string{"workflow": "wf-1"}},
			{"id": "sb-other", "status": "running", "labels": map[string]string{"workflow": "wf-2"}},
			{"id": "sb-unlabelled", "status": "running"},
		}})
		return true
	})
	c := newTestClient(t, f)

	leases, err := c.ListLeases(t.Context(), map[string]string{"workflow": "wf-1"})

	require.NoError(t, err)
	require.Len(t, leases, 1)
	assert.Equal(t, "sb-mine", leases[0].ID)
}

func TestPauseAndResumeLease(t *testing.T) {
	f := newFakeServer(t)
	c := newTestClient(t, f)
	lease := f.newLease()

	require.NoError(t, c.PauseLease(t.Context(), lease.ID))
	got, err := c.GetLease(t.Context(), lease.ID)
	require.NoError(t, err)
	assert.Equal(t, sandbox.StatusPaused, got.Status)
	require.NoError(t, c.ResumeLease(t.Context(), lease.ID))

	conflict := func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusConflict)
		return true
	}
	f.on("pause", conflict)
	f.on("resume", conflict)
	// A 409 while the sandbox is (now) running: resume succeeded anyway,
	// pause did not.
	require.NoError(t, c.ResumeLease(t.Context(), lease.ID))
	err = c.PauseLease(t.Context(), lease.ID)
	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusConflict, api.Status)

	err = c.PauseLease(t.Context(), "sb-404")
	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone)
}

// The same lease path on both servers: the client finds its leases by
// their labels on sandboxd and by their names on the hosted service, and
// reads the list whole or page by page.
func TestLeasePathInEachDialect(t *testing.T) {
	for name, dialect := range map[string]fakeDialect{"sandboxd": dialectSandboxd, "hosted": dialectHosted} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServerIn(t, dialect)
			others := []string{f.addSandbox("").id, f.addSandbox("").id, f.addSandbox("").id}
			f.program = func(p *fakeProc) { p.write("stdout", "ok\n"); p.exit(0) }
			c := newTestClient(t, f)
			spec := runSpec("run-1", 0)

			lease, err := c.CreateLease(t.Context(), spec)
			require.NoError(t, err)
			res, err := c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"true"}}, nil)
			require.NoError(t, err)
			assert.Equal(t, "ok\n", res.Stdout)
			leases, err := c.ListLeases(t.Context(), map[string]string{"sandboxflow-run": "run-1"})
			require.NoError(t, err)
			require.Len(t, leases, 1)
			assert.Equal(t, lease.ID, leases[0].ID)
			if dialect.labels {
				assert.Equal(t, spec.Labels, leases[0].Labels, "the view's labels")
			} else {
				assert.Equal(t, map[string]string{"sandboxflow-run": "run-1"}, leases[0].Labels, "those asked for, which the name carries")
			}
			require.NoError(t, c.DestroyLease(t.Context(), lease.ID))

			assert.Equal(t, others, f.ids(), "nothing leaked; nobody else's was touched")
			assert.Equal(t, 1, f.count("createProcess"), "the command ran once")
		})
	}
}
