package workflows

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

func setEgressCall(rules ...string) updateCall {
	return updateCall{UpdateSetEgress, []any{SessionEgress{Egress: rules}}}
}

// createdSpecs makes every CreateLease succeed with sbx-1, sbx-2, … and
// records the specs.
type createdSpecs struct {
	mu    sync.Mutex
	specs []sandbox.LeaseSpec
}

func (c *createdSpecs) expect(h *harness, times int) {
	h.provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.specs = append(c.specs, spec)
			return sandbox.Lease{ID: leaseName(len(c.specs)), Status: sandbox.StatusRunning, Workspace: "/workspace"}, nil
		}).Times(times)
}

// set_egress changes the lease's rules between commands, and the session's:
// the fresh lease that compensation takes after a cleanup error is created
// with them, and a continue-as-new carries them.
func TestSessionSetEgressAppliesToTheLeaseAndToEveryLaterLease(t *testing.T) {
	h := newHarness(t)
	var created createdSpecs
	created.expect(h, 2)
	h.expectNoOrphans()
	var e echo
	gomock.InOrder(
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).DoAndReturn(e.execute),
		h.provider.EXPECT().SetEgress(gomock.Any(), "sbx-1", []string{"pypi.org:443"}).Return(nil),
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).Return(sandbox.Result{}, cleanupError("sbx-1")),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil),
		h.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-2"), gomock.Any(), gomock.Any()).DoAndReturn(e.execute),
	)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), setEgressCall("pypi.org:443"), execCall("two"))
	req := sessionRequest()
	req.CommandsPerRun = 2
	_, err := h.runSession(req)
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, err, &can)

	var state SessionState
	got[1].decode(t, &state)
	assert.Equal(t, []string{"pypi.org:443"}, state.Egress)
	var two SessionResult
	got[2].decode(t, &two)
	assert.Equal(t, "sbx-2", two.LeaseID)
	require.Len(t, created.specs, 2)
	assert.Empty(t, created.specs[0].Egress)
	assert.Equal(t, []string{"pypi.org:443"}, created.specs[1].Egress, "the fresh lease gets the session's current egress")

	var next SessionRequest
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	assert.Equal(t, []string{"pypi.org:443"}, next.Lease.Egress, "carried across continue-as-new")

	// The next run: its state says so, and a lease it takes gets them too.
	h2 := newHarness(t)
	h2.expectNoOrphans()
	h2.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-2"), gomock.Any(), gomock.Any()).Return(sandbox.Result{}, cleanupError("sbx-2"))
	h2.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil)
	var created2 createdSpecs
	created2.expect(h2, 1)
	h2.provider.EXPECT().Execute(gomock.Any(), leaseWithID("sbx-1"), gomock.Any(), gomock.Any()).DoAndReturn(e.execute)
	h2.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	u2 := &updates{h: h2, n: u.n}
	u2.send(time.Second, execCall("three"), closeCall)
	var after SessionState
	h2.env.RegisterDelayedCallback(func() {
		value, err := h2.env.QueryWorkflow(StateQuery)
		require.NoError(t, err)
		require.NoError(t, value.Get(&after))
	}, time.Millisecond)
	_, err = h2.runSession(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"pypi.org:443"}, after.Egress)
	require.Len(t, created2.specs, 1)
	assert.Equal(t, []string{"pypi.org:443"}, created2.specs[0].Egress)
}

// Before the first command there is no lease: the rules are the session's,
// and its first lease is created with them.
func TestSessionSetEgressBeforeTheFirstLease(t *testing.T) {
	h := newHarness(t)
	var created createdSpecs
	created.expect(h, 1)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	// No SetEgress: there is no lease yet.

	u := &updates{h: h}
	u.send(time.Second, setEgressCall("*"), execCall("one"), closeCall)
	_, err := h.runSession(sessionRequest())
	require.NoError(t, err)
	require.Len(t, created.specs, 1)
	assert.Equal(t, []string{"*"}, created.specs[0].Egress)
}

// A paused lease is resumed before its rules change.
func TestSessionSetEgressResumesAPausedLeaseFirst(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	lease := &leaseStatus{status: sandbox.StatusRunning}
	lease.expect(h)
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute)
	h.provider.EXPECT().SetEgress(gomock.Any(), "sbx-1", []string{"*"}).DoAndReturn(func(context.Context, string, []string) error {
		lease.mu.Lock()
		defer lease.mu.Unlock()
		assert.Equal(t, sandbox.StatusRunning, lease.status, "set on a running lease")
		return nil
	})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)

	u := &updates{h: h}
	u.send(time.Second, execCall("one"))
	got := u.send(time.Hour, setEgressCall("*"))
	u.send(time.Hour+time.Minute, closeCall)
	req := sessionRequest()
	req.IdleTimeout = 10 * time.Minute
	_, err := h.runSession(req)
	require.NoError(t, err)

	var state SessionState
	got[0].decode(t, &state)
	assert.False(t, state.Paused)
	assert.Equal(t, 1, lease.resumes)
}

// A lease found gone when its rules change is given up, and the rules are
// the session's: the next command takes a fresh lease with them.
func TestSessionSetEgressOnALeaseThatIsGone(t *testing.T) {
	h := newHarness(t)
	var created createdSpecs
	created.expect(h, 2)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(2)
	h.provider.EXPECT().SetEgress(gomock.Any(), "sbx-1", gomock.Any()).Return(&sandbox.LeaseGoneError{LeaseID: "sbx-1"})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-2").Return(nil)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), setEgressCall("10.0.0.0/8"), execCall("two"), closeCall)
	summary, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	var state SessionState
	got[1].decode(t, &state)
	assert.Empty(t, state.LeaseID, "given up")
	assert.Equal(t, []string{"10.0.0.0/8"}, state.Egress)
	var two SessionResult
	got[2].decode(t, &two)
	assert.Equal(t, "sbx-2", two.LeaseID)
	assert.True(t, two.WorkspaceReset)
	assert.Equal(t, 1, two.FreshLeases)
	assert.Equal(t, []string{"10.0.0.0/8"}, created.specs[1].Egress)
	assert.Equal(t, 1, summary.FreshLeases)
}

// Rules the server refuses fail the Update; the session keeps its rules
// and its lease.
func TestSessionSetEgressRefusedKeepsTheOldRules(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	var e echo
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(e.execute).Times(2)
	h.provider.EXPECT().SetEgress(gomock.Any(), "sbx-1", gomock.Any()).Return(&sandbox.APIError{Status: 400, Operation: "set egress"})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)

	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), setEgressCall("no-such-host.invalid"), execCall("two"), updateCall{name: UpdatePause}, closeCall)
	req := sessionRequest()
	req.Lease.Egress = []string{"*"}
	h.provider.EXPECT().PauseLease(gomock.Any(), "sbx-1").Return(nil)
	h.provider.EXPECT().GetLease(gomock.Any(), "sbx-1").Return(sandbox.Lease{ID: "sbx-1", Status: sandbox.StatusPaused}, nil)
	_, err := h.runSession(req)
	require.NoError(t, err)

	assert.True(t, got[1].completed)
	assert.Equal(t, sandbox.TypeAPI, applicationErrorType(got[1].err))
	var two SessionResult
	got[2].decode(t, &two)
	assert.Equal(t, "sbx-1", two.LeaseID)
	var state SessionState
	got[3].decode(t, &state)
	assert.Equal(t, []string{"*"}, state.Egress, "the old rules")
}

// Bad rules are rejected before they enter history, and a closing session
// refuses set_egress.
func TestSessionSetEgressValidator(t *testing.T) {
	h := newHarness(t)
	h.expectNoOrphans()
	u := &updates{h: h}
	got := u.send(time.Second, setEgressCall("ok:443", "two words"), setEgressCall(""), closeCall, setEgressCall("*"))
	_, err := h.runSession(sessionRequest())
	require.NoError(t, err)

	for _, o := range got[:2] {
		assert.True(t, o.rejected)
		assert.Equal(t, sandbox.TypeInvalidInput, applicationErrorType(o.rejection))
	}
	assert.Contains(t, got[0].rejection.Error(), "egress[1]")
	assert.True(t, got[3].rejected)
	assert.Equal(t, TypeSessionClosed, applicationErrorType(got[3].rejection))
}

func TestDescribeSpecNamesTheEgress(t *testing.T) {
	for want, spec := range map[string]sandbox.LeaseSpec{
		" (egress: default)":                      {},
		" (s-1vcpu-1gb, egress: any)":             {Shape: "s-1vcpu-1gb", Egress: []string{"*"}},
		" (s-1vcpu-1gb, egress: 1 rule, ingress)": {Shape: "s-1vcpu-1gb", Egress: []string{"pypi.org:443"}, IngressEnabled: true},
		" (egress: 3 rules)":                      {Egress: []string{"a", "b:1", "10.0.0.0/8"}},
	} {
		assert.Equal(t, want, describeSpec(spec))
	}
}
