package activities

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// requireFailure checks that err is a failure of type typ, retryable or
// not, and returns its details.
func requireFailure(t *testing.T, err error, typ string, retryable bool) sandbox.FailureDetails {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, typ, appErr.Type(), "%v", err)
	assert.Equal(t, !retryable, appErr.NonRetryable(), "non-retryable")
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	return d
}

// The output of a command cannot be read: the attempt fails retryably,
// counts the failure, and leaves the process to the next attempt — its
// last heartbeat names the process and does not say Ended. Nothing is
// killed. (On be7ee59 the attempt ended the process and the retry ran the
// command again.)
func TestExecuteLeavesAProcessWhoseOutputCouldNotBeRead(t *testing.T) {
	env, provider := newEnv(t, nil)
	beatsSoFar := recordBeats(t, env)
	proc := sandbox.Process{ID: "proc-1", Token: "t"}
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			require.NoError(t, obs.Started(proc))
			return sandbox.Result{}, &sandbox.ConnectionExhaustedError{LeaseID: lease.ID, ProcessID: proc.ID, Attempts: 5, Running: true}
		})
	// No Attach: nothing is killed.

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"deploy"}}, MaxFailures: 4})

	d := requireFailure(t, err, sandbox.TypeConnectionExhausted, true)
	assert.Equal(t, 1, d.Starts)
	beats := beatsSoFar()
	require.NotEmpty(t, beats)
	last := beats[len(beats)-1]
	assert.Equal(t, proc, last.Process)
	assert.False(t, last.Ended, "the next attempt must attach, not start the command again")
	assert.Equal(t, 1, last.Failures)
	assert.Equal(t, 1, last.Starts)
}

// The next attempt re-attaches to that process and returns its Result;
// the re-attach costs nothing, and the Result says the command started
// once.
func TestExecuteReattachesAfterAnExhaustionAndReportsOneStart(t *testing.T) {
	env, provider := newEnv(t, nil)
	proc := sandbox.Process{ID: "proc-1", Token: "t"}
	env.SetHeartbeatDetails(ExecuteProgress{LeaseID: lease.ID, Process: proc, Starts: 1, Failures: 3})
	provider.EXPECT().Attach(gomock.Any(), lease, proc, gomock.Any()).Return(sandbox.Result{ProcessID: proc.ID, Stdout: "deployed\n"}, nil)

	val, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"deploy"}}, MaxFailures: 4})

	require.NoError(t, err)
	var res sandbox.Result
	require.NoError(t, val.Get(&res))
	assert.Equal(t, "deployed\n", res.Stdout)
	assert.Equal(t, 1, res.Starts)
}

// The attempt that meets the last failure of the budget kills the process
// it leaves no one to follow, and fails for good: typed, non-retryable,
// the process ended. A kill that cannot be confirmed is a cleanup error.
func TestExecuteKillsTheProcessWhenTheBudgetIsSpent(t *testing.T) {
	for name, tc := range map[string]struct {
		kill error
		typ  string
	}{
		"killed":           {nil, sandbox.TypeConnectionExhausted},
		"kill unconfirmed": {&sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: lease.ID, ProcessID: "proc-1"}, sandbox.TypeCleanup},
	} {
		t.Run(name, func(t *testing.T) {
			env, provider := newEnv(t, nil)
			beatsSoFar := recordBeats(t, env)
			proc := sandbox.Process{ID: "proc-1", Token: "t"}
			env.SetHeartbeatDetails(ExecuteProgress{LeaseID: lease.ID, Process: proc, Starts: 1, Failures: 3})
			exhausted := &sandbox.ConnectionExhaustedError{LeaseID: lease.ID, ProcessID: proc.ID, Attempts: 5, Running: true}
			gomock.InOrder(
				provider.EXPECT().Attach(gomock.Any(), lease, proc, gomock.Any()).Return(sandbox.Result{}, exhausted),
				provider.EXPECT().Attach(gomock.Any(), lease, proc, gomock.Any()).
					DoAndReturn(func(ctx context.Context, _ sandbox.Lease, _ sandbox.Process, _ sandbox.Observer) (sandbox.Result, error) {
						require.Error(t, ctx.Err(), "an Attach with an ended context kills")
						if tc.kill != nil {
							return sandbox.Result{}, tc.kill
						}
						return sandbox.Result{}, fmt.Errorf("command cancelled: %w", ctx.Err())
					}),
			)

			_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"deploy"}}, MaxFailures: 4})

			d := requireFailure(t, err, tc.typ, false)
			assert.Equal(t, 1, d.Starts)
			beats := beatsSoFar()
			require.NotEmpty(t, beats)
			assert.True(t, beats[len(beats)-1].Ended)
			assert.Equal(t, 4, beats[len(beats)-1].Failures)
		})
	}
}

// Every retryable failure of the sandbox service counts; the one that
// spends the budget is not retried, whatever its kind.
func TestExecuteFailsForGoodOnTheLastFailureOfTheBudget(t *testing.T) {
	env, provider := newEnv(t, nil)
	env.SetHeartbeatDetails(ExecuteProgress{LeaseID: lease.ID, Failures: 1, Ended: true})
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		Return(sandbox.Result{}, &sandbox.APIError{Operation: "create process", Status: 503})

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}, MaxFailures: 2})

	d := requireFailure(t, err, sandbox.TypeAPI, false)
	assert.Equal(t, 503, d.Status)
}

// A detach costs nothing: the count of failures travels on unchanged.
func TestExecuteDetachDoesNotSpendTheBudget(t *testing.T) {
	env, provider := newEnv(t, nil)
	beatsSoFar := recordBeats(t, env)
	proc := sandbox.Process{ID: "proc-1", Token: "t"}
	env.SetHeartbeatDetails(ExecuteProgress{LeaseID: lease.ID, Process: proc, Starts: 1, Failures: 3})
	provider.EXPECT().Attach(gomock.Any(), lease, proc, gomock.Any()).
		Return(sandbox.Result{}, fmt.Errorf("process proc-1 left running: %w", sandbox.ErrDetached))

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}, MaxFailures: 4})

	requireFailure(t, err, sandbox.TypeDetached, true)
	beats := beatsSoFar()
	require.NotEmpty(t, beats)
	assert.Equal(t, 3, beats[len(beats)-1].Failures)
	assert.False(t, beats[len(beats)-1].Ended)
}
