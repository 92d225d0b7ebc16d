package workflows

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

var forkCall = updateCall{name: UpdateFork}

// sweeps records the run key of every sweep (ListLeases by run label).
type sweeps struct {
	mu   sync.Mutex
	runs []string
}

func (s *sweeps) expect(h *harness) {
	h.provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, labels map[string]string) ([]sandbox.Lease, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.runs = append(s.runs, labels[activities.LabelRun])
		return nil, nil
	}).AnyTimes()
}

func (s *sweeps) of(run string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.runs {
		if r == run {
			n++
		}
	}
	return n
}

// forkedLease answers ForkLease with sbx-fork, labelled as asked, and
// records the spec.
func (h *harness) expectFork(specs *[]sandbox.ForkSpec) *sandboxmock.MockProviderForkLeaseCall {
	return h.provider.EXPECT().ForkLease(gomock.Any(), "sbx-1", gomock.Any()).
		DoAndReturn(func(_ context.Context, _ string, spec sandbox.ForkSpec) (sandbox.Lease, error) {
			*specs = append(*specs, spec)
			return sandbox.Lease{ID: "sbx-fork", Status: sandbox.StatusRunning, Workspace: "/workspace", Labels: spec.Labels}, nil
		})
}

// The scenario on a mocked provider: a command, a fork, a command
// in each session; each runs on its own lease, and closing both destroys
// both, the fork's sweep looking for the fork's run.
func TestSessionForksIntoANewSessionOnACopyOfItsLease(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	var swept sweeps
	swept.expect(h)
	lease := &leaseStatus{status: sandbox.StatusRunning}
	lease.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(3)
	var specs []sandbox.ForkSpec
	h.expectFork(&specs).Times(1)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-fork").Return(nil).Times(1)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), forkCall, execCall("two"))
	var inFork, forkClosed updateOutcome
	h.env.RegisterDelayedCallback(func() {
		var fork SessionFork
		got[1].decode(t, &fork)
		require.NoError(t, h.env.UpdateWorkflowByID(fork.SessionID, UpdateExecute, "fork-1", inFork.callback(),
			SessionCommand{Command: sandbox.Command{Argv: []string{"three"}}}))
		require.NoError(t, h.env.UpdateWorkflowByID(fork.SessionID, UpdateClose, "fork-2", forkClosed.callback()))
	}, 2*time.Second)
	u.send(3*time.Second, closeCall)
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	var fork SessionFork
	got[1].decode(t, &fork)
	assert.True(t, strings.HasPrefix(fork.SessionID, "default-test-workflow-id/fork-"), fork.SessionID)
	assert.Equal(t, "sbx-fork", fork.LeaseID)
	require.Len(t, specs, 1)
	forkRun := specs[0].Labels[activities.LabelRun]
	assert.NotEmpty(t, forkRun)
	assert.Equal(t, "0", specs[0].Labels[activities.LabelGeneration])
	assert.Empty(t, specs[0].Egress, "the fork inherits the lease's egress")

	var two, three SessionResult
	got[2].decode(t, &two)
	inFork.decode(t, &three)
	assert.Equal(t, SessionResult{Result: sandbox.Result{ProcessID: "p", Stdout: "two"}, Seq: 2, LeaseID: "sbx-1"}, two,
		"the session goes on on its own lease, resumed")
	assert.Equal(t, SessionResult{Result: sandbox.Result{ProcessID: "p", Stdout: "three"}, Seq: 1, LeaseID: "sbx-fork"}, three,
		"the new session's first command runs on the fork, whose workspace is no reset")
	assert.ElementsMatch(t, []string{"sbx-1:one", "sbx-1:two", "sbx-fork:three"}, e.calls)
	assert.Equal(t, 1, lease.pauses, "paused for the fork")
	assert.Equal(t, 1, lease.resumes, "resumed by the next command")

	var forkSummary SessionSummary
	forkClosed.decode(t, &forkSummary)
	assert.Equal(t, SessionSummary{Commands: 1, DestroyedLeases: []string{"sbx-fork"}}, forkSummary)
	assert.Equal(t, 1, swept.of(forkRun), "the new session's release sweeps the fork's run")
	assert.Equal(t, SessionSummary{Commands: 2, DestroyedLeases: []string{"sbx-1"}}, summary)
}

// A fork that may exist but was not found fails the Update by its type;
// what it may have made is swept, and the session's own lease is left
// alone: the next command resumes it.
func TestSessionForkThatFailsLeavesTheLeaseAndSweepsTheFork(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	var swept sweeps
	swept.expect(h)
	lease := &leaseStatus{status: sandbox.StatusRunning}
	lease.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(2)
	var specs []sandbox.ForkSpec
	h.provider.EXPECT().ForkLease(gomock.Any(), "sbx-1", gomock.Any()).
		DoAndReturn(func(_ context.Context, _ string, spec sandbox.ForkSpec) (sandbox.Lease, error) {
			specs = append(specs, spec)
			return sandbox.Lease{}, &sandbox.CleanupError{Reason: sandbox.ForkUnconfirmed, LeaseID: "sbx-1"}
		}).Times(1) // not retried
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil).Times(1) // at close only

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), forkCall, execCall("two"), closeCall)
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	require.True(t, got[1].completed)
	assert.True(t, sandbox.IsCleanupError(got[1].err), "error: %v", got[1].err)
	var two SessionResult
	got[2].decode(t, &two)
	assert.Equal(t, "sbx-1", two.LeaseID)
	assert.False(t, two.WorkspaceReset)
	require.Len(t, specs, 1)
	assert.Equal(t, 1, swept.of(specs[0].Labels[activities.LabelRun]), "what the fork may have made is swept")
	assert.Equal(t, SessionSummary{Commands: 2, DestroyedLeases: []string{"sbx-1"}}, summary)
}

// A retry of ForkLease (its first attempt failed without an answer that
// proves anything) sweeps the fork's run before it forks again.
func TestSessionForkRetrySweepsTheEarlierAttemptsFork(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	var swept sweeps
	lease := &leaseStatus{status: sandbox.StatusRunning}
	lease.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(1)
	var specs []sandbox.ForkSpec
	first := h.provider.EXPECT().ForkLease(gomock.Any(), "sbx-1", gomock.Any()).
		DoAndReturn(func(_ context.Context, _ string, spec sandbox.ForkSpec) (sandbox.Lease, error) {
			specs = append(specs, spec)
			return sandbox.Lease{}, &sandbox.UnavailableError{Operation: "get sandbox"}
		})
	sweep := h.provider.EXPECT().ListLeases(gomock.Any(), gomock.Any()).After(first.Call).
		DoAndReturn(func(_ context.Context, labels map[string]string) ([]sandbox.Lease, error) {
			swept.mu.Lock()
			defer swept.mu.Unlock()
			swept.runs = append(swept.runs, labels[activities.LabelRun])
			return nil, nil
		})
	h.expectFork(&specs).After(sweep)
	swept.expect(h) // the sweeps of the closes
	h.provider.EXPECT().DestroyLease(gomock.Any(), gomock.Any()).Return(nil).Times(2)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), forkCall)
	h.env.RegisterDelayedCallback(func() {
		var fork SessionFork
		got[1].decode(t, &fork)
		require.NoError(t, h.env.UpdateWorkflowByID(fork.SessionID, UpdateClose, "fork-close", (&updateOutcome{}).callback()))
	}, time.Minute)
	u.send(2*time.Minute, closeCall)
	_, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	var fork SessionFork
	got[1].decode(t, &fork)
	assert.Equal(t, "sbx-fork", fork.LeaseID)
	require.Len(t, specs, 2)
	assert.Equal(t, specs[0].Labels, specs[1].Labels, "both attempts fork for the same run")
	assert.Equal(t, specs[0].Labels[activities.LabelRun], swept.runs[0], "the retry swept that run first")
}

// A session without a lease (no command ran yet) forks into a new session
// without one, which takes its own lease for its first command.
func TestSessionWithoutALeaseForksIntoAnEmptySession(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	var swept sweeps
	swept.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(1)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	// No PauseLease, no ForkLease: there is nothing to fork.

	u := &updates{h: h}
	got := u.send(time.Second, forkCall, closeCall)
	var inFork updateOutcome
	h.env.RegisterDelayedCallback(func() {
		var fork SessionFork
		got[0].decode(t, &fork)
		require.NoError(t, h.env.UpdateWorkflowByID(fork.SessionID, UpdateExecute, "fork-1", inFork.callback(),
			SessionCommand{Command: sandbox.Command{Argv: []string{"one"}}}))
		require.NoError(t, h.env.UpdateWorkflowByID(fork.SessionID, UpdateClose, "fork-2", (&updateOutcome{}).callback()))
	}, time.Minute)
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	var fork SessionFork
	got[0].decode(t, &fork)
	assert.Empty(t, fork.LeaseID, "no lease was forked")
	var one SessionResult
	inFork.decode(t, &one)
	assert.Equal(t, "sbx-1", one.LeaseID, "the new session created its own")
	assert.False(t, one.WorkspaceReset)
	assert.Equal(t, SessionSummary{}, summary)
}

// A fork Update repeated on the next run, after a continue-as-new, gets
// the recorded answer: it does not fork again.
func TestSessionAnswersAForkRepeatedAfterContinueAsNew(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	var swept sweeps
	swept.expect(h)
	lease := &leaseStatus{status: sandbox.StatusRunning}
	lease.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(1)
	var specs []sandbox.ForkSpec
	h.expectFork(&specs).Times(1)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-fork").Return(nil)
	sendUpdateWithID(h, time.Second, "caller-run/1", execCall("one"))
	first := sendUpdateWithID(h, time.Second, "caller-run/2", forkCall)
	h.env.RegisterDelayedCallback(func() {
		var fork SessionFork
		first.decode(t, &fork)
		require.NoError(t, h.env.UpdateWorkflowByID(fork.SessionID, UpdateClose, "fork-close", (&updateOutcome{}).callback()))
	}, time.Minute)
	req := sessionRequest()
	req.CommandsPerRun = 1
	_, err := h.runSession(req)
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, err, &can)
	var next SessionRequest
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.Len(t, next.Carried.Answered, 2)
	assert.True(t, next.Carried.Paused, "the lease stays paused after the fork")

	h2 := newHarness(t) // no ForkLease expected
	h2.expectNoOrphans()
	h2.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	repeat := sendUpdateWithID(h2, time.Second, "caller-run/2", forkCall)
	sendUpdateWithID(h2, 2*time.Second, "caller-run/3", closeCall)
	_, err = h2.runSession(next)
	require.NoError(t, err)

	var fork, again SessionFork
	first.decode(t, &fork)
	repeat.decode(t, &again)
	assert.Equal(t, fork, again)
	assert.Len(t, specs, 1, "forked once")
}

// A closing session refuses a fork before it enters history.
func TestClosingSessionRefusesAFork(t *testing.T) {
	h := newHarness(t)
	h.expectNoOrphans()
	u := &updates{h: h}
	got := u.send(time.Second, closeCall, forkCall)
	_, err := h.runSession(sessionRequest())
	require.NoError(t, err)
	assert.True(t, got[1].rejected)
	assert.Equal(t, TypeSessionClosed, applicationErrorType(got[1].rejection))
}
