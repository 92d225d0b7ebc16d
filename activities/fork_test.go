package activities

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/metrics"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

func TestForkLeaseLabelsTheForkWithItsRun(t *testing.T) {
	env, provider, rec := newMeteredEnv(t)
	fork := sandbox.Lease{ID: "sbx-fork", Status: sandbox.StatusRunning, Workspace: "/workspace"}
	provider.EXPECT().ForkLease(gomock.Any(), "sbx-1", gomock.Any()).
		DoAndReturn(func(_ context.Context, _ string, spec sandbox.ForkSpec) (sandbox.Lease, error) {
			assert.Equal(t, "fork-run", spec.Labels[LabelRun])
			assert.Equal(t, "0", spec.Labels[LabelGeneration], "the first lease of the fork's run")
			assert.NotEmpty(t, spec.Labels[LabelWorkflowID])
			assert.Equal(t, "mine", spec.Labels["team"], "the caller's labels are kept")
			assert.Equal(t, []string{"*"}, spec.Egress)
			return fork, nil
		})

	val, err := env.ExecuteActivity(NameForkLease, ForkLeaseInput{SourceID: "sbx-1", RunKey: "fork-run",
		Spec: sandbox.ForkSpec{Egress: []string{"*"}, Labels: map[string]string{"team": "mine"}}})

	require.NoError(t, err)
	var got sandbox.Lease
	require.NoError(t, val.Get(&got))
	assert.Equal(t, fork, got)
	assert.Equal(t, int64(1), rec.counter(metrics.LeasesCreated))
}

// A fork that may exist but was not found is a non-retryable cleanup error
// naming the source, and the source is never destroyed for it.
func TestForkLeaseUnconfirmedLeavesTheSourceAlone(t *testing.T) {
	env, provider, rec := newMeteredEnv(t)
	provider.EXPECT().ForkLease(gomock.Any(), "sbx-1", gomock.Any()).Return(sandbox.Lease{},
		&sandbox.CleanupError{Reason: sandbox.ForkUnconfirmed, LeaseID: "sbx-1", Err: &sandbox.UnavailableError{Operation: "fork sandbox"}})
	// No DestroyLease: the source is intact.

	_, err := env.ExecuteActivity(NameForkLease, ForkLeaseInput{SourceID: "sbx-1", RunKey: "fork-run"})

	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeCleanup, appErr.Type())
	assert.True(t, appErr.NonRetryable())
	var details CleanupDetails
	require.NoError(t, appErr.Details(&details))
	assert.Equal(t, CleanupDetails{LeaseID: "sbx-1", Reason: sandbox.ForkUnconfirmed}, details)
	assert.Equal(t, int64(1), rec.counter(metrics.CleanupErrors, string(sandbox.ForkUnconfirmed)))
	assert.Zero(t, rec.counter(metrics.LeasesCreated))
}

// A fork that was made but could neither be set up nor destroyed is
// destroyed once more, as a half-made create is.
func TestForkLeaseDestroysAHalfMadeFork(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().ForkLease(gomock.Any(), "sbx-1", gomock.Any()).Return(sandbox.Lease{},
		&sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-fork", Err: &sandbox.UnavailableError{Operation: "wait for sandbox"}})
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-fork").Return(nil)

	_, err := env.ExecuteActivity(NameForkLease, ForkLeaseInput{SourceID: "sbx-1", RunKey: "fork-run"})

	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeUnavailable, appErr.Type(), "the setup failure, retryable")
	assert.False(t, appErr.NonRetryable())
}

func TestForkLeaseAndSetEgressRejectBadInput(t *testing.T) {
	env, _ := newEnv(t, nil) // the provider is never called
	_, err := env.ExecuteActivity(NameForkLease, ForkLeaseInput{SourceID: "sbx-1"})
	assert.Equal(t, sandbox.TypeInvalidInput, applicationType(err), "no run key")
	_, err = env.ExecuteActivity(NameForkLease, ForkLeaseInput{SourceID: "../x", RunKey: "r"})
	assert.Equal(t, sandbox.TypeInvalidInput, applicationType(err))
	_, err = env.ExecuteActivity(NameSetEgress, SetEgressInput{LeaseID: "sbx-1", Egress: []string{"two words"}})
	assert.Equal(t, sandbox.TypeInvalidInput, applicationType(err))
}

func TestSetEgress(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().SetEgress(gomock.Any(), "sbx-1", []string{"pypi.org:443"}).Return(nil)
	_, err := env.ExecuteActivity(NameSetEgress, SetEgressInput{LeaseID: "sbx-1", Egress: []string{"pypi.org:443"}})
	require.NoError(t, err)

	provider.EXPECT().SetEgress(gomock.Any(), "sbx-1", gomock.Any()).Return(&sandbox.LeaseGoneError{LeaseID: "sbx-1"})
	_, err = env.ExecuteActivity(NameSetEgress, SetEgressInput{LeaseID: "sbx-1"})
	assert.Equal(t, sandbox.TypeLeaseGone, applicationType(err))
}

func applicationType(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Type()
	}
	return ""
}
