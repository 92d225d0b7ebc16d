package workflows

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// fleetQueue is the shared task queue of the fleet tests.
const fleetQueue = "fleet"

// fleet runs RunCommand and sessions in the SDK's test environment as a
// host-mode worker does (FleetInterceptor), with the lease activities
// mocked: each lease lives on the host that the test's placements name,
// in turn, and each call records the task queue it ran on.
type fleet struct {
	t     *testing.T
	env   *testsuite.TestWorkflowEnvironment
	hosts []string // the host of each placement, in turn

	mu     sync.Mutex
	placed int
	calls  []string // "activity lease@queue"
	// lost holds the hosts whose queue nobody polls: an activity there
	// times out on schedule-to-start.
	lost map[string]bool
	// beforeDestroy, if set, runs before each DestroyLease.
	beforeDestroy func()
	// rootfs records the Rootfs of each lease made, in turn.
	rootfs []string
	// cleanupFails holds the leases whose Execute fails with a
	// SandboxCleanupError: compensation replaces them.
	cleanupFails map[string]bool
}

// newFleet runs on a fleet of the given hosts, or, with none, on a single
// sandbox service as a plain worker does (leases without a host).
func newFleet(t *testing.T, hosts ...string) *fleet {
	var suite testsuite.WorkflowTestSuite
	f := &fleet{t: t, env: suite.NewTestWorkflowEnvironment(), hosts: hosts, lost: map[string]bool{}, cleanupFails: map[string]bool{}}
	f.env.SetStartWorkflowOptions(client.StartWorkflowOptions{TaskQueue: fleetQueue})
	if len(hosts) > 0 {
		f.env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{FleetInterceptor()}})
	} else {
		f.hosts = []string{""}
	}
	RegisterWorkflows(f.env)
	(&activities.Activities{}).Register(f.env) // mocked below
	// A lease is placed on the hosts in turn, or made on the host whose
	// queue the create came to.
	place := func(ctx context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		host := f.hostOfQueue(activity.GetInfo(ctx).TaskQueue)
		if f.lost[host] { // nobody takes a create on a lost host's queue
			f.calls = append(f.calls, fmt.Sprintf("%s @%s", activity.GetInfo(ctx).ActivityType.Name, activity.GetInfo(ctx).TaskQueue))
			return sandbox.Lease{}, temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil)
		}
		f.placed++
		f.rootfs = append(f.rootfs, spec.Rootfs)
		if host == "" {
			host = f.hosts[(f.placed-1)%len(f.hosts)]
		}
		lease := sandbox.Lease{ID: fmt.Sprintf("sbx-%d", f.placed), Host: host, Workspace: "/workspace", Status: sandbox.StatusRunning}
		f.calls = append(f.calls, fmt.Sprintf("%s %s@%s", activity.GetInfo(ctx).ActivityType.Name, lease.ID, activity.GetInfo(ctx).TaskQueue))
		return lease, nil
	}
	f.env.OnActivity(activities.NameCreateLease, mock.Anything, mock.Anything).
		Return(func(ctx context.Context, in activities.CreateLeaseInput) (sandbox.Lease, error) {
			return place(ctx, in.Spec)
		})
	f.env.OnActivity(activities.NameAcquireFreshLease, mock.Anything, mock.Anything).
		Return(func(ctx context.Context, in activities.AcquireFreshLeaseInput) (sandbox.Lease, error) {
			return place(ctx, in.Spec)
		})
	f.env.OnActivity(activities.NameExecute, mock.Anything, mock.Anything).
		Return(func(ctx context.Context, in activities.ExecuteInput) (sandbox.Result, error) {
			if err := f.call(ctx, in.Lease.ID); err != nil {
				return sandbox.Result{}, err
			}
			if f.cleanupFails[in.Lease.ID] {
				return sandbox.Result{}, activities.Failure(&sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: in.Lease.ID, ProcessID: "p"})
			}
			return sandbox.Result{ProcessID: "p", Stdout: "on " + in.Lease.Host}, nil
		})
	f.env.OnActivity(activities.NameDestroyLease, mock.Anything, mock.Anything).
		Return(func(ctx context.Context, in activities.DestroyLeaseInput) error {
			if f.beforeDestroy != nil {
				f.beforeDestroy()
			}
			return f.call(ctx, in.LeaseID)
		})
	for _, name := range []string{activities.NamePauseLease, activities.NameResumeLease} {
		f.env.OnActivity(name, mock.Anything, mock.Anything).
			Return(func(ctx context.Context, in activities.LeaseInput) (sandbox.Lease, error) {
				// Only the host queue says where the lease lives here.
				return sandbox.Lease{ID: in.LeaseID, Host: f.hostOf(ctx), Workspace: "/workspace"}, f.call(ctx, in.LeaseID)
			})
	}
	f.env.OnActivity(activities.NameForkLease, mock.Anything, mock.Anything).
		Return(func(ctx context.Context, in activities.ForkLeaseInput) (sandbox.Lease, error) {
			assert.Contains(t, in.WorkflowID, "/fork-", "the fork is labelled with the session that will hold it")
			return sandbox.Lease{ID: "sbx-fork", Host: f.hostOf(ctx), Workspace: "/workspace"}, f.call(ctx, in.SourceID)
		})
	return f
}

// expectTemplate answers EnsureTemplate with the template tpl-7, kept on
// host, as that host's worker would; the call is recorded.
func (f *fleet) expectTemplate(host string) {
	f.env.OnActivity(activities.NameEnsureTemplate, mock.Anything, mock.Anything).
		Return(func(ctx context.Context, spec sandbox.TemplateSpec) (sandbox.Template, error) {
			return sandbox.Template{ID: "tpl-7", Name: spec.Name(), Host: host}, f.call(ctx, "")
		})
}

// call records an activity on a lease, and fails it as a dead host's
// queue does when the host is lost.
func (f *fleet) call(ctx context.Context, leaseID string) error {
	info := activity.GetInfo(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%s %s@%s", info.ActivityType.Name, leaseID, info.TaskQueue))
	if f.lost[f.hostOfQueue(info.TaskQueue)] {
		return temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil)
	}
	return nil
}

func (f *fleet) hostOf(ctx context.Context) string {
	return f.hostOfQueue(activity.GetInfo(ctx).TaskQueue)
}

func (f *fleet) hostOfQueue(queue string) string {
	for _, h := range f.hosts {
		if h != "" && queue == HostTaskQueue(fleetQueue, h) {
			return h
		}
	}
	return ""
}

func (f *fleet) loseHost(host string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost[host] = true
}

func (f *fleet) run(req Request) (Result, error) {
	f.env.ExecuteWorkflow(RunCommand, req)
	require.True(f.t, f.env.IsWorkflowCompleted())
	var res Result
	if err := f.env.GetWorkflowError(); err != nil {
		return res, err
	}
	return res, f.env.GetWorkflowResult(&res)
}

var (
	placementQueue = PlacementTaskQueue(fleetQueue)
	h1Queue        = HostTaskQueue(fleetQueue, "h1")
	h2Queue        = HostTaskQueue(fleetQueue, "h2")
)

func TestOnAFleetTheWorkOnALeaseGoesToItsHost(t *testing.T) {
	f := newFleet(t, "h1")
	res, err := f.run(request("true"))
	require.NoError(t, err)
	assert.Equal(t, "on h1", res.Stdout)
	assert.Equal(t, "h1", res.LeaseHost)
	assert.Equal(t, []string{
		activities.NameCreateLease + " sbx-1@" + placementQueue,
		activities.NameExecute + " sbx-1@" + h1Queue,
		activities.NameDestroyLease + " sbx-1@" + h1Queue,
	}, f.calls)
}

func TestOffAFleetEverythingRunsOnTheWorkflowsQueue(t *testing.T) {
	f := newFleet(t)
	res, err := f.run(request("true"))
	require.NoError(t, err)
	assert.Empty(t, res.LeaseHost)
	assert.Equal(t, []string{
		activities.NameCreateLease + " sbx-1@" + fleetQueue,
		activities.NameExecute + " sbx-1@" + fleetQueue,
		activities.NameDestroyLease + " sbx-1@" + fleetQueue,
	}, f.calls)
}

func TestALostHostsLeaseIsLeftToItsSweepAndTheCommandRunsOnAnotherHost(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	f.loseHost("h1")
	res, err := f.run(request("true"))
	require.NoError(t, err)
	assert.Equal(t, "on h2", res.Stdout)
	assert.Equal(t, Result{
		Result: sandbox.Result{ProcessID: "p", Stdout: "on h2"}, LeaseID: "sbx-2", LeaseHost: "h2",
		FreshLeases: 1, DestroyedLeases: []string{"sbx-2"}, LostLeases: []string{"sbx-1"},
	}, res)
	assert.Equal(t, []string{
		activities.NameCreateLease + " sbx-1@" + placementQueue,
		activities.NameExecute + " sbx-1@" + h1Queue, // not taken: the host is lost
		// no DestroyLease of sbx-1: nobody would take it
		activities.NameAcquireFreshLease + " sbx-2@" + placementQueue,
		activities.NameExecute + " sbx-2@" + h2Queue,
		activities.NameDestroyLease + " sbx-2@" + h2Queue,
	}, f.calls)
}

func TestAHostLostOnEveryLeaseExhaustsCompensationTyped(t *testing.T) {
	f := newFleet(t, "h1")
	f.loseHost("h1")
	req := request("true")
	req.MaxFreshLeases = 1
	_, err := f.run(req)
	require.True(t, IsCompensationExhausted(err), "%v", err)
	assert.True(t, sandbox.IsHostLostError(errors.Unwrap(unwrapApplication(t, err))), "it wraps the host's loss: %v", err)
}

// unwrapApplication returns the first ApplicationError in err's chain.
func unwrapApplication(t *testing.T, err error) error {
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	return appErr
}

func TestAReleaseOnALostHostEndsTheRunAndTheStateNoLongerHoldsTheLease(t *testing.T) {
	f := newFleet(t, "h1")
	f.beforeDestroy = func() { f.loseHost("h1") } // it dies after the command
	res, err := f.run(request("true"))
	require.NoError(t, err)
	assert.Equal(t, "sbx-1", res.LeaseID, "the lease the command ran on")
	assert.Empty(t, res.DestroyedLeases)
	assert.Equal(t, []string{"sbx-1"}, res.LostLeases)

	encoded, err := f.env.QueryWorkflow(StateQuery)
	require.NoError(t, err)
	var state State
	require.NoError(t, encoded.Get(&state))
	assert.Empty(t, state.LeaseID, "the host's sweep finds the lease held by nobody")
	assert.Equal(t, []string{"sbx-1"}, state.LostLeases)
}

func TestOnAFleetALeaseIDNeedsItsHost(t *testing.T) {
	f := newFleet(t, "h1")
	req := request("true")
	req.LeaseID = "sbx-9"
	_, err := f.run(req)
	assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
	assert.Empty(t, f.calls)

	f = newFleet(t, "h1", "h2")
	req.LeaseHost = "h2"
	req.KeepLease = true
	res, err := f.run(req)
	require.NoError(t, err)
	assert.Equal(t, "on h2", res.Stdout)
	assert.Equal(t, []string{
		activities.NameExecute + " sbx-9@" + h2Queue,
		activities.NameDestroyLease + " @" + h2Queue, // the sweep, keeping sbx-9
	}, f.calls)
}

func TestASessionOnAFleetFollowsItsLeaseAcrossPauseResumeForkAndAFreshLease(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	h := &harness{env: f.env}
	u := &updates{h: h}
	got := u.send(time.Second, execCall("one"), updateCall{name: UpdatePause}, updateCall{name: UpdateFork})
	var forkClosed updateOutcome
	f.env.RegisterDelayedCallback(func() {
		var fork SessionFork
		got[2].decode(t, &fork)
		require.NoError(t, f.env.UpdateWorkflowByID(fork.SessionID, UpdateClose, "fork-close", forkClosed.callback()))
	}, 1200*time.Millisecond)
	lose := u.send(2*time.Second, execCall("two"), closeCall)
	f.env.RegisterDelayedCallback(func() { f.loseHost("h1") }, 1500*time.Millisecond)
	f.env.ExecuteWorkflow(SessionWorkflow, sessionRequest())
	require.True(t, f.env.IsWorkflowCompleted())
	require.NoError(t, f.env.GetWorkflowError())

	var one, two SessionResult
	got[0].decode(t, &one)
	lose[0].decode(t, &two)
	assert.Equal(t, "on h1", one.Stdout)
	assert.Equal(t, "on h2", two.Stdout)
	assert.True(t, two.WorkspaceReset)
	var fork SessionFork
	got[2].decode(t, &fork)
	assert.Equal(t, "sbx-fork", fork.LeaseID)
	assert.Equal(t, []string{
		activities.NameCreateLease + " sbx-1@" + placementQueue,
		activities.NameExecute + " sbx-1@" + h1Queue,
		activities.NamePauseLease + " sbx-1@" + h1Queue,
		activities.NameForkLease + " sbx-1@" + h1Queue,
		activities.NameDestroyLease + " sbx-fork@" + h1Queue, // the fork's session closed
		activities.NameResumeLease + " sbx-1@" + h1Queue,     // not taken: h1 is lost
		activities.NameAcquireFreshLease + " sbx-2@" + placementQueue,
		activities.NameExecute + " sbx-2@" + h2Queue,
		activities.NameDestroyLease + " sbx-2@" + h2Queue,
	}, f.calls)
}

func TestASessionOnAFleetCarriesItsLeasesHostAcrossContinueAsNew(t *testing.T) {
	f := newFleet(t, "h1", "h2")
	u := &updates{h: &harness{env: f.env}}
	u.send(time.Second, execCall("one"))
	req := sessionRequest()
	req.CommandsPerRun = 1
	f.env.ExecuteWorkflow(SessionWorkflow, req)
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, f.env.GetWorkflowError(), &can)
	var next SessionRequest
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.NotNil(t, next.Carried.Lease)
	assert.Equal(t, sandbox.Lease{ID: "sbx-1", Host: "h1", Workspace: "/workspace", Status: sandbox.StatusRunning}, *next.Carried.Lease)

	// The next run works on h1, where the lease is.
	f2 := newFleet(t, "h2")
	u2 := &updates{h: &harness{env: f2.env}, n: 10} // new Update ids
	got := u2.send(time.Second, execCall("two"), closeCall)
	f2.env.ExecuteWorkflow(SessionWorkflow, next)
	require.NoError(t, f2.env.GetWorkflowError())
	var two SessionResult
	got[0].decode(t, &two)
	assert.Equal(t, SessionResult{Result: sandbox.Result{ProcessID: "p", Stdout: "on h1"}, Seq: 2, LeaseID: "sbx-1"}, two)
	assert.Equal(t, []string{
		activities.NameExecute + " sbx-1@" + h1Queue,
		activities.NameDestroyLease + " sbx-1@" + h1Queue,
	}, f2.calls)
}
