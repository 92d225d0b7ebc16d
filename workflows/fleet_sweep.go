package workflows

// This file is the sweep of a fleet host: ordinary Go code that a
// host-mode worker runs when it starts and now and then, not workflow
// code.

import (
	"context"
	"errors"
	"fmt"
	"time"

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
//   - its workflow runs and its state names another lease or none: the
//     lease was given up, or was the orphan of a lost create response; a
//     run that left its lease to a lost host names none;
//   - its workflow is closed and did not keep the lease: it was terminated
//     or timed out before it could release it (LeaseOwner). A closed run
//     that asked to keep its lease (Request.KeepLease) still holds it, so
//     a kept lease stays its caller's.
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

// holds reports whether the workflow that labelled lease holds it
// (LeaseOwner.Holds); an error says why that cannot be told now.
func holds(ctx context.Context, c client.Client, lease sandbox.Lease) (bool, error) {
	owner, err := describeOwner(ctx, c, lease)
	return owner.Holds(), err
}
