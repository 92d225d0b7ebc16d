package reliability

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// parentQueue is the task queue of the test's parent workflow.
const parentQueue = "reaper-parents"

// terminatingParent runs req as a RunCommand child under the SDK's
// default ParentClosePolicy, TERMINATE, as the README's Go example once
// did.
func terminatingParent(ctx workflow.Context, req workflows.Request) error {
	ctx = workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:        workflow.GetInfo(ctx).WorkflowExecution.ID + "/child",
		TaskQueue:         workflows.DefaultTaskQueue,
		ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_TERMINATE,
	})
	return workflow.ExecuteChildWorkflow(ctx, workflows.WorkflowName, req).Get(ctx, nil)
}

// Terminating a RunCommand's parent (which terminates the child), a
// RunCommand itself and a session leaves each lease running: none can
// release it. The reaper destroys the three, and leaves alone the lease
// of a run that is still open. Without the reaper the three leases stay
// (the test fails at "destroyed"): nothing else ever reclaims them.
func TestReaperDestroysTheLeasesOfTerminatedRuns(t *testing.T) {
	e := start(t, options{})
	ctx := t.Context()
	c := e.stack.Client

	w := worker.New(c, parentQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(terminatingParent, workflow.RegisterOptions{Name: "terminatingParent"})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	// A parent whose child runs a command, terminated.
	childMarker := newMarker()
	parent, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "reaper-parent-" + newMarker(), TaskQueue: parentQueue},
		"terminatingParent", request(command(childMarker, heldScript)))
	require.NoError(t, err)
	childLease := e.waitRunning(e.stack.Sandbox, childMarker).LeaseID
	require.NoError(t, c.TerminateWorkflow(ctx, parent.GetID(), "", "test: the parent ends"))

	// A RunCommand, terminated mid-command.
	runMarker := newMarker()
	run := e.startRun(request(command(runMarker, heldScript)))
	runLease := e.waitRunning(e.stack.Sandbox, runMarker).LeaseID
	require.NoError(t, c.TerminateWorkflow(ctx, run.GetID(), "", "test: terminated"))

	// A session with a lease, terminated.
	sess, err := sandboxclient.StartSession(ctx, c, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{ActivityOptions: fastActivities()})
	require.NoError(t, err)
	first, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"true"}}})
	require.NoError(t, err)
	require.NoError(t, c.TerminateWorkflow(ctx, sess.ID(), "", "test: terminated"))

	// A run still open, and an open session: never the reaper's.
	openMarker := newMarker()
	open := e.startRun(request(command(openMarker, heldScript)))
	openLease := e.waitRunning(e.stack.Sandbox, openMarker).LeaseID
	openSess, err := sandboxclient.StartSession(ctx, c, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{ActivityOptions: fastActivities()})
	require.NoError(t, err)
	openSessLease, err := openSess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"true"}}})
	require.NoError(t, err)

	for _, id := range []string{childLease, runLease, first.LeaseID} {
		_, err := e.direct.GetLease(ctx, id)
		require.NoError(t, err, "a terminated run cannot release lease %s", id)
	}

	reaper, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "reaper-" + newMarker(), TaskQueue: workflows.DefaultTaskQueue},
		workflows.ReaperWorkflowName, workflows.ReaperRequest{ClosedFor: time.Second})
	require.NoError(t, err)
	var reaped workflows.ReaperResult
	require.NoError(t, reaper.Get(ctx, &reaped))
	var destroyed []string
	for _, o := range reaped.Destroyed {
		destroyed = append(destroyed, o.LeaseID)
	}
	assert.ElementsMatch(t, []string{childLease, runLease, first.LeaseID}, destroyed, "destroyed; kept: %+v", reaped.Kept)
	assert.Equal(t, 5, reaped.Leases)
	for _, id := range []string{childLease, runLease, first.LeaseID} {
		e.assertLeaseGone(id)
	}
	for _, id := range []string{openLease, openSessLease.LeaseID} {
		_, err := e.direct.GetLease(ctx, id)
		require.NoError(t, err, "the lease %s of an open run is untouched", id)
	}

	// The open ones end as usual, and release their leases.
	e.release(openLease)
	_, err = e.result(open)
	require.NoError(t, err)
	_, err = openSess.Close(ctx)
	require.NoError(t, err)

	// The worker created the reaper's schedule, which the Web UI lists on
	// its Schedules page (the same ListSchedules the UI calls).
	desc, err := c.ScheduleClient().GetHandle(ctx, workflows.ReaperScheduleID).Describe(ctx)
	require.NoError(t, err)
	action, ok := desc.Schedule.Action.(*client.ScheduleWorkflowAction)
	require.True(t, ok)
	assert.Equal(t, workflows.ReaperWorkflowName, action.Workflow)
	assert.Equal(t, enumspb.SCHEDULE_OVERLAP_POLICY_SKIP, desc.Schedule.Policy.Overlap)
	created, err := workflows.EnsureReaperSchedule(ctx, c, workflows.ReaperSchedule{})
	require.NoError(t, err, "a second worker finds the schedule")
	assert.False(t, created)
}
