package workflows

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// A negative MaxFreshLeases disables compensation in a session too: a
// lease found gone on resume is given up, and the command fails with
// SandboxCompensationExhausted instead of taking a fresh lease.
func TestSessionWithoutCompensationTakesNoFreshLease(t *testing.T) {
	h := newHarness(t) // no CreateLease expected: no lease is taken
	h.expectNoOrphans()
	h.provider.EXPECT().GetLease(gomock.Any(), "sbx-old").Return(sandbox.Lease{}, &sandbox.LeaseGoneError{LeaseID: "sbx-old"})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-old").Return(nil)
	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), closeCall)
	req := sessionRequest()
	req.LeaseID, req.MaxFreshLeases = "sbx-old", -1
	summary, err := h.runSession(req)
	require.NoError(t, err)

	require.True(t, got[0].completed)
	require.Error(t, got[0].err)
	assert.True(t, IsCompensationExhausted(got[0].err), "error: %v", got[0].err)
	assert.Zero(t, summary.FreshLeases)
	assert.Equal(t, []string{"sbx-old"}, summary.DestroyedLeases)
}

// A lease found gone while idle costs the next command one fresh lease of
// its budget, counted in that command's FreshLeases.
func TestSessionLeaseGoneWhileIdleCostsTheNextCommand(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(2)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(2)
	h.provider.EXPECT().PauseLease(gomock.Any(), "sbx-1").Return(&sandbox.LeaseGoneError{LeaseID: "sbx-1"})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil)
	u := &updates{h: h}
	u.send(time.Second, execCall("one"))
	second := u.send(time.Hour, execCall("two"))
	u.send(time.Hour+time.Minute, closeCall) // before the fresh lease idles
	req := sessionRequest()
	req.IdleTimeout = 10 * time.Minute
	summary, err := h.runSession(req)
	require.NoError(t, err)

	var r2 SessionResult
	second[0].decode(t, &r2)
	assert.Equal(t, "sbx-2", r2.LeaseID)
	assert.Equal(t, 1, r2.FreshLeases)
	assert.True(t, r2.WorkspaceReset)
	assert.Equal(t, 1, summary.FreshLeases)
}

// sendUpdateWithID sends one Update with the given id from a delayed callback.
func sendUpdateWithID(h *harness, delay time.Duration, id string, call updateCall) *updateOutcome {
	o := &updateOutcome{}
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(call.name, id, o.callback(), call.args...)
	}, delay)
	return o
}

// The server deduplicates Update ids within one run only. An execute
// Update repeated on the next run, after a continue-as-new, gets the
// answer the session recorded, and the command does not run again.
func TestSessionAnswersAnUpdateRepeatedAfterContinueAsNew(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(1)
	first := sendUpdateWithID(h, time.Second, "caller-run/5", execCall("one"))
	req := sessionRequest()
	req.CommandsPerRun = 1
	_, err := h.runSession(req)
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, err, &can)
	var next SessionRequest
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.Len(t, next.Carried.Answered, 1)
	next.CommandsPerRun = 10

	h2 := newHarness(t)
	h2.expectNoOrphans()
	var e2 echo
	h2.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e2.execute).Times(1)
	h2.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	repeat := sendUpdateWithID(h2, time.Second, "caller-run/5", execCall("one"))
	other := sendUpdateWithID(h2, 2*time.Second, "caller-run/7", execCall("two"))
	sendUpdateWithID(h2, 3*time.Second, "caller-run/9", closeCall)
	summary, err := h2.runSession(next)
	require.NoError(t, err)

	var r1, again, r2 SessionResult
	first.decode(t, &r1)
	repeat.decode(t, &again)
	other.decode(t, &r2)
	assert.Equal(t, r1, again, "the recorded answer")
	assert.Equal(t, []string{"sbx-1:one"}, e.calls)
	assert.Equal(t, []string{"sbx-1:two"}, e2.calls, "the repeat did not run again")
	assert.Equal(t, 2, r2.Seq)
	assert.Equal(t, 2, summary.Commands)
}

// A recorded failure is answered as it was, details included.
func TestSessionAnswersARepeatedFailureWithItsDetails(t *testing.T) {
	s := &session{}
	details := CompensationDetails{FreshLeases: 1, DestroyedLeases: []string{"sbx-1", "sbx-2"}}
	s.remember("u", AnsweredUpdate{Result: SessionResult{Seq: 3}}, roundTrip(t, temporal.NewNonRetryableApplicationError("no usable lease", TypeCompensationExhausted, nil, details)))

	a, ok := s.answered("u")
	require.True(t, ok)
	err := roundTrip(t, a.Error.err())
	assert.True(t, IsCompensationExhausted(err))
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.True(t, appErr.NonRetryable())
	var got CompensationDetails
	require.NoError(t, appErr.Details(&got))
	assert.Equal(t, details, got)
}

// Memory of answers is bounded in number and in output bytes.
func TestSessionRemembersABoundedNumberOfAnswers(t *testing.T) {
	s := &session{}
	big := string(make([]byte, maxRememberedOutput/2))
	for i := range DefaultRememberedUpdates + 5 {
		s.remember(string(rune('a'+i)), AnsweredUpdate{Result: SessionResult{Result: sandbox.Result{Stdout: big}, Seq: i + 1}}, nil)
	}
	require.Len(t, s.answers, DefaultRememberedUpdates)
	assert.Equal(t, 6, s.answers[0].Result.Seq, "the oldest are forgotten")
	kept := 0
	for _, a := range s.answers {
		kept += len(a.Result.Stdout)
		if a.Result.Stdout == "" {
			assert.True(t, a.Result.Truncated)
		}
	}
	assert.LessOrEqual(t, kept, maxRememberedOutput)
	assert.Equal(t, big, s.answers[len(s.answers)-1].Result.Stdout, "the newest keeps its output")
}

// SessionRequest.RememberedUpdates sets how many answers are kept, and
// is validated.
func TestSessionRemembersAsManyAnswersAsAsked(t *testing.T) {
	s := &session{req: SessionRequest{RememberedUpdates: 100}}
	for i := range 150 {
		s.remember(fmt.Sprint(i), AnsweredUpdate{Result: SessionResult{Seq: i + 1}}, nil)
	}
	require.Len(t, s.answers, 100)
	_, ok := s.answered("50")
	assert.True(t, ok, "the 100th newest is remembered")
	_, ok = s.answered("49")
	assert.False(t, ok)

	for _, n := range []int{-1, MaxRememberedUpdates + 1} {
		err := SessionRequest{RememberedUpdates: n}.Validate()
		var invalid *sandbox.InvalidInputError
		require.ErrorAs(t, err, &invalid, "%d", n)
		assert.Equal(t, "rememberedUpdates", invalid.Field)
	}
	require.NoError(t, SessionRequest{RememberedUpdates: MaxRememberedUpdates}.Validate())
}

// roundTrip sends err through the failure converter, as a failure
// travels between a workflow, the server and an activity.
func roundTrip(t *testing.T, err error) error {
	t.Helper()
	fc := temporal.GetDefaultFailureConverter()
	return fc.FailureToError(fc.ErrorToFailure(err))
}

// The UpdateSession activity passes a session's failure on with its
// details (CompensationDetails), not only its type and message.
func TestUpdateSessionKeepsTheFailureDetails(t *testing.T) {
	details := CompensationDetails{FreshLeases: 2, DestroyedLeases: []string{"sbx-1"}}
	answer := roundTrip(t, temporal.NewNonRetryableApplicationError("no usable lease", TypeCompensationExhausted, nil, details))

	err := roundTrip(t, passOn(answer))

	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, TypeCompensationExhausted, appErr.Type())
	assert.True(t, appErr.NonRetryable())
	var got CompensationDetails
	require.NoError(t, appErr.Details(&got))
	assert.Equal(t, details, got)
}

// A request whose JSON would not fit one Temporal payload is refused by
// Validate, so that neither the starter nor the execute Update's
// validator lets it near a lease.
func TestRequestOverThePayloadLimitIsInvalid(t *testing.T) {
	argv := []string{"echo"}
	for range 3 {
		argv = append(argv, strings.Repeat("<", 100_000)) // 6 bytes each in JSON
	}
	err := SessionCommand{Command: sandbox.Command{Argv: argv}}.Validate()
	var invalid *sandbox.InvalidInputError
	require.ErrorAs(t, err, &invalid)
	assert.Equal(t, "request", invalid.Field)
	assert.Contains(t, err.Error(), "Temporal payload")
}
