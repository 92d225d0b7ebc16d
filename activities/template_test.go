package activities

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// templateProvider is the mock Provider with a scripted TemplateBuilder.
type templateProvider struct {
	*sandboxmock.MockProvider
	ensure func(ctx context.Context, spec sandbox.TemplateSpec, onLog func(string)) (sandbox.Template, error)
}

func (p templateProvider) EnsureTemplate(ctx context.Context, spec sandbox.TemplateSpec, onLog func(string)) (sandbox.Template, error) {
	return p.ensure(ctx, spec, onLog)
}

// newTemplateEnv registers the activities over provider; onBeat, if not
// nil, sees each heartbeat.
func newTemplateEnv(t *testing.T, provider sandbox.Provider, onBeat func(TemplateProgress)) (*testsuite.TestActivityEnvironment, func() []TemplateProgress) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	(&Activities{Provider: provider, HeartbeatInterval: time.Hour, Heartbeats: TestEnvironmentHeartbeats{}}).Register(env)
	var mu sync.Mutex
	var beats []TemplateProgress
	env.SetOnActivityHeartbeatListener(func(_ *activity.Info, details converter.EncodedValues) {
		var p TemplateProgress
		assert.NoError(t, details.Get(&p))
		mu.Lock()
		defer mu.Unlock()
		beats = append(beats, p)
		if onBeat != nil {
			onBeat(p)
		}
	})
	return env, func() []TemplateProgress {
		mu.Lock()
		defer mu.Unlock()
		return append([]TemplateProgress(nil), beats...)
	}
}

var templateSpec = sandbox.TemplateSpec{Dockerfile: "FROM devbox:1\nRUN make\n"}

// The build log reaches the heartbeats as it grows, so that the Web UI
// and the starter show it live.
func TestEnsureTemplateHeartbeatsTheBuildLog(t *testing.T) {
	lines := make(chan struct{})
	provider := templateProvider{MockProvider: sandboxmock.NewMockProvider(gomock.NewController(t)),
		ensure: func(_ context.Context, spec sandbox.TemplateSpec, onLog func(string)) (sandbox.Template, error) {
			onLog("step 1: RUN make")
			<-lines
			return sandbox.Template{ID: "tpl-1", Name: spec.Name()}, nil
		}}
	var once sync.Once
	env, beats := newTemplateEnv(t, provider, func(p TemplateProgress) {
		if p.Log.Text == "step 1: RUN make\n" {
			once.Do(func() { close(lines) }) // the build goes on once its log was heartbeated
		}
	})
	val, err := env.ExecuteActivity(NameEnsureTemplate, templateSpec)
	require.NoError(t, err)
	var got sandbox.Template
	require.NoError(t, val.Get(&got))
	assert.Equal(t, sandbox.Template{ID: "tpl-1", Name: templateSpec.Name()}, got)
	assert.Equal(t, templateSpec.Name(), beats()[0].Name)
}

// A failed build leaves as a non-retryable SandboxTemplateBuildFailed
// whose details carry the log's tail.
func TestEnsureTemplateFailsNonRetryableWithTheLogTail(t *testing.T) {
	provider := templateProvider{MockProvider: sandboxmock.NewMockProvider(gomock.NewController(t)),
		ensure: func(context.Context, sandbox.TemplateSpec, func(string)) (sandbox.Template, error) {
			return sandbox.Template{}, &sandbox.TemplateBuildError{TemplateID: "tpl-1", Name: "sf-1", LogTail: "line 2: RUN make: exited with code 2\n"}
		}}
	env, _ := newTemplateEnv(t, provider, nil)
	_, err := env.ExecuteActivity(NameEnsureTemplate, templateSpec)
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeTemplateBuildFailed, appErr.Type())
	assert.True(t, appErr.NonRetryable())
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	assert.Equal(t, "line 2: RUN make: exited with code 2\n", d.LogTail)
	assert.Equal(t, "sf-1", d.Template)
}

// A provider without templates refuses the Dockerfile as invalid input.
func TestEnsureTemplateNeedsATemplateBuilder(t *testing.T) {
	env, _ := newTemplateEnv(t, sandboxmock.NewMockProvider(gomock.NewController(t)), nil)
	_, err := env.ExecuteActivity(NameEnsureTemplate, templateSpec)
	assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
}

// snapshotProvider is the mock Provider with a scripted LeaseSnapshotter.
type snapshotProvider struct {
	*sandboxmock.MockProvider
	snapshot func(leaseID, name string) (sandbox.Template, error)
}

func (p snapshotProvider) SnapshotLease(_ context.Context, leaseID, name string) (sandbox.Template, error) {
	return p.snapshot(leaseID, name)
}

// SnapshotLease returns the provider's template; a lease found gone is a
// non-retryable SandboxLeaseGone; a bad name is refused before the
// provider is asked; a provider that keeps no leases as templates is
// invalid input.
func TestSnapshotLease(t *testing.T) {
	calls := 0
	provider := snapshotProvider{MockProvider: sandboxmock.NewMockProvider(gomock.NewController(t)),
		snapshot: func(leaseID, name string) (sandbox.Template, error) {
			calls++
			if leaseID == "sbx-gone" {
				return sandbox.Template{}, &sandbox.LeaseGoneError{LeaseID: leaseID}
			}
			return sandbox.Template{ID: "tpl-1", Name: name}, nil
		}}
	env, _ := newTemplateEnv(t, provider, nil)
	val, err := env.ExecuteActivity(NameSnapshotLease, SnapshotLeaseInput{LeaseID: "sbx-1", Name: "kept"})
	require.NoError(t, err)
	var got sandbox.Template
	require.NoError(t, val.Get(&got))
	assert.Equal(t, sandbox.Template{ID: "tpl-1", Name: "kept"}, got)

	_, err = env.ExecuteActivity(NameSnapshotLease, SnapshotLeaseInput{LeaseID: "sbx-gone", Name: "kept"})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeLeaseGone, appErr.Type())
	assert.True(t, appErr.NonRetryable())

	_, err = env.ExecuteActivity(NameSnapshotLease, SnapshotLeaseInput{LeaseID: "sbx-1", Name: "tpl-x"})
	assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
	assert.Equal(t, 2, calls, "a bad name never reaches the provider")

	env, _ = newTemplateEnv(t, sandboxmock.NewMockProvider(gomock.NewController(t)), nil)
	_, err = env.ExecuteActivity(NameSnapshotLease, SnapshotLeaseInput{LeaseID: "sbx-1", Name: "kept"})
	assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
}
