package activities

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// failingHeartbeats is a HeartbeatRecorder whose server never answers in
// time, as a Temporal frontend delayed by seconds.
type failingHeartbeats struct{}

func (failingHeartbeats) RecordHeartbeatNow(context.Context, any) error {
	return context.DeadlineExceeded
}

// A process that Temporal could not record is refused, and no heartbeat
// through the SDK names it: the next attempt must not look for a process
// that was killed behind its gate.
func TestExecuteRefusesAndNeverPublishesAnUnrecordedProcess(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	(&Activities{Provider: provider, HeartbeatInterval: time.Hour, Heartbeats: failingHeartbeats{}}).Register(env)
	beatsSoFar := recordBeats(t, env)
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			err := obs.Started(sandbox.Process{ID: "proc-1", Token: "t"})
			require.Error(t, err)
			return sandbox.Result{}, fmt.Errorf("process proc-1 not started: %w", err)
		})

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, TypeUnrecorded, appErr.Type())
	assert.False(t, appErr.NonRetryable())
	for _, b := range beatsSoFar() {
		assert.Empty(t, b.Process.ID, "a heartbeat named the unrecorded process: %+v", b)
	}
}

// The earlier attempt's process is gone, and the provider proves that its
// command never started: the command runs, in this attempt, once.
func TestExecuteRunsACommandWhoseEarlierProcessNeverStarted(t *testing.T) {
	env, provider := newEnv(t, nil)
	env.SetHeartbeatDetails(ExecuteProgress{Process: sandbox.Process{ID: "proc-7", Token: "tok"}, Cursor: 3})
	provider.EXPECT().Attach(gomock.Any(), lease, sandbox.Process{ID: "proc-7", Token: "tok"}, gomock.Any()).
		Return(sandbox.Result{}, fmt.Errorf("process proc-7: %w", sandbox.ErrNeverStarted))
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			require.NoError(t, obs.Started(sandbox.Process{ID: "proc-8", Token: "t8"}))
			obs.Output(sandbox.Chunk{Seq: 1, Stream: sandbox.Stdout, Text: "ok\n", Bytes: 3})
			return sandbox.Result{ProcessID: "proc-8", Stdout: "ok\n"}, nil
		})

	val, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	require.NoError(t, err)
	var res sandbox.Result
	require.NoError(t, val.Get(&res))
	assert.Equal(t, "ok\n", res.Stdout)
}

// A process that is gone without that proof may have run: its loss is a
// typed, non-retryable failure, never a second run nor a bare 404.
func TestExecuteDoesNotRunAgainWhenTheEarlierProcessIsLost(t *testing.T) {
	env, provider := newEnv(t, nil)
	env.SetHeartbeatDetails(ExecuteProgress{Process: sandbox.Process{ID: "proc-7", Token: "tok"}})
	provider.EXPECT().Attach(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		Return(sandbox.Result{}, &sandbox.OutputEvictedError{ProcessID: "proc-7", Gone: true})

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeOutputEvicted, appErr.Type())
	assert.True(t, appErr.NonRetryable())
	assert.False(t, errors.Is(err, sandbox.ErrNeverStarted))
}
