package workflows

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Execute's attempts are unlimited and bounded by the command's timeout
// plus the horizon; the retry policy's MaximumAttempts becomes the budget
// of failures that the activity enforces, a request's override included.
func TestExecuteAttemptsBecomeTheFailureBudget(t *testing.T) {
	for name, tc := range map[string]struct {
		cmd             sandbox.Command
		override        *ActivityOptions
		budget          int
		scheduleToClose time.Duration
	}{
		"default":                     {sandbox.Command{Timeout: 10 * time.Minute}, nil, 4, 10*time.Minute + ExecuteHorizon},
		"no timeout":                  {sandbox.Command{}, nil, 4, 24 * time.Hour},
		"a request's MaximumAttempts": {sandbox.Command{}, &ActivityOptions{RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 2}}, 2, 24 * time.Hour},
		"a request's unlimited":       {sandbox.Command{}, &ActivityOptions{RetryPolicy: &temporal.RetryPolicy{}}, 0, 24 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			override := tc.override
			opts, budget := withFailureBudget(override.apply(executeOptions(tc.cmd)))
			assert.Equal(t, tc.budget, budget)
			assert.Zero(t, opts.RetryPolicy.MaximumAttempts, "Temporal must not count worker deaths and detaches")
			assert.Equal(t, tc.scheduleToClose, opts.ScheduleToCloseTimeout)
			if override != nil {
				assert.Equal(t, int32(tc.budget), override.RetryPolicy.MaximumAttempts, "the request's policy is left as it was")
			}
		})
	}
	assert.Equal(t, int32(4), executeOptions(sandbox.Command{}).RetryPolicy.MaximumAttempts, "the one place of the budget")
}

// Execute timed out as a whole (its horizon ran out while no worker
// followed the command): the run fails typed, SandboxUnattended, never
// with Temporal's untyped timeout, and destroys the lease and the process
// with it, though the request asked to keep it.
func TestUnattendedCommandFailsTypedAndItsLeaseIsDestroyed(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.env.OnActivity(activities.NameExecute, mock.Anything, mock.Anything).
		Return(sandbox.Result{}, temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_CLOSE, nil,
			activities.ExecuteProgress{LeaseID: "sbx-1", Process: sandbox.Process{ID: "p-1"}, Starts: 1}))
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

	req := request("deploy")
	req.KeepLease = true
	_, err := h.run(req)

	require.Error(t, err)
	assert.True(t, sandbox.IsUnattended(err), "%v", err)
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.True(t, appErr.NonRetryable())
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	assert.Equal(t, "sbx-1", d.LeaseID)
	assert.Equal(t, "p-1", d.ProcessID)
	assert.Equal(t, 1, d.Starts)
}

// An unattended command's lease that could not be destroyed at once is
// destroyed by the release, though the request asked to keep it: the
// process may still run on it, with nobody to follow it.
func TestUnattendedCommandsLeaseIsDestroyedByTheReleaseWhenTheFirstDestroyFails(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.env.OnActivity(activities.NameExecute, mock.Anything, mock.Anything).
		Return(sandbox.Result{}, temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_CLOSE, nil))
	gomock.InOrder(
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(&sandbox.APIError{Status: 403, Operation: "delete sandbox"}),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil),
	)

	req := request("deploy")
	req.KeepLease = true
	_, err := h.run(req)

	assert.True(t, sandbox.IsUnattended(err), "%v", err)
}

// A command whose kill was not confirmed runs again on a fresh lease: the
// Result counts both starts.
func TestStartsCountTheCommandOnEveryLease(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(2)
	h.expectNoOrphans()
	gomock.InOrder(
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).
			DoAndReturn(func(_ context.Context, lease sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
				require.NoError(t, obs.Started(sandbox.Process{ID: "p-1", Token: "t1"}))
				return sandbox.Result{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: lease.ID, ProcessID: "p-1"}
			}),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil),
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-2"), gomock.Any(), gomock.Any()).
			DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
				require.NoError(t, obs.Started(sandbox.Process{ID: "p-2", Token: "t2"}))
				return sandbox.Result{ProcessID: "p-2", Stdout: "ok"}, nil
			}),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil),
	)

	res, err := h.run(request("make"))

	require.NoError(t, err)
	assert.Equal(t, 2, res.Starts)
	assert.Equal(t, 1, res.FreshLeases)
}
