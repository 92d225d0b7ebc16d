package workflows

// This file is the sweep of a fleet host: ordinary Go code that a
// host-mode worker runs when it starts and now and then, not workflow
// code.

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

// DefaultSweepSettle is how long a lease must stay held by no workflow, between
// the two looks of a host sweep, before the sweep destroys it.
const DefaultSweepSettle = 10 * time.Second

// HostSweep is what SweepHost did.
type HostSweep struct {
	// Leases counts the leases of runs (labelled by the activities) found
	// on the host.
	Leases int
	// Destroyed lists the leases that no workflow held, destroyed.
	Destroyed []string
	// Kept lists the leases left alone because it could not be told
	// whether a workflow holds them (see SweepHost), each with the reason.
	Kept []KeptLease
}

// KeptLease is a lease that a sweep left alone, and why.
type KeptLease struct {
	ID     string
	Reason error
}

// SweepHost destroys the leases on a fleet host that no workflow holds
// any more: those its runs gave up while the host was lost (LostLeases),
// and the orphans of creates whose answer never came back, which a run's
// own release sweeps only on the host of its lease. p is the host's sandbox
// server, c reaches the workflows' namespace. A host-mode worker runs it
// when it starts, so that a host that comes back sweeps what it holds for
// nobody, and every so often after.
//
// The activities label every lease with its run and the workflow that holds
// it (activities.LabelRun, LabelWorkflowID); the workflow's state says which
// lease it holds (State.LeaseID, answered to StateQuery, by a running
// workflow and by a closed one as long as its history is retained). A
// lease is held by nobody, and destroyed, when
//
//   - its workflow no longer exists (its history is past retention), or
//   - its workflow's state names another lease or none: the lease was
//     given up, or was the orphan of a lost create response. A closed
//     run's state names the lease it kept (Request.KeepLease), so a kept
//     lease stays its caller's; a run that left its lease to a lost host
//     names none.
//
// It is left alone while an attempt of its workflow to create or fork a
// lease runs (its state may not name that lease yet), or when the
// workflow cannot be asked: a workflow of
// your own that runs RunCommand inline (Run) answers no StateQuery. And a
// lease is destroyed only when it was held by nobody at two looks settle
// apart (DefaultSweepSettle when zero): a forked session starts just after
// its fork exists.
//
// A lease taken over by another run (Request.LeaseID) is asked of the
// workflow that created it, whose state names it as long as that run kept
// it and its history is retained.
func SweepHost(ctx context.Context, c client.Client, p sandbox.Provider, settle time.Duration) (HostSweep, error) {
	if settle <= 0 {
		settle = DefaultSweepSettle
	}
	var out HostSweep
	leases, err := p.ListLeases(ctx, nil)
	if err != nil {
		return out, fmt.Errorf("list the host's leases: %w", err)
	}
	var unheld []sandbox.Lease
	for _, l := range leases {
		if l.Status.Terminal() || l.Labels[activities.LabelRun] == "" || l.Labels[activities.LabelWorkflowID] == "" {
			continue // not a run's
		}
		out.Leases++
		switch held, err := holds(ctx, c, l); {
		case err != nil:
			out.Kept = append(out.Kept, KeptLease{l.ID, err})
		case !held:
			unheld = append(unheld, l)
		}
	}
	if len(unheld) == 0 {
		return out, nil
	}
	select {
	case <-ctx.Done():
		return out, ctx.Err()
	case <-time.After(settle):
	}
	var errs []error
	for _, l := range unheld {
		held, err := holds(ctx, c, l)
		switch {
		case err != nil:
			out.Kept = append(out.Kept, KeptLease{l.ID, err})
		case held:
		default:
			if err := p.DestroyLease(ctx, l.ID); err != nil {
				errs = append(errs, fmt.Errorf("destroy lease %s: %w", l.ID, err))
				continue
			}
			out.Destroyed = append(out.Destroyed, l.ID)
		}
	}
	return out, errors.Join(errs...)
}

// sweepQueryTimeout bounds each question a sweep asks of a workflow.
const sweepQueryTimeout = 15 * time.Second

// holds reports whether the workflow that labelled lease holds it; an
// error says why that cannot be told now.
func holds(ctx context.Context, c client.Client, lease sandbox.Lease) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, sweepQueryTimeout)
	defer cancel()
	id := lease.Labels[activities.LabelWorkflowID]
	desc, err := c.DescribeWorkflowExecution(ctx, id, "")
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("describe %s: %w", id, err)
	}
	for _, a := range desc.GetPendingActivities() {
		switch a.GetActivityType().GetName() {
		case activities.NameCreateLease, activities.NameAcquireFreshLease, activities.NameForkLease:
			// An attempt that runs may be making this very lease. One that
			// waits for a host with room makes nothing: the workflow's
			// leases it does not name are orphans of earlier attempts,
			// which take the room it waits for.
			if a.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED {
				return false, fmt.Errorf("%s is leasing right now", id)
			}
		}
	}
	answer, err := c.QueryWorkflow(ctx, id, "", StateQuery)
	if err != nil {
		return false, fmt.Errorf("query %s: %w", id, err)
	}
	var state struct {
		LeaseID string `json:"leaseId"`
	}
	if err := answer.Get(&state); err != nil {
		return false, fmt.Errorf("the state of %s: %w", id, err)
	}
	return state.LeaseID == lease.ID, nil
}
