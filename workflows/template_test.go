package workflows

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
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
	result func(spec sandbox.TemplateSpec) (sandbox.Template, error)
}

func (p templateProvider) EnsureTemplate(_ context.Context, spec sandbox.TemplateSpec, onLog func(string)) (sandbox.Template, error) {
	*p.builds++
	onLog("step 1")
	return p.result(spec)
}

// newTemplateHarness is newHarness over a provider that builds templates.
func newTemplateHarness(t *testing.T, result func(sandbox.TemplateSpec) (sandbox.Template, error)) (*harness, *int) {
	var suite testsuite.WorkflowTestSuite
	h := &harness{env: suite.NewTestWorkflowEnvironment(), provider: sandboxmock.NewMockProvider(gomock.NewController(t))}
	builds := new(int)
	RegisterWorkflows(h.env)
	(&activities.Activities{Provider: templateProvider{MockProvider: h.provider, builds: builds, result: result},
		Heartbeats: activities.TestEnvironmentHeartbeats{}}).Register(h.env)
	return h, builds
}

const bakedDockerfile = "FROM devbox:1\nRUN echo baked > /opt/baked\n"

// A request with a Dockerfile builds its template first, then creates
// its lease on it.
func TestRunCommandCreatesTheLeaseOnTheDockerfilesTemplate(t *testing.T) {
	h, builds := newTemplateHarness(t, func(spec sandbox.TemplateSpec) (sandbox.Template, error) {
		assert.Equal(t, bakedDockerfile, spec.Dockerfile)
		return sandbox.Template{ID: "tpl-7", Name: spec.Name()}, nil
	})
	h.expectNoOrphans()
	h.provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
			assert.Equal(t, "tpl-7", spec.Rootfs, "the lease runs on the template")
			return sandbox.Lease{ID: "sbx-1", Status: sandbox.StatusRunning, Workspace: "/workspace", Labels: spec.Labels}, nil
		})
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
	h, builds := newTemplateHarness(t, func(spec sandbox.TemplateSpec) (sandbox.Template, error) {
		return sandbox.Template{}, &sandbox.TemplateBuildError{TemplateID: "tpl-7", Name: spec.Name(), LogTail: "line 2: RUN false: exited with code 1\n"}
	})
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

// A Dockerfile with a rootfs, or over the bound, fails as invalid input
// before any activity.
func TestRunCommandRefusesABadDockerfileBeforeAnyActivity(t *testing.T) {
	for name, req := range map[string]Request{
		"with rootfs": {Command: sandbox.Command{Argv: []string{"true"}}, Lease: sandbox.LeaseSpec{Rootfs: "devbox:1"}, Dockerfile: bakedDockerfile},
		"too big":     {Command: sandbox.Command{Argv: []string{"true"}}, Dockerfile: strings.Repeat("#", sandbox.MaxDockerfileBytes+1)},
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

// A fleet refuses a Dockerfile before any activity: the template would
// be built on one host and the lease placed on another.
func TestFleetRefusesADockerfile(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	req := request("true")
	req.Dockerfile = bakedDockerfile
	f.env.ExecuteWorkflow(RunCommand, req)
	err := f.env.GetWorkflowError()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	assert.Equal(t, sandbox.TypeInvalidInput, d.Kind)
	assert.Contains(t, d.Reason, "fleet")
	assert.Zero(t, d.Attempt, "refused by the workflow, before any activity")
	assert.Empty(t, f.calls)
}
