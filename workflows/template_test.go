package workflows

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// templateProvider is the mock Provider with a scripted TemplateBuilder
// that counts its calls.
type templateProvider struct {
	*sandboxmock.MockProvider
	builds *int
	result func(ctx context.Context, spec sandbox.TemplateSpec) (sandbox.Template, error)
}

func (p templateProvider) EnsureTemplate(ctx context.Context, spec sandbox.TemplateSpec, onLog func(string)) (sandbox.Template, error) {
	*p.builds++
	onLog("step 1")
	return p.result(ctx, spec)
}

// newTemplateHarness is newHarness over a provider that builds templates.
func newTemplateHarness(t *testing.T, result func(context.Context, sandbox.TemplateSpec) (sandbox.Template, error)) (*harness, *int) {
	var suite testsuite.WorkflowTestSuite
	h := &harness{env: suite.NewTestWorkflowEnvironment(), provider: sandboxmock.NewMockProvider(gomock.NewController(t))}
	builds := new(int)
	RegisterWorkflows(h.env)
	(&activities.Activities{Provider: templateProvider{MockProvider: h.provider, builds: builds, result: result},
		Heartbeats: activities.TestEnvironmentHeartbeats{}}).Register(h.env)
	return h, builds
}

const bakedDockerfile = "FROM devbox:1\nRUN echo baked > /opt/baked\n"

// buildsBaked is a build of bakedDockerfile into the template tpl-7.
func buildsBaked(t *testing.T) func(context.Context, sandbox.TemplateSpec) (sandbox.Template, error) {
	return func(_ context.Context, spec sandbox.TemplateSpec) (sandbox.Template, error) {
		assert.Equal(t, bakedDockerfile, spec.Dockerfile)
		return sandbox.Template{ID: "tpl-7", Name: spec.Name()}, nil
	}
}

// failsToBuild is a build whose RUN fails.
func failsToBuild(_ context.Context, spec sandbox.TemplateSpec) (sandbox.Template, error) {
	return sandbox.Template{}, &sandbox.TemplateBuildError{TemplateID: "tpl-7", Name: spec.Name(), LogTail: "line 2: RUN false: exited with code 1\n"}
}

// expectLeaseOnTheTemplate expects the one lease, sbx-1, made on tpl-7.
func (h *harness) expectLeaseOnTheTemplate(t *testing.T) {
	h.provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
			assert.Equal(t, "tpl-7", spec.Rootfs, "the lease runs on the template")
			return sandbox.Lease{ID: "sbx-1", Status: sandbox.StatusRunning, Workspace: "/workspace", Labels: spec.Labels}, nil
		})
}

// A request with a Dockerfile builds its template first, then creates
// its lease on it.
func TestRunCommandCreatesTheLeaseOnTheDockerfilesTemplate(t *testing.T) {
	h, builds := newTemplateHarness(t, buildsBaked(t))
	h.expectNoOrphans()
	h.expectLeaseOnTheTemplate(t)
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).Return(sandbox.Result{ProcessID: "p1", Stdout: "baked\n"}, nil)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)

	req := request("cat", "/opt/baked")
	req.Dockerfile = bakedDockerfile
	res, err := h.run(req)
	require.NoError(t, err)
	assert.Equal(t, "baked\n", res.Stdout)
	assert.Equal(t, 1, *builds)
}

// A failed build fails the run with its typed failure and the log's
// tail, before any lease is created (the mock fails on any lease call).
func TestRunCommandFailsTypedWhenTheTemplateFailsToBuild(t *testing.T) {
	h, builds := newTemplateHarness(t, failsToBuild)
	req := request("true")
	req.Dockerfile = "FROM devbox:1\nRUN false\n"
	_, err := h.run(req)
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeTemplateBuildFailed, appErr.Type())
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	assert.Equal(t, "line 2: RUN false: exited with code 1\n", d.LogTail)
	assert.Equal(t, 1, *builds, "not retried: the Dockerfile is at fault")
	assert.Equal(t, PhaseFailed, h.queryState(t).Phase)
}

// A run given a lease (LeaseID) whose template fails to build releases
// that lease, as any failed run does, and fails typed.
func TestRunCommandReleasesItsGivenLeaseWhenTheTemplateFailsToBuild(t *testing.T) {
	h, builds := newTemplateHarness(t, failsToBuild)
	h.expectNoOrphans()
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-9").Return(nil)
	req := request("true")
	req.Dockerfile, req.LeaseID = "FROM devbox:1\nRUN false\n", "sbx-9"
	_, err := h.run(req)
	assert.Equal(t, sandbox.TypeTemplateBuildFailed, applicationErrorType(err))
	assert.Equal(t, 1, *builds)
	assert.Equal(t, PhaseFailed, h.queryState(t).Phase)
}

// A Dockerfile with a rootfs, or over the bound, fails as invalid input
// before any activity.
func TestRunCommandRefusesABadDockerfileBeforeAnyActivity(t *testing.T) {
	for name, req := range map[string]Request{
		"with rootfs": {Command: sandbox.Command{Argv: []string{"true"}}, Lease: sandbox.LeaseSpec{Rootfs: "devbox:1"}, Image: Image{Dockerfile: bakedDockerfile}},
		"too big":     {Command: sandbox.Command{Argv: []string{"true"}}, Image: Image{Dockerfile: strings.Repeat("#", sandbox.MaxDockerfileBytes+1)}},
	} {
		t.Run(name, func(t *testing.T) {
			h, builds := newTemplateHarness(t, nil)
			_, err := h.run(req)
			assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			var d sandbox.FailureDetails
			require.NoError(t, appErr.Details(&d))
			assert.Equal(t, "dockerfile", d.Field)
			assert.Zero(t, *builds)
		})
	}
}

// A session request with a Dockerfile, or with one and a rootfs, is
// checked as RunCommand's: invalid input, before any activity.
func TestSessionRefusesABadDockerfileBeforeAnyActivity(t *testing.T) {
	h, builds := newTemplateHarness(t, nil)
	req := sessionRequest()
	req.Lease.Rootfs, req.Dockerfile = "devbox:1", bakedDockerfile
	_, err := h.runSession(req)
	assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
	assert.Zero(t, *builds)
}

// A session with a Dockerfile builds its template before its first lease,
// once, and makes every lease on it; the run it continues as names the
// template and builds nothing.
func TestSessionStartsItsLeasesOnItsDockerfilesTemplate(t *testing.T) {
	h, builds := newTemplateHarness(t, buildsBaked(t))
	h.expectNoOrphans()
	h.expectLeaseOnTheTemplate(t)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute)
	u := &updates{h: h}
	// Sent as the session starts, while its template builds: the Update
	// waits for it, it is not refused for want of a handler.
	got := u.send(0, execCall("one"))
	req := sessionRequest()
	req.Dockerfile = bakedDockerfile
	req.CommandsPerRun = 1
	_, err := h.runSession(req)
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, err, &can)
	var next SessionRequest
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	var one SessionResult
	got[0].decode(t, &one)
	assert.Equal(t, "sbx-1", one.LeaseID)
	assert.Equal(t, 1, *builds)
	assert.Equal(t, "tpl-7", next.Lease.Rootfs)
	assert.Empty(t, next.Dockerfile, "the next run builds nothing")
	require.NoError(t, next.Validate())
}

// A session whose template fails to build fails typed, before any lease.
func TestSessionFailsTypedWhenItsTemplateFailsToBuild(t *testing.T) {
	h, _ := newTemplateHarness(t, failsToBuild)
	req := sessionRequest()
	req.Dockerfile = "FROM devbox:1\nRUN false\n"
	_, err := h.runSession(req)
	assert.Equal(t, sandbox.TypeTemplateBuildFailed, applicationErrorType(err))
}

// On a fleet, the template is built once, on whichever host takes the
// build, and every lease of the run — the first and a fresh one that
// compensation takes — is made on that host, which alone keeps it.
func TestOnAFleetTheTemplateIsBuiltOnceAndEveryLeaseIsMadeOnItsHost(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	f.expectTemplate("h2")
	f.cleanupFails["sbx-1"] = true
	req := request("true")
	req.Dockerfile = bakedDockerfile
	res, err := f.run(req)
	require.NoError(t, err)
	assert.Equal(t, "on h2", res.Stdout)
	assert.Equal(t, []string{
		activities.NameEnsureTemplate + " @" + placementQueue,
		activities.NameCreateLease + " sbx-1@" + h2Queue,
		activities.NameExecute + " sbx-1@" + h2Queue,
		activities.NameDestroyLease + " sbx-1@" + h2Queue,
		activities.NameAcquireFreshLease + " sbx-2@" + h2Queue,
		activities.NameExecute + " sbx-2@" + h2Queue,
		activities.NameDestroyLease + " sbx-2@" + h2Queue,
	}, f.calls)
	assert.Equal(t, []string{"tpl-7", "tpl-7"}, f.rootfs)
}

// On a fleet, a run whose template's host is lost fails as compensation
// does, typed, after trying that host only; its release sweeps there too.
func TestOnAFleetALostTemplateHostExhaustsCompensationTyped(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	f.expectTemplate("h2")
	f.loseHost("h2")
	req := request("true")
	req.Dockerfile = bakedDockerfile
	req.MaxFreshLeases = 1
	_, err := f.run(req)
	require.True(t, IsCompensationExhausted(err), "%v", err)
	assert.True(t, sandbox.IsHostLostError(errors.Unwrap(unwrapApplication(t, err))), "it wraps the host's loss: %v", err)
	assert.Equal(t, []string{
		activities.NameEnsureTemplate + " @" + placementQueue,
		activities.NameCreateLease + " @" + h2Queue,
		activities.NameAcquireFreshLease + " @" + h2Queue,
		activities.NameDestroyLease + " @" + h2Queue, // the release's sweep
	}, f.calls)
}

// A session on a fleet carries its template's host across continue-as-new:
// the next run's fresh lease is made there too.
func TestASessionOnAFleetCarriesItsTemplatesHost(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	f.expectTemplate("h2")
	u := &updates{h: &harness{env: f.env}}
	u.send(time.Second, execCall("one"))
	req := sessionRequest()
	req.Dockerfile = bakedDockerfile
	req.CommandsPerRun = 1
	f.env.ExecuteWorkflow(SessionWorkflow, req)
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, f.env.GetWorkflowError(), &can)
	var next SessionRequest
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	assert.Equal(t, "h2", next.Carried.TemplateHost)
	assert.Equal(t, "tpl-7", next.Lease.Rootfs)

	// The next run loses its lease: the fresh one is made on h2 again.
	f2 := newFleet(t, "h1", "h2")
	f2.cleanupFails["sbx-1"] = true
	f2.placed = 1 // sbx-1 was the first run's
	u2 := &updates{h: &harness{env: f2.env}, n: 10}
	got := u2.send(time.Second, execCall("two"), closeCall)
	f2.env.ExecuteWorkflow(SessionWorkflow, next)
	require.NoError(t, f2.env.GetWorkflowError())
	var two SessionResult
	got[0].decode(t, &two)
	assert.Equal(t, "on h2", two.Stdout)
	assert.Equal(t, []string{
		activities.NameExecute + " sbx-1@" + h2Queue,
		activities.NameDestroyLease + " sbx-1@" + h2Queue,
		activities.NameAcquireFreshLease + " sbx-2@" + h2Queue,
		activities.NameExecute + " sbx-2@" + h2Queue,
		activities.NameDestroyLease + " sbx-2@" + h2Queue,
	}, f2.calls)
}

// A fork of a session on a fleet keeps making its leases on the template's
// host: the forked session's fresh lease is made there too.
func TestASessionsForkOnAFleetMakesItsLeasesOnTheTemplatesHost(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	f.expectTemplate("h2")
	f.cleanupFails["sbx-fork"] = true
	u := &updates{h: &harness{env: f.env}}
	got := u.send(time.Second, execCall("one"), updateCall{name: UpdateFork})
	var forkRan, forkClosed updateOutcome
	f.env.RegisterDelayedCallback(func() {
		var fork SessionFork
		got[1].decode(t, &fork)
		require.NoError(t, f.env.UpdateWorkflowByID(fork.SessionID, UpdateExecute, "fork-exec", forkRan.callback(), SessionCommand{Command: sandbox.Command{Argv: []string{"two"}}}))
		require.NoError(t, f.env.UpdateWorkflowByID(fork.SessionID, UpdateClose, "fork-close", forkClosed.callback()))
	}, 1200*time.Millisecond)
	u.send(2*time.Second, closeCall)
	req := sessionRequest()
	req.Dockerfile = bakedDockerfile
	f.env.ExecuteWorkflow(SessionWorkflow, req)
	require.True(t, f.env.IsWorkflowCompleted())
	require.NoError(t, f.env.GetWorkflowError())

	var two SessionResult
	forkRan.decode(t, &two)
	assert.Equal(t, "on h2", two.Stdout)
	assert.Contains(t, f.calls, activities.NameAcquireFreshLease+" sbx-2@"+h2Queue, "the fork's fresh lease, on the template's host: %v", f.calls)
	assert.Equal(t, []string{"tpl-7", "tpl-7"}, f.rootfs)
}

// A run cancelled while its template builds ends cancelled and releases
// the lease it was given: the build is cancelled with it.
func TestRunCommandCancelledWhileItsTemplateBuildsReleasesItsGivenLease(t *testing.T) {
	var h *harness
	h, _ = newTemplateHarness(t, func(ctx context.Context, _ sandbox.TemplateSpec) (sandbox.Template, error) {
		h.env.CancelWorkflow()
		<-ctx.Done()
		return sandbox.Template{}, ctx.Err()
	})
	h.expectNoOrphans()
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-9").Return(nil)
	req := request("true")
	req.Dockerfile, req.LeaseID = bakedDockerfile, "sbx-9"
	_, err := h.run(req)
	assert.True(t, temporal.IsCanceledError(err), "%v", err)
	assert.Equal(t, PhaseCanceled, h.queryState(t).Phase)
}

// A session given a lease whose template fails to build fails typed and
// destroys that lease, which it owned from its start.
func TestSessionReleasesItsGivenLeaseWhenItsTemplateFailsToBuild(t *testing.T) {
	h, _ := newTemplateHarness(t, failsToBuild)
	h.expectNoOrphans()
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-9").Return(nil)
	req := sessionRequest()
	req.Dockerfile, req.LeaseID = "FROM devbox:1\nRUN false\n", "sbx-9"
	_, err := h.runSession(req)
	assert.Equal(t, sandbox.TypeTemplateBuildFailed, applicationErrorType(err))
}
