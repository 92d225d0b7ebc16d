package workflows

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// harness runs RunCommand in the SDK's test environment with the real
// activities over a mocked provider.
type harness struct {
	env      *testsuite.TestWorkflowEnvironment
	provider *sandboxmock.MockProvider
	leases   int // leases created so far
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	h := &harness{
		env:      suite.NewTestWorkflowEnvironment(),
		provider: sandboxmock.NewMockProvider(gomock.NewController(t)),
	}
	RegisterWorkflows(h.env)
	(&activities.Activities{Provider: h.provider, Heartbeats: activities.TestEnvironmentHeartbeats{}}).Register(h.env)
	return h
}

// expectCreate makes every CreateLease succeed with a new lease id:
// sbx-1, sbx-2, …
func (h *harness) expectCreate(times int) {
	h.provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
			h.leases++
			return sandbox.Lease{ID: leaseName(h.leases), Status: sandbox.StatusRunning, Workspace: "/workspace", Labels: spec.Labels}, nil
		}).Times(times)
}

// expectNoOrphans answers every sweep with an empty list.
func (h *harness) expectNoOrphans() {
	h.provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).Return(nil, nil).AnyTimes()
}

// leaseName names the nth lease a harness creates: sbx-1, sbx-2, … sbx-10.
func leaseName(n int) string { return "sbx-" + strconv.Itoa(n) }

// Past nine leases the names go on in decimal (they were "sbx-:", "sbx-;"
// when built from a rune), so that a test of many compensations or a long
// session can name the lease it expects.
func TestLeaseNamesCountPastNine(t *testing.T) {
	assert.Equal(t, "sbx-9", leaseName(9))
	assert.Equal(t, "sbx-10", leaseName(10))
	assert.Equal(t, "sbx-123", leaseName(123))
}

func request(argv ...string) Request {
	return Request{Command: sandbox.Command{Argv: argv}, Lease: sandbox.LeaseSpec{Shape: "s-1vcpu-1gb"}}
}

func (h *harness) run(req Request) (Result, error) {
	h.env.ExecuteWorkflow(RunCommand, req)
	if !h.env.IsWorkflowCompleted() {
		return Result{}, errors.New("workflow did not complete")
	}
	var res Result
	if err := h.env.GetWorkflowError(); err != nil {
		return res, err
	}
	return res, h.env.GetWorkflowResult(&res)
}

func cleanupError(leaseID string) error {
	return &sandbox.CleanupError{Reason: sandbox.CreationUnconfirmed, LeaseID: leaseID}
}

// applicationErrorType returns the type of the ApplicationError in err's chain.
func applicationErrorType(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Type()
	}
	return ""
}

func TestHappyPath(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, lease sandbox.Lease, cmd sandbox.Command, _ sandbox.Observer) (sandbox.Result, error) {
			assert.Equal(t, "sbx-1", lease.ID)
			assert.Equal(t, []string{"echo", "hi"}, cmd.Argv)
			return sandbox.Result{ProcessID: "p1", Stdout: "hi\n"}, nil
		})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)

	res, err := h.run(request("echo", "hi"))
	require.NoError(t, err)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, "sbx-1", res.LeaseID)
	assert.Zero(t, res.FreshLeases)
	assert.Equal(t, []string{"sbx-1"}, res.DestroyedLeases)

	state := h.queryState(t)
	assert.Equal(t, PhaseCompleted, state.Phase)
}

func (h *harness) queryState(t *testing.T) State {
	t.Helper()
	encoded, err := h.env.QueryWorkflow(StateQuery)
	require.NoError(t, err)
	var s State
	require.NoError(t, encoded.Get(&s))
	return s
}

func TestNonZeroExitIsAResult(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		Return(sandbox.Result{ExitCode: 3, Stderr: "boom"}, nil).Times(1)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)

	res, err := h.run(request("false"))
	require.NoError(t, err)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, 3, res.ShellExitCode())
}

func TestTimeoutIsAResult(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		Return(sandbox.Result{TimedOut: true, Stdout: "partial"}, nil).Times(1)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)

	req := request("sleep", "100")
	req.Command.Timeout = time.Second
	res, err := h.run(req)
	require.NoError(t, err)
	assert.True(t, res.TimedOut)
	assert.Equal(t, 124, res.ShellExitCode())
}

func TestCleanupErrorCompensatesOnAFreshLease(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(2)
	h.expectNoOrphans()
	gomock.InOrder(
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).
			Return(sandbox.Result{}, cleanupError("sbx-1")),
		// DestroyLease(old), once: AcquireFreshLease does not destroy it again.
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil),
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-2"), gomock.Any(), gomock.Any()).
			Return(sandbox.Result{Stdout: "ok"}, nil),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil),
	)
	var activityCalls []string
	h.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		activityCalls = append(activityCalls, info.ActivityType.Name)
	})

	res, err := h.run(request("make", "test"))
	require.NoError(t, err)
	assert.Equal(t, "ok", res.Stdout)
	assert.Equal(t, "sbx-2", res.LeaseID)
	assert.Equal(t, 1, res.FreshLeases)
	assert.Equal(t, []string{"sbx-1", "sbx-2"}, res.DestroyedLeases)
	assert.Equal(t, []string{
		activities.NameCreateLease, activities.NameExecute,
		activities.NameDestroyLease, activities.NameAcquireFreshLease, activities.NameExecute,
		activities.NameDestroyLease,
	}, activityCalls)
}

func TestCleanupErrorEveryTimeExhaustsCompensation(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(3)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, lease sandbox.Lease, _ sandbox.Command, _ sandbox.Observer) (sandbox.Result, error) {
			return sandbox.Result{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: lease.ID, ProcessID: "p"}
		}).Times(3) // the first lease and DefaultMaxFreshLeases fresh ones, once each: never retried
	destroyed := map[string]int{}
	h.provider.EXPECT().DestroyLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, id string) error { destroyed[id]++; return nil }).AnyTimes()

	_, err := h.run(request("make", "test"))
	require.Error(t, err)
	assert.Equal(t, TypeCompensationExhausted, applicationErrorType(err))
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	var details CompensationDetails
	require.NoError(t, appErr.Details(&details))
	assert.Equal(t, CompensationDetails{FreshLeases: 2, DestroyedLeases: []string{"sbx-1", "sbx-2", "sbx-3"}}, details)
	for _, id := range []string{"sbx-1", "sbx-2", "sbx-3"} {
		assert.Positive(t, destroyed[id], "lease %s destroyed", id)
	}
}

func TestConnectionExhaustionIsRetriedNotCompensated(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	attempts := 0
	h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).
		DoAndReturn(func(context.Context, sandbox.Lease, sandbox.Command, sandbox.Observer) (sandbox.Result, error) {
			attempts++
			if attempts < 3 {
				return sandbox.Result{}, &sandbox.ConnectionExhaustedError{LeaseID: "sbx-1", Attempts: 4}
			}
			return sandbox.Result{Stdout: "third time"}, nil
		}).Times(3)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

	res, err := h.run(request("make"))
	require.NoError(t, err)
	assert.Equal(t, "third time", res.Stdout)
	assert.Zero(t, res.FreshLeases)
}

func TestConnectionExhaustionFailsAfterMaximumAttempts(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		Return(sandbox.Result{}, &sandbox.ConnectionExhaustedError{LeaseID: "sbx-1", Attempts: 4}).Times(4)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

	_, err := h.run(request("make"))
	assert.Equal(t, sandbox.TypeConnectionExhausted, applicationErrorType(err))
}

func TestNonRetryableErrorRunsOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		typ  string
	}{
		{"protocol", &sandbox.ProtocolError{Kind: sandbox.SequenceGap}, sandbox.TypeProtocol},
		{"evicted", &sandbox.OutputEvictedError{ProcessID: "p"}, sandbox.TypeOutputEvicted},
		{"api 403", &sandbox.APIError{Status: 403, Operation: "create process"}, sandbox.TypeAPI},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.expectCreate(1)
			h.expectNoOrphans()
			h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
				Return(sandbox.Result{}, tc.err).Times(1)
			h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

			_, err := h.run(request("make"))
			assert.Equal(t, tc.typ, applicationErrorType(err))
		})
	}
}

func TestInvalidRequestFailsBeforeAnyActivity(t *testing.T) {
	for field, bad := range map[string]func(*Request){
		"command.env":          func(r *Request) { r.Command.Env = map[string]string{"BAD;KEY": "v"} },
		"lease.autoPauseAfter": func(r *Request) { r.Lease.AutoPauseAfter = time.Second }, // below the minute the service takes
	} {
		t.Run(field, func(t *testing.T) {
			h := newHarness(t) // the mock expects no call at all
			req := request("echo")
			bad(&req)
			_, err := h.run(req)
			assert.Equal(t, sandbox.TypeInvalidInput, applicationErrorType(err))
			d := failureDetails(t, err)
			assert.Equal(t, sandbox.TypeInvalidInput, d.Kind)
			assert.Equal(t, field, d.Field)
			assertNoGoTypeNames(t, err)
		})
	}
}

// failureDetails returns the details object of the first ApplicationError
// in err's chain.
func failureDetails(t *testing.T, err error) sandbox.FailureDetails {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d), "the failure carries a details object")
	return d
}

// assertNoGoTypeNames checks what another language sees of err: every
// ApplicationFailure in the chain the Temporal failure converter makes of
// it is typed by a name of the taxonomy, none by a Go type name (an
// untyped Go cause becomes an ApplicationFailure of its Go type's name).
func assertNoGoTypeNames(t *testing.T, err error) {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	for f := temporal.GetDefaultFailureConverter().ErrorToFailure(appErr); f != nil; f = f.GetCause() {
		if info := f.GetApplicationFailureInfo(); info != nil {
			_, known := sandbox.KindOf(info.GetType())
			assert.True(t, known, "failure %q is typed %q, not a name of the taxonomy", f.GetMessage(), info.GetType())
		}
	}
}

func TestCancellationDuringExecuteKillsAndDestroys(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(ctx context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			obs.Started(sandbox.Process{ID: "p1"})
			h.env.CancelWorkflow()
			<-ctx.Done() // a real provider kills the process tree here
			return sandbox.Result{}, ctx.Err()
		})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

	_, err := h.run(request("sleep", "1000"))
	require.Error(t, err)
	assert.True(t, temporal.IsCanceledError(err), "workflow error %v", err)
	assert.Equal(t, PhaseCanceled, h.queryState(t).Phase)
}

func TestDestroyLeaseIsRetriedUntilItSucceeds(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).Return(sandbox.Result{}, nil)
	gomock.InOrder(
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(&sandbox.UnavailableError{Operation: "destroy sandbox"}).Times(2),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1),
	)

	res, err := h.run(request("true"))
	require.NoError(t, err)
	assert.Equal(t, []string{"sbx-1"}, res.DestroyedLeases)
}

func TestKeepLeaseLeavesTheLeaseButSweepsOrphans(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).Return(sandbox.Result{}, nil)
	h.provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, labels map[string]string) ([]sandbox.Lease, error) {
			assert.NotEmpty(t, labels[activities.LabelRun])
			return []sandbox.Lease{
				{ID: "sbx-1", Status: sandbox.StatusRunning},
				{ID: "sbx-orphan", Status: sandbox.StatusRunning},
			}, nil
		})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-orphan").Return(nil).Times(1)

	req := request("true")
	req.KeepLease = true
	res, err := h.run(req)
	require.NoError(t, err)
	assert.Equal(t, "sbx-1", res.LeaseID)
	assert.Empty(t, res.DestroyedLeases)
}

func TestExistingLeaseIsUsedWithoutCreating(t *testing.T) {
	h := newHarness(t)
	h.expectNoOrphans()
	h.provider.EXPECT().GetLease(gomock.Any(), "sbx-mine").
		Return(sandbox.Lease{ID: "sbx-mine", Status: sandbox.StatusRunning, Workspace: "/home/me"}, nil)
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, lease sandbox.Lease, _ sandbox.Command, _ sandbox.Observer) (sandbox.Result, error) {
			assert.Equal(t, "/home/me", lease.Workspace, "the workspace is learned from the provider")
			return sandbox.Result{}, nil
		})

	req := request("true")
	req.LeaseID = "sbx-mine"
	req.KeepLease = true
	res, err := h.run(req)
	require.NoError(t, err)
	assert.Equal(t, "sbx-mine", res.LeaseID)
}

// leaseWithID matches a sandbox.Lease by id.
func leaseWithID(id string) gomock.Matcher {
	return gomock.Cond(func(l sandbox.Lease) bool { return l.ID == id })
}

// A create whose sandbox could not be cleaned up leaves nothing to destroy
// by id, but its generation is spent: the next lease is a fresh one of the
// next generation (whose AcquireFreshLease sweeps the first), never the
// first create's idempotency key again.
func TestFailedCreateSpendsItsGeneration(t *testing.T) {
	h := newHarness(t)
	h.expectNoOrphans()
	var generations []string
	h.provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
			generations = append(generations, spec.Labels[activities.LabelGeneration])
			if len(generations) == 1 {
				return sandbox.Lease{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-broken"}
			}
			return sandbox.Lease{ID: "sbx-2", Status: sandbox.StatusRunning, Workspace: "/workspace"}, nil
		}).Times(2)
	h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-2"), gomock.Any(), gomock.Any()).Return(sandbox.Result{Stdout: "ok"}, nil)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil)
	var activityCalls []string
	h.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		activityCalls = append(activityCalls, info.ActivityType.Name)
	})
	res, err := h.run(request("true"))
	require.NoError(t, err)
	assert.Equal(t, "ok", res.Stdout)
	assert.Equal(t, 1, res.FreshLeases)
	assert.Equal(t, []string{"0", "1"}, generations)
	assert.Equal(t, []string{activities.NameCreateLease, activities.NameAcquireFreshLease, activities.NameExecute, activities.NameDestroyLease}, activityCalls)
}
