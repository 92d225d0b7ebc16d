package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// updateOutcome is what became of one Update sent in a test.
type updateOutcome struct {
	accepted, rejected, completed bool
	rejection                     error
	value                         any
	err                           error
}

// decode converts the Update's returned value into out.
func (o *updateOutcome) decode(t *testing.T, out any) {
	t.Helper()
	require.True(t, o.completed, "the update completed")
	require.NoError(t, o.err)
	data, err := json.Marshal(o.value)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, out))
}

// updates sends Updates to the session under test from delayed callbacks.
type updates struct {
	h *harness
	n int
}

// send sends the Updates in order, from one callback after delay.
func (u *updates) send(delay time.Duration, calls ...updateCall) []*updateOutcome {
	outcomes := make([]*updateOutcome, len(calls))
	for i := range calls {
		outcomes[i] = &updateOutcome{}
	}
	u.h.env.RegisterDelayedCallback(func() {
		for i, call := range calls {
			o := outcomes[i]
			u.n++
			u.h.env.UpdateWorkflow(call.name, fmt.Sprintf("update-%d", u.n), o.callback(), call.args...)
		}
	}, delay)
	return outcomes
}

// callback records an Update's outcome in o.
func (o *updateOutcome) callback() *testsuite.TestUpdateCallback {
	return &testsuite.TestUpdateCallback{
		OnAccept:   func() { o.accepted = true },
		OnReject:   func(err error) { o.rejected, o.rejection = true, err },
		OnComplete: func(v any, err error) { o.completed, o.value, o.err = true, v, err },
	}
}

type updateCall struct {
	name string
	args []any
}

func execCall(argv ...string) updateCall {
	return updateCall{UpdateExecute, []any{SessionCommand{Command: sandbox.Command{Argv: argv}}}}
}

var closeCall = updateCall{name: UpdateClose}

func (h *harness) runSession(req SessionRequest) (SessionSummary, error) {
	h.env.ExecuteWorkflow(SessionWorkflow, req)
	if !h.env.IsWorkflowCompleted() {
		return SessionSummary{}, errors.New("session did not complete")
	}
	if err := h.env.GetWorkflowError(); err != nil {
		return SessionSummary{}, err
	}
	var summary SessionSummary
	return summary, h.env.GetWorkflowResult(&summary)
}

// echo answers Execute with the command's arguments as stdout, on the lease
// it was given, and records the order of the calls.
type echo struct {
	mu    sync.Mutex
	calls []string // "lease:argv"
}

func (e *echo) execute(_ context.Context, lease sandbox.Lease, cmd sandbox.Command, _ sandbox.Observer) (sandbox.Result, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, lease.ID+":"+cmd.String())
	return sandbox.Result{ProcessID: "p", Stdout: cmd.String()}, nil
}

func sessionRequest() SessionRequest {
	return SessionRequest{Lease: sandbox.LeaseSpec{Shape: "s-1vcpu-1gb"}, IdleTimeout: -1}
}

func TestSessionRunsCommandsOneAtATimeInOrder(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(3)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), execCall("two"), execCall("three"), closeCall)
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	assert.Equal(t, []string{"sbx-1:one", "sbx-1:two", "sbx-1:three"}, e.calls, "in the order accepted, one lease")
	for i, want := range []string{"one", "two", "three"} {
		var res SessionResult
		got[i].decode(t, &res)
		assert.Equal(t, want, res.Stdout)
		assert.Equal(t, i+1, res.Seq)
		assert.Equal(t, "sbx-1", res.LeaseID)
		assert.False(t, res.WorkspaceReset)
	}
	assert.Equal(t, SessionSummary{Commands: 3, DestroyedLeases: []string{"sbx-1"}}, summary)
}

func TestSessionCompensatesACleanupErrorAndSaysTheWorkspaceWasReset(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(2)
	h.expectNoOrphans()
	var e echo
	gomock.InOrder(
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).DoAndReturn(e.execute),
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).Return(sandbox.Result{}, cleanupError("sbx-1")),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil), // given up, once
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-2"), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(2),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil),
	)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), execCall("two"), execCall("three"), closeCall)
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	var first, second, third SessionResult
	got[0].decode(t, &first)
	got[1].decode(t, &second)
	got[2].decode(t, &third)
	assert.Equal(t, SessionResult{Result: sandbox.Result{ProcessID: "p", Stdout: "one"}, Seq: 1, LeaseID: "sbx-1"}, first)
	assert.Equal(t, SessionResult{Result: sandbox.Result{ProcessID: "p", Stdout: "two"}, Seq: 2, LeaseID: "sbx-2", WorkspaceReset: true, FreshLeases: 1}, second)
	assert.Equal(t, SessionResult{Result: sandbox.Result{ProcessID: "p", Stdout: "three"}, Seq: 3, LeaseID: "sbx-2"}, third, "the fresh lease is the session's from now on")
	assert.Equal(t, []string{"sbx-1:one", "sbx-2:two", "sbx-2:three"}, e.calls)
	assert.Equal(t, SessionSummary{Commands: 3, FreshLeases: 1, DestroyedLeases: []string{"sbx-1", "sbx-2"}}, summary)
}

// leaseStatus is a mocked lease's state across pause and resume.
type leaseStatus struct {
	mu                    sync.Mutex
	status                sandbox.LeaseStatus
	pauses, resumes, gets int
}

func (l *leaseStatus) expect(h *harness) {
	h.provider.EXPECT().PauseLease(gomock.Any(), "sbx-1").DoAndReturn(func(context.Context, string) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.pauses++
		l.status = sandbox.StatusPaused
		return nil
	}).AnyTimes()
	h.provider.EXPECT().ResumeLease(gomock.Any(), "sbx-1").DoAndReturn(func(context.Context, string) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.resumes++
		l.status = sandbox.StatusRunning
		return nil
	}).AnyTimes()
	h.provider.EXPECT().GetLease(gomock.Any(), "sbx-1").DoAndReturn(func(context.Context, string) (sandbox.Lease, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.gets++
		return sandbox.Lease{ID: "sbx-1", Status: l.status, Workspace: "/workspace"}, nil
	}).AnyTimes()
}

func TestSessionPausesAnIdleLeaseAndTheNextCommandResumesIt(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	lease := &leaseStatus{status: sandbox.StatusRunning}
	lease.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(
		func(ctx context.Context, l sandbox.Lease, cmd sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			lease.mu.Lock()
			status := lease.status
			lease.mu.Unlock()
			require.Equal(t, sandbox.StatusRunning, status, "a command never runs on a paused lease")
			return e.execute(ctx, l, cmd, obs)
		}).Times(2)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)

	u := &updates{h: h}
	first := u.send(time.Second, execCall("one"))
	var whileIdle SessionState
	h.env.RegisterDelayedCallback(func() {
		value, err := h.env.QueryWorkflow(StateQuery)
		require.NoError(t, err)
		require.NoError(t, value.Get(&whileIdle))
	}, 30*time.Minute)
	second := u.send(time.Hour, execCall("two"))
	u.send(2*time.Hour, closeCall)
	req := sessionRequest()
	req.IdleTimeout = 10 * time.Minute
	_, err := h.runSession(req)
	require.NoError(t, err)

	var r1, r2 SessionResult
	first[0].decode(t, &r1)
	second[0].decode(t, &r2)
	assert.Equal(t, "sbx-1", r2.LeaseID, "the same lease, resumed")
	assert.False(t, r2.WorkspaceReset)
	assert.True(t, whileIdle.Paused, "paused after the idle timeout")
	assert.Equal(t, PhasePaused, whileIdle.Phase)
	assert.Equal(t, 1, whileIdle.Commands)
	assert.Equal(t, 2, lease.pauses, "paused after each command's idle timeout")
	assert.Equal(t, 1, lease.resumes, "resumed for the second command only")
}

// A busy session sets one idle timer, not one a command, and keeps its
// phase search attribute through its commands: only the lease's changes
// (created, paused, released) are upserted.
func TestABusySessionKeepsOneIdleTimerAndItsPhase(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	lease := &leaseStatus{status: sandbox.StatusRunning}
	lease.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(10)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	require.NoError(t, h.env.SetTypedSearchAttributesOnStart(temporal.NewSearchAttributes(
		temporal.NewSearchAttributeKeyKeyword(SearchAttributePhase).ValueSet("scheduled"))))
	var phases []string
	h.env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		if v, ok := args.Get(0).(temporal.SearchAttributes).GetKeyword(temporal.NewSearchAttributeKeyKeyword(SearchAttributePhase)); ok {
			phases = append(phases, v)
		}
	}).Return(nil)
	var timers []time.Duration
	cancelled := 0
	h.env.SetOnTimerScheduledListener(func(_ string, d time.Duration) { timers = append(timers, d) })
	h.env.SetOnTimerCanceledListener(func(string) { cancelled++ })

	u := &updates{h: h}
	for i := range 10 { // one a second
		u.send(time.Duration(i+1)*time.Second, execCall("cmd"))
	}
	state := func(at time.Duration) *SessionState {
		var s SessionState
		h.env.RegisterDelayedCallback(func() {
			value, err := h.env.QueryWorkflow(StateQuery)
			require.NoError(t, err)
			require.NoError(t, value.Get(&s))
		}, at)
		return &s
	}
	early, late := state(5*time.Minute+5*time.Second), state(6*time.Minute)
	u.send(time.Hour, closeCall)
	req := sessionRequest()
	req.IdleTimeout = 5 * time.Minute
	summary, err := h.runSession(req)
	require.NoError(t, err)

	assert.Equal(t, 10, summary.Commands)
	assert.False(t, early.Paused, "five minutes after the first command, not after the last")
	assert.True(t, late.Paused, "paused five minutes after the last command")
	assert.Equal(t, 1, lease.pauses)
	require.Len(t, timers, 2, "the idle timer, then what was left of the timeout once it fired: %v", timers)
	assert.Equal(t, 5*time.Minute, timers[0])
	assert.Less(t, timers[1], time.Minute)
	assert.Zero(t, cancelled, "no timer set and cancelled for each command")
	assert.Equal(t, []string{"creating-lease", "idle", "pausing", "paused", "cleaning-up", "closed"}, phases)
}

func TestSessionContinuesAsNewCarryingItsLease(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(2)
	// No DestroyLease: the lease goes on into the next run.

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), execCall("two"))
	req := sessionRequest()
	req.CommandsPerRun = 2
	_, err := h.runSession(req)
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, err, &can)
	for _, o := range got {
		assert.True(t, o.completed, "every accepted update is answered before continuing as new")
	}
	var next SessionRequest
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.NotNil(t, next.Carried)
	require.NotNil(t, next.Carried.Lease)
	assert.Equal(t, "sbx-1", next.Carried.Lease.ID)
	assert.Equal(t, "/workspace", next.Carried.Lease.Workspace)
	assert.Equal(t, 2, next.Carried.Commands)
	assert.Equal(t, 1, next.Carried.NextGeneration)
	assert.Equal(t, SessionWorkflowName, can.WorkflowType.Name)

	// The next run uses the carried lease: no create, the same lease,
	// numbering goes on; close destroys it.
	h2 := newHarness(t)
	h2.expectNoOrphans()
	var e2 echo
	h2.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).DoAndReturn(e2.execute)
	h2.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	u2 := &updates{h: h2, n: u.n} // new Update ids: the old ones are answered already
	third := u2.send(time.Second, execCall("three"), closeCall)
	summary, err := h2.runSession(next)
	require.NoError(t, err)
	var r3 SessionResult
	third[0].decode(t, &r3)
	assert.Equal(t, 3, r3.Seq)
	assert.Equal(t, "sbx-1", r3.LeaseID)
	assert.False(t, r3.WorkspaceReset)
	assert.Equal(t, 3, summary.Commands)
}

func TestSessionValidatorRejectsBadInputBeforeHistory(t *testing.T) {
	h := newHarness(t) // no Execute expected: the bad command never runs
	h.expectNoOrphans()
	u := &updates{h: h}
	bad := updateCall{UpdateExecute, []any{SessionCommand{Command: sandbox.Command{Argv: []string{"echo"}, Env: map[string]string{"BAD;KEY": "v"}}}}}
	noProgram := updateCall{UpdateExecute, []any{SessionCommand{Command: sandbox.Command{}}}}
	got := u.send(time.Second, bad, noProgram, closeCall, execCall("too late"))
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	for _, o := range got[:2] {
		assert.True(t, o.rejected)
		assert.False(t, o.accepted)
		assert.Equal(t, sandbox.TypeInvalidInput, applicationErrorType(o.rejection))
	}
	assert.True(t, got[3].rejected, "a closing session accepts nothing")
	assert.Equal(t, TypeSessionClosed, applicationErrorType(got[3].rejection))
	assert.Equal(t, SessionSummary{}, summary)
}

func TestCancelledSessionDestroysItsLease(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	u := &updates{h: h}
	u.send(time.Second, execCall("one"))
	h.env.RegisterDelayedCallback(h.env.CancelWorkflow, time.Hour)
	_, err := h.runSession(sessionRequest())
	var canceled *temporal.CanceledError
	require.ErrorAs(t, err, &canceled)
}

func TestSessionOnALeaseThatIsGoneTakesAFreshOne(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().GetLease(gomock.Any(), "sbx-old").Return(sandbox.Lease{}, &sandbox.LeaseGoneError{LeaseID: "sbx-old"})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-old").Return(nil).Times(1)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).DoAndReturn(e.execute)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), closeCall)
	req := sessionRequest()
	req.LeaseID = "sbx-old"
	summary, err := h.runSession(req)
	require.NoError(t, err)
	var res SessionResult
	got[0].decode(t, &res)
	assert.Equal(t, "sbx-1", res.LeaseID)
	assert.Equal(t, 1, res.FreshLeases)
	assert.True(t, res.WorkspaceReset, "the workspace of the lease it was given is gone")
	assert.Equal(t, []string{"sbx-old", "sbx-1"}, summary.DestroyedLeases)
}
