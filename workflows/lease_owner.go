package workflows

// This file is the one policy of whether a workflow still holds a lease:
// ordinary Go code over the Temporal client, used by a fleet host's sweep
// (SweepHost) and by the reaper's activity (ReaperActivities), not
// workflow code.

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// LeaseOwner is what Temporal says of the workflow that a lease's labels
// name as its owner (activities.LabelWorkflowID).
type LeaseOwner struct {
	LeaseID    string `json:"leaseId"`
	WorkflowID string `json:"workflowId"`
	// Exists is false when no execution of that workflow id exists: it
	// never started (a fork whose session has not started yet) or its
	// history is past retention.
	Exists bool `json:"exists"`
	// Open is set while the workflow id's latest execution runs. Every
	// execution of the id counts as the owner: a session's lease passes
	// from run to run by continue-as-new, and a run labels its leases
	// with its workflow id, not its run id.
	Open bool `json:"open,omitempty"`
	// Status is the latest execution's status ("Terminated", …).
	Status string `json:"status,omitempty"`
	// ClosedAt is when the latest execution closed (zero while open).
	ClosedAt time.Time `json:"closedAt,omitzero"`
	// NamesLease is set when the workflow's state names this lease as the
	// one in use (State.LeaseID).
	NamesLease bool `json:"namesLease,omitempty"`
	// Kept is set when the workflow asked to keep the lease
	// (Request.KeepLease) and its state names it: the lease is its
	// caller's, whether or not the workflow is still open.
	Kept bool `json:"kept,omitempty"`
}

// Holds reports whether the owner holds the lease: it runs and its state
// names the lease, or it kept it.
func (o LeaseOwner) Holds() bool {
	return o.Exists && (o.Open && o.NamesLease || o.Kept)
}

// Closed reports whether the owner exists and has closed (completed,
// failed, cancelled, terminated or timed out).
func (o LeaseOwner) Closed() bool { return o.Exists && !o.Open }

// ownerQueryTimeout bounds each question asked of a workflow about its
// lease.
const ownerQueryTimeout = 15 * time.Second

// describeOwner asks Temporal about the workflow that labelled lease; an
// error says why that cannot be told now:
//
//   - the owner runs an activity that creates or forks a lease (its state
//     may not name the lease it is making yet);
//   - the owner answers no StateQuery (a workflow of your own that runs
//     RunCommand inline, with Run), or cannot be asked at all.
//
// A closed owner's state is what its last run left (Temporal replays the
// history to answer): a run that was terminated or timed out mid-command
// names the lease it was using but never kept it, unless its request
// asked to (State.KeepLease).
func describeOwner(ctx context.Context, c client.Client, lease sandbox.Lease) (LeaseOwner, error) {
	ctx, cancel := context.WithTimeout(ctx, ownerQueryTimeout)
	defer cancel()
	id := lease.Labels[activities.LabelWorkflowID]
	owner := LeaseOwner{LeaseID: lease.ID, WorkflowID: id}
	desc, err := c.DescribeWorkflowExecution(ctx, id, "")
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		return owner, nil
	case err != nil:
		return owner, fmt.Errorf("describe %s: %w", id, err)
	}
	info := desc.GetWorkflowExecutionInfo()
	owner.Exists = true
	owner.Open = info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	owner.Status = info.GetStatus().String()
	if !owner.Open && info.GetCloseTime() != nil {
		owner.ClosedAt = info.GetCloseTime().AsTime()
	}
	if owner.Open {
		for _, a := range desc.GetPendingActivities() {
			switch a.GetActivityType().GetName() {
			case activities.NameCreateLease, activities.NameAcquireFreshLease, activities.NameForkLease:
				// An attempt that runs may be making this very lease. One
				// that waits for a host with room makes nothing: the
				// workflow's leases it does not name are orphans of
				// earlier attempts, which take the room it waits for.
				if a.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED {
					return owner, fmt.Errorf("%s is leasing right now", id)
				}
			}
		}
	}
	answer, err := c.QueryWorkflow(ctx, id, "", StateQuery)
	if err != nil {
		return owner, fmt.Errorf("query %s: %w", id, err)
	}
	var state struct {
		LeaseID   string `json:"leaseId"`
		KeepLease bool   `json:"keepLease"`
	}
	if err := answer.Get(&state); err != nil {
		return owner, fmt.Errorf("the state of %s: %w", id, err)
	}
	owner.NamesLease = state.LeaseID == lease.ID
	owner.Kept = owner.NamesLease && state.KeepLease
	return owner, nil
}
