package activities

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// Every lease a fleet host's activities return names the host, so that
// the workflow sends the work on it there; the fork is labelled with the
// session that will hold it.
func TestTheLeasesOfAFleetHostNameIt(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	(&Activities{Provider: provider, HeartbeatInterval: time.Hour, Host: "h1", Heartbeats: TestEnvironmentHeartbeats{}}).Register(env)
	running := sandbox.Lease{ID: "sbx-1", Status: sandbox.StatusRunning, Workspace: "/workspace"}
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(running, nil).Times(2)
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).Return(nil, nil).AnyTimes()
	provider.EXPECT().PauseLease(gomock.Any(), "sbx-1").Return(nil)
	provider.EXPECT().ResumeLease(gomock.Any(), "sbx-1").Return(nil)
	paused := running
	paused.Status = sandbox.StatusPaused
	gomock.InOrder(
		provider.EXPECT().GetLease(gomock.Any(), "sbx-1").Return(paused, nil).Times(2), // pause settles, resume looks
		provider.EXPECT().GetLease(gomock.Any(), "sbx-1").Return(running, nil),         // resume settles
	)
	provider.EXPECT().ForkLease(gomock.Any(), "sbx-1", gomock.Any()).
		DoAndReturn(func(_ context.Context, _ string, spec sandbox.ForkSpec) (sandbox.Lease, error) {
			assert.Equal(t, "s/fork-1", spec.Labels[LabelWorkflowID])
			return sandbox.Lease{ID: "sbx-2", Status: sandbox.StatusRunning}, nil
		})

	for _, call := range []struct {
		name string
		in   any
	}{
		{NameCreateLease, CreateLeaseInput{RunKey: "r"}},
		{NameAcquireFreshLease, AcquireFreshLeaseInput{RunKey: "r", Generation: 1}},
		{NamePauseLease, LeaseInput{LeaseID: "sbx-1"}},
		{NameResumeLease, LeaseInput{LeaseID: "sbx-1"}},
		{NameForkLease, ForkLeaseInput{SourceID: "sbx-1", RunKey: "f", WorkflowID: "s/fork-1"}},
	} {
		val, err := env.ExecuteActivity(call.name, call.in)
		require.NoError(t, err, call.name)
		var got sandbox.Lease
		require.NoError(t, val.Get(&got))
		assert.Equal(t, "h1", got.Host, call.name)
	}
}
