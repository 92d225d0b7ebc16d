package workflows

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// snapshotProvider is the mock Provider with a LeaseSnapshotter that
// records its calls ("lease:name").
type snapshotProvider struct {
	*sandboxmock.MockProvider
	mu    *sync.Mutex
	calls *[]string
}

func (p snapshotProvider) SnapshotLease(_ context.Context, leaseID, name string) (sandbox.Template, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	*p.calls = append(*p.calls, leaseID+":"+name)
	return sandbox.Template{ID: "tpl-snap", Name: name}, nil
}

func newSnapshotHarness(t *testing.T) (*harness, func() []string) {
	var suite testsuite.WorkflowTestSuite
	h := &harness{env: suite.NewTestWorkflowEnvironment(), provider: sandboxmock.NewMockProvider(gomock.NewController(t))}
	var mu sync.Mutex
	var calls []string
	RegisterWorkflows(h.env)
	(&activities.Activities{Provider: snapshotProvider{MockProvider: h.provider, mu: &mu, calls: &calls},
		Heartbeats: activities.TestEnvironmentHeartbeats{}}).Register(h.env)
	return h, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), calls...) }
}

// The snapshot Update keeps the session's lease, between two commands, as
// the template it returns: named as asked, or after the session and the
// Update; the lease is not paused nor replaced, and the next command runs
// on it.
func TestSessionSnapshotKeepsItsLeaseAsATemplate(t *testing.T) {
	h, calls := newSnapshotHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(2)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"),
		updateCall{UpdateSnapshot, []any{SessionSnapshot{Name: "mine"}}},
		updateCall{UpdateSnapshot, []any{SessionSnapshot{}}},
		execCall("two"), closeCall)
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	var named, unnamed sandbox.Template
	got[1].decode(t, &named)
	got[2].decode(t, &unnamed)
	assert.Equal(t, sandbox.Template{ID: "tpl-snap", Name: "mine"}, named)
	assert.Regexp(t, `^snap-[0-9a-f]{16}$`, unnamed.Name)
	assert.Equal(t, []string{"sbx-1:mine", "sbx-1:" + unnamed.Name}, calls())
	assert.Equal(t, []string{"sbx-1:one", "sbx-1:two"}, e.calls, "both commands on the one lease")
	assert.Equal(t, SessionSummary{Commands: 2, DestroyedLeases: []string{"sbx-1"}}, summary)
}

// A name the server would refuse is rejected by the validator, before it
// enters history; a session without a lease fails the Update as invalid
// input, without calling the provider.
func TestSessionSnapshotRejectsABadNameAndNeedsALease(t *testing.T) {
	h, calls := newSnapshotHarness(t)
	h.expectNoOrphans()
	u := &updates{h: h}
	got := u.send(time.Second,
		updateCall{UpdateSnapshot, []any{SessionSnapshot{Name: "tpl-x"}}},
		updateCall{UpdateSnapshot, []any{SessionSnapshot{}}},
		closeCall)
	_, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	assert.True(t, got[0].rejected, "a bad name is rejected")
	assert.Equal(t, sandbox.TypeInvalidInput, applicationErrorType(got[0].rejection))
	require.True(t, got[1].completed)
	assert.Equal(t, sandbox.TypeInvalidInput, applicationErrorType(got[1].err))
	assert.Empty(t, calls())
}

// snapshotOf is a workflow that embeds sessions: it keeps the session
// sess-1 as a template through the session handle.
func snapshotOf(ctx workflow.Context, in SessionSnapshot) (sandbox.Template, error) {
	return AttachSession("sess-1").Snapshot(ctx, in)
}

// A workflow keeps a session's lease as a template through its handle:
// the UpdateSession activity sends the snapshot Update with the name, and
// the template comes back; a name the server would refuse fails as
// invalid input before the activity is scheduled.
func TestSessionHandleSnapshot(t *testing.T) {
	for name, c := range map[string]struct {
		in       SessionSnapshot
		calls    int
		wantType string
	}{
		"named":   {in: SessionSnapshot{Name: "mine"}, calls: 1},
		"unnamed": {in: SessionSnapshot{}, calls: 1},
		"bad":     {in: SessionSnapshot{Name: "tpl-x"}, wantType: sandbox.TypeInvalidInput},
	} {
		t.Run(name, func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			RegisterWorkflows(env)
			env.RegisterWorkflow(snapshotOf)
			calls := 0
			env.OnActivity(NameUpdateSession, mock.Anything, mock.Anything).Return(
				func(_ context.Context, in UpdateSessionInput) (UpdateSessionOutput, error) {
					calls++
					assert.Equal(t, "sess-1", in.SessionID)
					assert.Equal(t, UpdateSnapshot, in.Update)
					require.NotNil(t, in.Snapshot)
					assert.Equal(t, c.in, *in.Snapshot)
					return UpdateSessionOutput{Template: &sandbox.Template{ID: "tpl-1", Name: "mine"}}, nil
				})
			env.ExecuteWorkflow(snapshotOf, c.in)
			require.True(t, env.IsWorkflowCompleted())
			assert.Equal(t, c.calls, calls)
			if c.wantType != "" {
				assert.Equal(t, c.wantType, applicationErrorType(env.GetWorkflowError()))
				return
			}
			require.NoError(t, env.GetWorkflowError())
			var got sandbox.Template
			require.NoError(t, env.GetWorkflowResult(&got))
			assert.Equal(t, sandbox.Template{ID: "tpl-1", Name: "mine"}, got)
		})
	}
}
