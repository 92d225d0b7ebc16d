package activities

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/metrics"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

func newEnv(t *testing.T, secrets Secrets) (*testsuite.TestActivityEnvironment, *sandboxmock.MockProvider) {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	(&Activities{Provider: provider, Secrets: secrets, HeartbeatInterval: time.Hour, Heartbeats: TestEnvironmentHeartbeats{}}).Register(env)
	return env, provider
}

var lease = sandbox.Lease{ID: "sbx-1", Status: sandbox.StatusRunning, Workspace: "/workspace"}

func TestExecuteReattachesToTheProcessOfAnEarlierAttempt(t *testing.T) {
	env, provider := newEnv(t, nil)
	deadline := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	env.SetHeartbeatDetails(ExecuteProgress{Process: sandbox.Process{ID: "proc-7", Token: "tok", Deadline: deadline}, Cursor: 12})
	provider.EXPECT().Attach(gomock.Any(), lease, sandbox.Process{ID: "proc-7", Token: "tok", Deadline: deadline}, gomock.Any()).
		Return(sandbox.Result{ProcessID: "proc-7", Stdout: "replayed"}, nil)
	// Execute must not be called: the command is still running.

	val, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	require.NoError(t, err)
	var res sandbox.Result
	require.NoError(t, val.Get(&res))
	assert.Equal(t, "replayed", res.Stdout)
}

func TestExecuteStartsAnewWhenTheEarlierAttemptEndedItsProcess(t *testing.T) {
	env, provider := newEnv(t, nil)
	env.SetHeartbeatDetails(ExecuteProgress{Process: sandbox.Process{ID: "proc-7"}, Ended: true})
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).Return(sandbox.Result{ProcessID: "proc-8"}, nil)

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	require.NoError(t, err)
}

func TestExecuteHeartbeatsTheProcessAndFinallyThatItEnded(t *testing.T) {
	env, provider := newEnv(t, nil)
	beatsSoFar := recordBeats(t, env)
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			obs.Started(sandbox.Process{ID: "proc-1", Token: "t"})
			obs.Output(sandbox.Chunk{Seq: 1, Stream: sandbox.Stdout, Text: "abc", Bytes: 3})
			obs.Output(sandbox.Chunk{Seq: 2, Stream: sandbox.Stderr, Text: "de", Bytes: 2})
			return sandbox.Result{}, &sandbox.ConnectionExhaustedError{LeaseID: lease.ID, ProcessID: "proc-1", Attempts: 4}
		})

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	require.Error(t, err)
	beats := beatsSoFar()
	require.GreaterOrEqual(t, len(beats), 2)
	first, last := beats[0], beats[len(beats)-1]
	assert.False(t, first.StartedAt.IsZero(), "the process's creation is recorded with it")
	assert.Equal(t, first.StartedAt, last.StartedAt)
	first.StartedAt, last.StartedAt = time.Time{}, time.Time{}
	assert.Equal(t, ExecuteProgress{LeaseID: lease.ID, Process: sandbox.Process{ID: "proc-1", Token: "t"}, Starts: 1}, first, "the process is recorded as soon as it exists")
	assert.Equal(t, ExecuteProgress{LeaseID: lease.ID, Process: sandbox.Process{ID: "proc-1", Token: "t"}, Cursor: 2, Bytes: 5, Ended: true, Starts: 1, Failures: 1,
		Stdout: OutputTail{Text: "abc", End: 3}, Stderr: OutputTail{Text: "de", End: 2}}, last,
		"the last heartbeat tells a retry not to attach to the killed process")
}

func TestErrorsLeaveClassified(t *testing.T) {
	unrecorded := fmt.Errorf("process p-1 not started: %w", &unrecordedError{errors.New("unavailable")})
	for _, tc := range []struct {
		err          error
		typ          string
		nonRetryable bool
	}{
		{&sandbox.CleanupError{Reason: sandbox.CreationUnconfirmed, LeaseID: "sbx-1"}, sandbox.TypeCleanup, true},
		{&sandbox.ConnectionExhaustedError{Attempts: 4}, sandbox.TypeConnectionExhausted, false},
		{&sandbox.ProtocolError{Kind: sandbox.SequenceGap}, sandbox.TypeProtocol, true},
		{&sandbox.OutputEvictedError{}, sandbox.TypeOutputEvicted, true},
		{&sandbox.InvalidInputError{Field: "argv"}, sandbox.TypeInvalidInput, true},
		{&sandbox.APIError{Status: 404, Operation: "x"}, sandbox.TypeAPI, true},
		{&sandbox.APIError{Status: 503, Operation: "x"}, sandbox.TypeAPI, false},
		{&sandbox.APIError{Status: 429, Operation: "x"}, sandbox.TypeAPI, false},
		{&sandbox.UnavailableError{Operation: "x"}, sandbox.TypeUnavailable, false},
		{&sandbox.LeaseGoneError{LeaseID: "sbx-1"}, sandbox.TypeLeaseGone, true},
		{&sandbox.PaymentRequiredError{Operation: "x"}, sandbox.TypePaymentRequired, true},
		// A process that Started could not record in Temporal was killed
		// before its command started: the next attempt starts afresh…
		{unrecorded, TypeUnrecorded, false},
		// … unless the kill was not confirmed.
		{&sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-1", ProcessID: "p-1", Err: unrecorded}, sandbox.TypeCleanup, true},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			env, provider := newEnv(t, nil)
			provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).Return(sandbox.Result{}, tc.err)
			_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"x"}}})
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			assert.Equal(t, tc.typ, appErr.Type())
			assert.Equal(t, tc.nonRetryable, appErr.NonRetryable())
			var d sandbox.FailureDetails
			require.NoError(t, appErr.Details(&d), "every failure carries its details object")
			assert.Equal(t, tc.typ, d.Kind)
			assert.Equal(t, !tc.nonRetryable, d.Retryable)
			assert.Equal(t, 1, d.Attempt)
		})
	}
}

// What another language sees of an activity's failure names no Go type:
// an untyped Go error as a cause would reach it as an ApplicationFailure
// typed "errorString" or "wrapError", marked retryable.
func TestFailuresNameNoGoType(t *testing.T) {
	for name, err := range map[string]error{
		"unexpected": classify(fmt.Errorf("a provider bug: %w", errors.New("x"))),
		"typed":      classify(fmt.Errorf("create: %w", &sandbox.APIError{Status: 409, Operation: "create sandbox"})),
		"go cause":   NewFailure("m", sandbox.NewFailureDetails(sandbox.TypeDetached), fmt.Errorf("w: %w", sandbox.ErrDetached)),
		"cause kept": NewFailure("m", sandbox.NewFailureDetails(sandbox.TypeCompensationExhausted), classify(&sandbox.LeaseGoneError{LeaseID: "sb"})),
	} {
		t.Run(name, func(t *testing.T) {
			var types []string
			for f := temporal.GetDefaultFailureConverter().ErrorToFailure(err); f != nil; f = f.GetCause() {
				types = append(types, f.GetApplicationFailureInfo().GetType())
				var d sandbox.FailureDetails
				require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(f.GetApplicationFailureInfo().GetDetails(), &d))
				assert.Equal(t, types[len(types)-1], d.Kind, "the details name the failure's kind")
			}
			for _, typ := range types {
				_, known := sandbox.KindOf(typ)
				assert.True(t, known, "%q in %v is not a name of the taxonomy", typ, types)
			}
		})
	}
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, NewFailure("m", sandbox.NewFailureDetails(sandbox.TypeCompensationExhausted), classify(&sandbox.LeaseGoneError{LeaseID: "sb"})), &appErr)
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	assert.Equal(t, sandbox.TypeLeaseGone, d.Cause, "the cause's kind is named in the details")
	assert.Equal(t, sandbox.TypeLeaseGone, sandbox.ErrorType(appErr.Unwrap()), "a Temporal cause is kept")
}

func TestCleanupErrorCarriesItsLease(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		Return(sandbox.Result{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-1", ProcessID: "p"})
	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"x"}}})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	var details CleanupDetails
	require.NoError(t, appErr.Details(&details))
	assert.Equal(t, CleanupDetails{LeaseID: "sbx-1", ProcessID: "p", Reason: sandbox.TerminationUnconfirmed}, details)
}

type mapSecrets map[string]string

func (m mapSecrets) Secret(_ context.Context, name string) (string, error) {
	if v, ok := m[name]; ok {
		return v, nil
	}
	return "", errors.New("no secret " + name)
}

func TestSecretsAreResolvedOnTheWorker(t *testing.T) {
	env, provider := newEnv(t, mapSecrets{"deploy-token": "s3cr3t"})
	provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, cmd sandbox.Command, _ sandbox.Observer) (sandbox.Result, error) {
			assert.Equal(t, map[string]string{"PLAIN": "p", "TOKEN": "s3cr3t"}, cmd.Env)
			return sandbox.Result{}, nil
		})
	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{
		Lease:     lease,
		Command:   sandbox.Command{Argv: []string{"deploy"}, Env: map[string]string{"PLAIN": "p"}},
		SecretEnv: map[string]string{"TOKEN": "deploy-token"},
	})
	require.NoError(t, err)
}

func TestMissingSecretIsInvalidInputAndNothingRuns(t *testing.T) {
	env, _ := newEnv(t, mapSecrets{})
	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{
		Lease:     lease,
		Command:   sandbox.Command{Argv: []string{"deploy"}},
		SecretEnv: map[string]string{"TOKEN": "deploy-token"},
	})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeInvalidInput, appErr.Type())
}

func TestCreateLeaseLabelsTheRunAndIsIdempotentPerGeneration(t *testing.T) {
	env, provider := newEnv(t, nil)
	var specs []sandbox.LeaseSpec
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
			specs = append(specs, spec)
			return lease, nil
		}).Times(3)
	spec := sandbox.LeaseSpec{Shape: "s-1vcpu-1gb", Labels: map[string]string{"team": "infra"}}
	for _, in := range []CreateLeaseInput{
		{Spec: spec, RunKey: "run-a", Generation: 0},
		{Spec: spec, RunKey: "run-a", Generation: 0}, // a retry after a lost response
		{Spec: spec, RunKey: "run-b", Generation: 0},
	} {
		_, err := env.ExecuteActivity(NameCreateLease, in)
		require.NoError(t, err)
	}
	assert.Equal(t, "infra", specs[0].Labels["team"])
	assert.Equal(t, "run-a", specs[0].Labels[LabelRun])
	assert.Equal(t, "0", specs[0].Labels[LabelGeneration])
	assert.NotEmpty(t, specs[0].IdempotencyKey)
	assert.Equal(t, specs[0].IdempotencyKey, specs[1].IdempotencyKey, "a retry asks for the same sandbox")
	assert.NotEqual(t, specs[0].IdempotencyKey, specs[2].IdempotencyKey, "another run gets its own")
	assert.NotContains(t, spec.Labels, LabelRun, "the caller's spec is not modified")
}

func TestAcquireFreshLeaseDestroysTheOldLeaseAndOlderGenerations(t *testing.T) {
	env, provider := newEnv(t, nil)
	gomock.InOrder(
		provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil),
		provider.EXPECT().ListLeases(gomock.Any(), map[string]string{LabelRun: "run-a"}).Return([]sandbox.Lease{
			{ID: "sbx-orphan-gen0", Status: sandbox.StatusRunning, Labels: map[string]string{LabelGeneration: "0"}},
			{ID: "sbx-done", Status: sandbox.StatusDestroyed, Labels: map[string]string{LabelGeneration: "0"}},
			{ID: "sbx-inflight-gen1", Status: sandbox.StatusRunning, Labels: map[string]string{LabelGeneration: "1"}},
		}, nil),
		provider.EXPECT().DestroyLease(gomock.Any(), "sbx-orphan-gen0").Return(nil),
		provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(sandbox.Lease{ID: "sbx-inflight-gen1"}, nil),
	)
	val, err := env.ExecuteActivity(NameAcquireFreshLease, AcquireFreshLeaseInput{Replacing: "sbx-1", RunKey: "run-a", Generation: 1})
	require.NoError(t, err)
	var got sandbox.Lease
	require.NoError(t, val.Get(&got))
	assert.Equal(t, "sbx-inflight-gen1", got.ID)
}

func TestDestroyLeaseTreatsGoneAsDoneAndSweepsButKeeps(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).Return([]sandbox.Lease{
		{ID: "sbx-1", Status: sandbox.StatusRunning},
		{ID: "sbx-kept", Status: sandbox.StatusRunning},
		{ID: "sbx-orphan", Status: sandbox.StatusRunning},
	}, nil)
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-orphan").Return(nil)
	_, err := env.ExecuteActivity(NameDestroyLease, DestroyLeaseInput{LeaseID: "sbx-1", RunKey: "run-a", Keep: "sbx-kept"})
	require.NoError(t, err)
}

func TestSweepIsSkippedWhenTheServerCannotList(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).Return(nil, &sandbox.APIError{Status: 404, Operation: "list sandboxes"})
	_, err := env.ExecuteActivity(NameDestroyLease, DestroyLeaseInput{RunKey: "run-a"})
	require.NoError(t, err)
}

func TestWorkerStopDetachesAndLeavesTheProcessForTheNextAttempt(t *testing.T) {
	env, provider := newEnv(t, nil)
	stopping := make(chan struct{})
	env.SetWorkerStopChannel(stopping)
	var (
		mu        sync.Mutex
		lastBeat  ExecuteProgress
		beatCount int
	)
	env.SetOnActivityHeartbeatListener(func(_ *activity.Info, details converter.EncodedValues) {
		mu.Lock()
		defer mu.Unlock()
		beatCount++
		assert.NoError(t, details.Get(&lastBeat))
	})
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		DoAndReturn(func(ctx context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			obs.Started(sandbox.Process{ID: "proc-1", Token: "t"})
			close(stopping) // the worker begins to shut down
			<-ctx.Done()
			assert.ErrorIs(t, context.Cause(ctx), sandbox.ErrDetached, "the provider is told to detach, not to kill")
			return sandbox.Result{}, fmt.Errorf("follow: %w", context.Cause(ctx))
		})

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, TypeDetached, appErr.Type())
	assert.False(t, appErr.NonRetryable())
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, beatCount)
	assert.Equal(t, "proc-1", lastBeat.Process.ID)
	assert.False(t, lastBeat.Ended, "the next attempt must attach, not start again")
}

func TestHeartbeatsComeWithinAShortHeartbeatTimeout(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	(&Activities{Provider: provider, Heartbeats: TestEnvironmentHeartbeats{}}).Register(env) // the default interval, longer than the timeout below
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		DoAndReturn(func(ctx context.Context, _ sandbox.Lease, _ sandbox.Command, _ sandbox.Observer) (sandbox.Result, error) {
			select { // a command that runs for several heartbeat timeouts
			case <-time.After(2 * time.Second):
				return sandbox.Result{Stdout: "done"}, nil
			case <-ctx.Done():
				return sandbox.Result{}, ctx.Err()
			}
		})
	env.ExecuteWorkflow(func(ctx workflow.Context) (sandbox.Result, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Minute,
			HeartbeatTimeout:    600 * time.Millisecond,
			RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		var res sandbox.Result
		err := workflow.ExecuteActivity(ctx, NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}}).Get(ctx, &res)
		return res, err
	})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError(), "a healthy worker's activity must not time out its heartbeat")
}

func TestHeartbeatIntervalFitsTheHeartbeatTimeout(t *testing.T) {
	for _, tc := range []struct {
		configured, timeout, want time.Duration
	}{
		{0, 0, DefaultHeartbeatInterval},
		{0, time.Minute, DefaultHeartbeatInterval},
		{0, 3 * time.Second, time.Second},
		{2 * time.Second, 0, 2 * time.Second},
		{2 * time.Second, 3 * time.Second, time.Second},
		{500 * time.Millisecond, 3 * time.Second, 500 * time.Millisecond},
	} {
		a := &Activities{HeartbeatInterval: tc.configured}
		assert.Equal(t, tc.want, a.heartbeatInterval(tc.timeout), "interval %s, heartbeat timeout %s", tc.configured, tc.timeout)
	}
}

func TestCreateLeaseStepsOverItsOwnDiscardedSandbox(t *testing.T) {
	env, provider := newEnv(t, nil)
	var keys []string
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
			keys = append(keys, spec.IdempotencyKey)
			if spec.IdempotencyKey == keys[0] {
				// An earlier attempt created this key's sandbox, then
				// destroyed it because it could not be made ready.
				return sandbox.Lease{}, &sandbox.LeaseGoneError{LeaseID: "sbx-discarded", Status: sandbox.StatusDestroyed}
			}
			return lease, nil
		}).Times(4)
	in := CreateLeaseInput{Spec: sandbox.LeaseSpec{Shape: "s-1vcpu-1gb"}, RunKey: "run-a"}
	for range 2 { // two attempts of the activity
		val, err := env.ExecuteActivity(NameCreateLease, in)
		require.NoError(t, err, "a gone sandbox is stepped over, not a SandboxLeaseGone")
		var got sandbox.Lease
		require.NoError(t, val.Get(&got))
		assert.Equal(t, lease.ID, got.ID)
	}
	require.Len(t, keys, 4)
	assert.NotEqual(t, keys[0], keys[1], "another sandbox, under another key")
	assert.Equal(t, keys[:2], keys[2:], "every attempt walks the same keys, so a lost response on the way stays harmless")
}

func TestCreateLeaseGivesUpAfterAFewGoneSandboxes(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		Return(sandbox.Lease{}, &sandbox.LeaseGoneError{LeaseID: "sbx-failed", Status: sandbox.StatusFailed}).Times(maxGoneCreates + 1)
	_, err := env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeLeaseGone, appErr.Type())
}

func TestFollowContextKillsOnCancellationAndDetachesWhenTheAttemptIsNoLongerCurrent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cause  error
		detach bool
	}{
		{"cancellation requested", temporal.NewCanceledError(), false},
		{"plain cancel", context.Canceled, false},
		{"attempt deadline", context.DeadlineExceeded, false},
		{"activity reset", activity.ErrActivityReset, false},
		{"attempt unknown to the server", serviceerror.NewNotFound("invalid activityID or activity already timed out"), true},
		{"server unreachable for the heartbeat timeout", serviceerror.NewUnavailable("connection refused"), true},
		{"activity paused", activity.ErrActivityPaused, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			runCtx, release := followContext(ctx, nil)
			defer release()
			cancel(tc.cause)
			<-runCtx.Done()
			assert.Equal(t, tc.detach, errors.Is(context.Cause(runCtx), sandbox.ErrDetached), "cause %v", context.Cause(runCtx))
		})
	}
}

func TestCreateLeaseDestroysASandboxItCouldNotSetUp(t *testing.T) {
	env, provider := newEnv(t, nil)
	setupFailure := &sandbox.APIError{Status: 503, Operation: "exec"}
	gomock.InOrder(
		provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
			Return(sandbox.Lease{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-half", Err: setupFailure}),
		provider.EXPECT().DestroyLease(gomock.Any(), "sbx-half").Return(nil),
	)
	_, err := env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeAPI, appErr.Type(), "the setup failure, not a cleanup error: nothing is left to clean up")
	assert.False(t, appErr.NonRetryable())
}

func TestCreateLeaseKeepsTheCleanupErrorWhenTheSandboxStillCannotBeDestroyed(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		Return(sandbox.Lease{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-half", Err: &sandbox.APIError{Status: 503, Operation: "exec"}})
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-half").Return(&sandbox.UnavailableError{Operation: "destroy sandbox"}).Times(redestroys)
	_, err := env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeCleanup, appErr.Type())
}

// A destroy that fails is repeated: one that then works saves the run a
// compensation.
func TestCreateLeaseRepeatsTheDestroyOfAHalfMadeSandbox(t *testing.T) {
	env, provider := newEnv(t, nil)
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		Return(sandbox.Lease{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-half", Err: &sandbox.UnavailableError{Operation: "exec"}})
	gomock.InOrder(
		provider.EXPECT().DestroyLease(gomock.Any(), "sbx-half").Return(&sandbox.APIError{Status: 503, Operation: "destroy sandbox"}),
		provider.EXPECT().DestroyLease(gomock.Any(), "sbx-half").Return(nil),
	)
	_, err := env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeUnavailable, appErr.Type(), "the setup failure: nothing is left to clean up")
}

// recordedMetrics is what a recordingHandler saw: counter sums and timer
// counts, by metric name and our own tags (reason, stream).
type recordedMetrics struct {
	mu       sync.Mutex
	counters map[string]int64
	timers   map[string]int
}

func (r *recordedMetrics) counter(name string, tags ...string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counters[metricKey(name, tags...)]
}

func (r *recordedMetrics) timer(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.timers[name]
}

func metricKey(name string, tags ...string) string { return name + "{" + strings.Join(tags, ",") + "}" }

// recordingHandler is a client.MetricsHandler that records into rec.
type recordingHandler struct {
	rec  *recordedMetrics
	tags map[string]string
}

func (h recordingHandler) WithTags(tags map[string]string) client.MetricsHandler {
	merged := maps.Clone(h.tags)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, tags)
	return recordingHandler{rec: h.rec, tags: merged}
}

func (h recordingHandler) key(name string) string {
	var ours []string
	for _, tag := range []string{metrics.TagReason, metrics.TagStream} {
		if v, ok := h.tags[tag]; ok {
			ours = append(ours, v)
		}
	}
	return metricKey(name, ours...)
}

type counterFunc func(int64)

func (f counterFunc) Inc(d int64) { f(d) }

type timerFunc func(time.Duration)

func (f timerFunc) Record(d time.Duration) { f(d) }

func (h recordingHandler) Counter(name string) client.MetricsCounter {
	key := h.key(name)
	return counterFunc(func(d int64) {
		h.rec.mu.Lock()
		defer h.rec.mu.Unlock()
		h.rec.counters[key] += d
	})
}

func (h recordingHandler) Gauge(name string) client.MetricsGauge {
	return client.MetricsNopHandler.Gauge(name)
}

func (h recordingHandler) Timer(name string) client.MetricsTimer {
	return timerFunc(func(time.Duration) {
		h.rec.mu.Lock()
		defer h.rec.mu.Unlock()
		h.rec.timers[name]++
	})
}

// newMeteredEnv is newEnv with the activities' metrics recorded.
func newMeteredEnv(t *testing.T) (*testsuite.TestActivityEnvironment, *sandboxmock.MockProvider, *recordedMetrics) {
	t.Helper()
	rec := &recordedMetrics{counters: map[string]int64{}, timers: map[string]int{}}
	var suite testsuite.WorkflowTestSuite
	suite.SetMetricsHandler(recordingHandler{rec: rec})
	env := suite.NewTestActivityEnvironment()
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	(&Activities{Provider: provider, HeartbeatInterval: time.Hour, Heartbeats: TestEnvironmentHeartbeats{}}).Register(env)
	return env, provider, rec
}

func TestLeaseActivitiesCountCreatedDestroyedLeakedAndCompensations(t *testing.T) {
	env, provider, rec := newMeteredEnv(t)
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(lease, nil)
	_, err := env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})
	require.NoError(t, err)
	assert.Equal(t, int64(1), rec.counter(metrics.LeasesCreated))
	assert.Zero(t, rec.counter(metrics.Compensations), "a first lease is no compensation")

	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).Return([]sandbox.Lease{
		{ID: "sbx-2", Status: sandbox.StatusRunning, Labels: map[string]string{LabelGeneration: "0"}},
		{ID: "sbx-3", Status: sandbox.StatusRunning, Labels: map[string]string{LabelGeneration: "0"}},
	}, nil)
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil)
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-3").Return(&sandbox.UnavailableError{Operation: "destroy sandbox"})
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(sandbox.Lease{ID: "sbx-4"}, nil)
	_, err = env.ExecuteActivity(NameAcquireFreshLease, AcquireFreshLeaseInput{Replacing: "sbx-1", RunKey: "run-a", Generation: 1})
	require.NoError(t, err, "a failed sweep does not cost the fresh lease")
	assert.Equal(t, int64(1), rec.counter(metrics.LeasesDestroyed), "the orphan; the replaced lease was counted when the workflow destroyed it")
	assert.Equal(t, int64(1), rec.counter(metrics.LeaksSuspected))
	assert.Equal(t, int64(1), rec.counter(metrics.Compensations), "a successful AcquireFreshLease is one compensation")

	// The release sweeps what that sweep missed.
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).Return([]sandbox.Lease{
		{ID: "sbx-3", Status: sandbox.StatusRunning, Labels: map[string]string{LabelGeneration: "0"}},
	}, nil)
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-3").Return(nil)
	_, err = env.ExecuteActivity(NameDestroyLease, DestroyLeaseInput{RunKey: "run-a", Keep: "sbx-4"})
	require.NoError(t, err)
	assert.Equal(t, int64(2), rec.counter(metrics.LeasesCreated))
	assert.Equal(t, int64(2), rec.counter(metrics.LeasesDestroyed))
	assert.Equal(t, int64(2), rec.counter(metrics.LeaksSuspected))
}

// A create whose sandbox could not be set up, nor destroyed at first, is
// destroyed once more; when that works the activity fails with the setup
// failure's type, not with that of the stale DELETE failure joined to it.
func TestCreateLeaseReportsTheSetupFailureNotTheStaleDestroyFailure(t *testing.T) {
	env, provider := newEnv(t, nil)
	setup := &sandbox.UnavailableError{Operation: "wait for sandbox"}
	staleDelete := &sandbox.APIError{Status: 503, Operation: "destroy sandbox"}
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(sandbox.Lease{}, &sandbox.CleanupError{
		Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-half", Err: fmt.Errorf("%w; then %w", setup, staleDelete)})
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-half").Return(nil)

	_, err := env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})

	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, sandbox.TypeUnavailable, appErr.Type())
	assert.False(t, appErr.NonRetryable())
	assert.NotContains(t, appErr.Error(), "destroy sandbox")
}

func TestCreateLeaseCountsACleanupErrorByReason(t *testing.T) {
	env, provider, rec := newMeteredEnv(t)
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		Return(sandbox.Lease{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-half", Err: &sandbox.APIError{Status: 503, Operation: "exec"}})
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-half").Return(&sandbox.UnavailableError{Operation: "destroy sandbox"}).Times(redestroys)
	_, err := env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})
	require.Error(t, err)
	assert.Equal(t, int64(1), rec.counter(metrics.CleanupErrors, string(sandbox.TerminationUnconfirmed)))
	assert.Zero(t, rec.counter(metrics.LeasesCreated))

	// The same failure, but the sandbox can be destroyed: no cleanup error.
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		Return(sandbox.Lease{}, &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: "sbx-half", Err: &sandbox.APIError{Status: 503, Operation: "exec"}})
	provider.EXPECT().DestroyLease(gomock.Any(), "sbx-half").Return(nil)
	_, err = env.ExecuteActivity(NameCreateLease, CreateLeaseInput{RunKey: "run-a"})
	require.Error(t, err)
	assert.Equal(t, int64(1), rec.counter(metrics.CleanupErrors, string(sandbox.TerminationUnconfirmed)))
	assert.Equal(t, int64(1), rec.counter(metrics.LeasesDestroyed))
}

func TestExecuteCountsBytesDurationAndFailures(t *testing.T) {
	env, provider, rec := newMeteredEnv(t)
	run := func(err error) {
		provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
			DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
				obs.Started(sandbox.Process{ID: "proc-1"})
				obs.Output(sandbox.Chunk{Seq: 1, Stream: sandbox.Stdout, Text: "hello", Bytes: 5})
				obs.Output(sandbox.Chunk{Seq: 2, Stream: sandbox.Stderr, Text: "oops", Bytes: 4})
				obs.Output(sandbox.Chunk{Seq: 3, Stream: sandbox.Stdout, Text: "!", Bytes: 1})
				return sandbox.Result{ExitCode: 1}, err
			})
		_, _ = env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"x"}}})
	}

	run(nil)
	assert.Equal(t, int64(6), rec.counter(metrics.OutputBytes, string(sandbox.Stdout)))
	assert.Equal(t, int64(4), rec.counter(metrics.OutputBytes, string(sandbox.Stderr)))
	assert.Equal(t, 1, rec.timer(metrics.CommandDuration), "a non-zero exit is a result: timed")

	run(&sandbox.ConnectionExhaustedError{LeaseID: lease.ID, ProcessID: "proc-1", Attempts: 4})
	assert.Equal(t, int64(1), rec.counter(metrics.ConnectionExhaustionRetries))
	run(&sandbox.CleanupError{Reason: sandbox.CreationUnconfirmed, LeaseID: lease.ID})
	assert.Equal(t, int64(1), rec.counter(metrics.CleanupErrors, string(sandbox.CreationUnconfirmed)))
	assert.Equal(t, 1, rec.timer(metrics.CommandDuration), "failed attempts are not timed")
	assert.Equal(t, int64(18), rec.counter(metrics.OutputBytes, string(sandbox.Stdout)), "bytes read count whatever the outcome")

	// A re-attached command started in an earlier attempt: its duration is
	// unknown here, so it is not timed.
	env.SetHeartbeatDetails(ExecuteProgress{Process: sandbox.Process{ID: "proc-7"}})
	provider.EXPECT().Attach(gomock.Any(), lease, sandbox.Process{ID: "proc-7"}, gomock.Any()).Return(sandbox.Result{}, nil)
	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"x"}}})
	require.NoError(t, err)
	assert.Equal(t, 1, rec.timer(metrics.CommandDuration))
}

// recordBeats records every heartbeat of env's activities and returns
// what has been recorded so far, a copy safe to read while beats come in.
func recordBeats(t *testing.T, env *testsuite.TestActivityEnvironment) func() []ExecuteProgress {
	var (
		mu    sync.Mutex
		beats []ExecuteProgress
	)
	env.SetOnActivityHeartbeatListener(func(_ *activity.Info, details converter.EncodedValues) {
		var p ExecuteProgress
		assert.NoError(t, details.Get(&p))
		mu.Lock()
		beats = append(beats, p)
		mu.Unlock()
	})
	return func() []ExecuteProgress {
		mu.Lock()
		defer mu.Unlock()
		return append([]ExecuteProgress(nil), beats...)
	}
}
