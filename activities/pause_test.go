package activities

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// statuses answers GetLease with each status in turn, the last one from
// then on.
func statuses(list ...sandbox.LeaseStatus) func(context.Context, string) (sandbox.Lease, error) {
	return func(_ context.Context, id string) (sandbox.Lease, error) {
		status := list[0]
		if len(list) > 1 {
			list = list[1:]
		}
		return sandbox.Lease{ID: id, Status: status, Workspace: "/workspace"}, nil
	}
}

func TestPauseLeaseReturnsOncePaused(t *testing.T) {
	env, provider := newEnv(t, nil)
	gomock.InOrder(
		provider.EXPECT().PauseLease(gomock.Any(), "sbx-1").Return(nil),
		provider.EXPECT().GetLease(gomock.Any(), "sbx-1").DoAndReturn(statuses(sandbox.StatusPausing, sandbox.StatusPaused)).Times(2),
	)
	val, err := env.ExecuteActivity(NamePauseLease, LeaseInput{LeaseID: "sbx-1"})
	require.NoError(t, err)
	var got sandbox.Lease
	require.NoError(t, val.Get(&got))
	assert.Equal(t, sandbox.StatusPaused, got.Status)
}

func TestResumeLeaseOfARunningLeaseSendsNothing(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().GetLease(gomock.Any(), "sbx-1").DoAndReturn(statuses(sandbox.StatusRunning))
	// No ResumeLease: the lease runs already.
	val, err := env.ExecuteActivity(NameResumeLease, LeaseInput{LeaseID: "sbx-1"})
	require.NoError(t, err)
	var got sandbox.Lease
	require.NoError(t, val.Get(&got))
	assert.Equal(t, "/workspace", got.Workspace)
}

func TestResumeLeaseThatSettlesElsewhereIsGone(t *testing.T) {
	env, provider := newEnv(t, nil)
	gomock.InOrder(
		provider.EXPECT().GetLease(gomock.Any(), "sbx-1").DoAndReturn(statuses(sandbox.StatusPaused)),
		provider.EXPECT().ResumeLease(gomock.Any(), "sbx-1").Return(nil),
		provider.EXPECT().GetLease(gomock.Any(), "sbx-1").DoAndReturn(statuses(sandbox.StatusResuming, sandbox.StatusError)).Times(2),
	)
	_, err := env.ExecuteActivity(NameResumeLease, LeaseInput{LeaseID: "sbx-1"})
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "error: %v", err)
	assert.Equal(t, sandbox.TypeLeaseGone, appErr.Type(), "the session replaces a lease it cannot resume")
	assert.True(t, appErr.NonRetryable())
}

func TestPauseAndResumeRejectABadLeaseIDBeforeSending(t *testing.T) {
	env, _ := newEnv(t, nil) // the mock expects no call
	for _, name := range []string{NamePauseLease, NameResumeLease} {
		_, err := env.ExecuteActivity(name, LeaseInput{LeaseID: "../x"})
		var appErr *temporal.ApplicationError
		require.True(t, errors.As(err, &appErr), "%s: %v", name, err)
		assert.Equal(t, sandbox.TypeInvalidInput, appErr.Type(), name)
	}
}
