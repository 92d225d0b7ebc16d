package workflows

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// ReaperWorkflowName is the registered name of Reaper.
const ReaperWorkflowName = "sandboxflow.Reaper"

// NameDescribeLeaseOwners is the reaper's activity that asks Temporal
// about the owners of leases (ReaperActivities.DescribeLeaseOwners).
const NameDescribeLeaseOwners = "sandboxflow.DescribeLeaseOwners"

// reapDestroyTimeout bounds each destroy of a reaper run, so that a
// sandbox server that does not answer does not hold the run (and, under
// the overlap policy SKIP, every later one) for long.
const reapDestroyTimeout = 2 * time.Minute

// DefaultReaperClosedFor is ReaperRequest.ClosedFor when zero.
const DefaultReaperClosedFor = time.Minute

// ReaperRequest is the input of Reaper.
type ReaperRequest struct {
	// ClosedFor is how long a lease's owner must have been closed before
	// the lease is destroyed, and how far apart the two looks are that
	// must both find no owner at all (DefaultReaperClosedFor when zero).
	ClosedFor time.Duration `json:"closedFor,omitempty"`
}

// ReaperResult is what one Reaper run did.
type ReaperResult struct {
	// Leases counts the leases of runs it found.
	Leases int `json:"leases"`
	// Destroyed lists the leases it destroyed, each with its owner.
	Destroyed []LeaseOwner `json:"destroyed,omitempty"`
	// Kept lists the leases whose owner is closed (or gone) but that it
	// left alone, and why: kept (Request.KeepLease), closed too recently,
	// owner not answering. A lease whose owner runs is never listed.
	Kept []ReapSkipped `json:"kept,omitempty"`
}

// ReapSkipped is a lease the reaper left alone, and why.
type ReapSkipped struct {
	LeaseID    string `json:"leaseId"`
	WorkflowID string `json:"workflowId"`
	Reason     string `json:"reason"`
}

// OwnerAnswer is the answer of DescribeLeaseOwners for one lease: its
// owner, or why the owner cannot be told now.
type OwnerAnswer struct {
	Owner LeaseOwner `json:"owner"`
	Error string     `json:"error,omitempty"`
}

// Reaper destroys the leases that no run holds any more: those whose
// owner (the workflow named by activities.LabelWorkflowID) has closed —
// completed, failed, cancelled, terminated or timed out — without keeping
// them, and those whose owner does not exist. A run releases its own lease
// when it ends; only a run that cannot, one terminated (directly, or as
// the child of a terminated parent under ParentClosePolicy TERMINATE) or
// past its execution timeout, leaves one behind, and this is what finds
// it.
//
// It never destroys a lease whose owner runs (sessions included), a lease
// that a closed run kept (Request.KeepLease), or one whose owner cannot
// be asked (LeaseOwner, describeOwner). An owner must have been closed for
// ClosedFor, and a lease with no owner at all must be found so at two
// looks ClosedFor apart (a forked session starts just after its lease is
// forked), before the lease is destroyed.
//
// A Temporal Schedule runs it (EnsureReaperSchedule); running it by hand,
// or many at once, is safe: destroying a lease twice is success.
func Reaper(ctx workflow.Context, req ReaperRequest) (ReaperResult, error) {
	closedFor := req.ClosedFor
	if closedFor <= 0 {
		closedFor = DefaultReaperClosedFor
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		HeartbeatTimeout:    time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3, NonRetryableErrorTypes: nonRetryableTypes()},
	})
	var out ReaperResult
	var leases []sandbox.Lease
	if err := workflow.ExecuteActivity(ctx, activities.NameListOwnedLeases).Get(ctx, &leases); err != nil {
		return out, err
	}
	out.Leases = len(leases)
	owners, err := describeOwners(ctx, leases)
	if err != nil {
		return out, err
	}
	var doomed, later []sandbox.Lease
	var wait time.Duration
	for i, l := range leases {
		switch v := reapVerdict(owners[i], workflow.Now(ctx), closedFor, false); {
		case v.reap:
			doomed = append(doomed, l)
		case v.lookAgain > 0:
			later = append(later, l)
			wait = max(wait, v.lookAgain)
		case v.reason != "":
			out.Kept = append(out.Kept, ReapSkipped{l.ID, owners[i].Owner.WorkflowID, v.reason})
		}
	}
	out.Destroyed = append(out.Destroyed, reap(ctx, doomed, owners, leases)...)
	if len(later) == 0 {
		return out, nil
	}
	if err := workflow.Sleep(ctx, wait); err != nil {
		return out, err
	}
	if owners, err = describeOwners(ctx, later); err != nil {
		return out, err
	}
	doomed = doomed[:0]
	for i, l := range later {
		switch v := reapVerdict(owners[i], workflow.Now(ctx), closedFor, true); {
		case v.reap:
			doomed = append(doomed, l)
		case v.reason != "":
			out.Kept = append(out.Kept, ReapSkipped{l.ID, owners[i].Owner.WorkflowID, v.reason})
		}
	}
	out.Destroyed = append(out.Destroyed, reap(ctx, doomed, owners, later)...)
	return out, nil
}

func describeOwners(ctx workflow.Context, leases []sandbox.Lease) ([]OwnerAnswer, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	var owners []OwnerAnswer
	if err := workflow.ExecuteActivity(ctx, NameDescribeLeaseOwners, leases).Get(ctx, &owners); err != nil {
		return nil, err
	}
	if len(owners) != len(leases) {
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("%d owners for %d leases", len(owners), len(leases)), sandbox.TypeProtocol, nil)
	}
	return owners, nil
}

// reap destroys doomed and returns the owners of those it destroyed; one
// that could not be destroyed is left to the next run, and logged.
func reap(ctx workflow.Context, doomed []sandbox.Lease, owners []OwnerAnswer, of []sandbox.Lease) []LeaseOwner {
	ownerOf := make(map[string]LeaseOwner, len(of))
	for i, l := range of {
		ownerOf[l.ID] = owners[i].Owner
	}
	futures := make([]workflow.Future, len(doomed))
	for i, l := range doomed {
		opts := destroyOptions()
		opts.ScheduleToCloseTimeout = reapDestroyTimeout // the next run tries again
		opts.Summary = fmt.Sprintf("reap lease %s of %s", l.ID, ownerOf[l.ID].WorkflowID)
		futures[i] = workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, route(ctx, activities.NameDestroyLease, l, opts)),
			activities.NameDestroyLease, activities.DestroyLeaseInput{LeaseID: l.ID})
	}
	var destroyed []LeaseOwner
	for i, f := range futures {
		if err := f.Get(ctx, nil); err != nil {
			workflow.GetLogger(ctx).Warn("reaper: could not destroy a lease; the next run tries again", "lease", doomed[i].ID, "error", err)
			continue
		}
		destroyed = append(destroyed, ownerOf[doomed[i].ID])
	}
	return destroyed
}

// verdict is what the reaper does with one lease.
type verdict struct {
	reap bool
	// lookAgain > 0 asks for a second look that much later.
	lookAgain time.Duration
	// reason, when the lease is left alone for good in this run and its
	// owner is not open, says why.
	reason string
}

// reapVerdict is the reaper's decision for one lease whose owner is
// answer, at now; second is set on the second look.
func reapVerdict(answer OwnerAnswer, now time.Time, closedFor time.Duration, second bool) verdict {
	o := answer.Owner
	switch {
	case answer.Error != "":
		return verdict{reason: "its owner cannot be told: " + answer.Error}
	case !o.Exists && second:
		return verdict{reap: true}
	case !o.Exists:
		return verdict{lookAgain: closedFor}
	case o.Open:
		return verdict{}
	case o.Kept:
		return verdict{reason: "its closed owner kept it (KeepLease)"}
	case o.ClosedAt.IsZero():
		return verdict{reason: "its owner reports no close time"}
	}
	if closed := now.Sub(o.ClosedAt); closed < closedFor {
		if second {
			return verdict{reason: fmt.Sprintf("its owner closed only %s ago", closed.Round(time.Second))}
		}
		return verdict{lookAgain: closedFor - closed}
	}
	return verdict{reap: true}
}

// ReaperActivities are the reaper's activities that ask Temporal, not the
// sandbox server: they hold a client of the workflows' namespace.
type ReaperActivities struct {
	Client client.Client
}

// DescribeLeaseOwners asks Temporal about the owner of each lease
// (LeaseOwner), in order.
func (a *ReaperActivities) DescribeLeaseOwners(ctx context.Context, leases []sandbox.Lease) ([]OwnerAnswer, error) {
	answers := make([]OwnerAnswer, len(leases))
	for i, l := range leases {
		activity.RecordHeartbeat(ctx, i)
		owner, err := describeOwner(ctx, a.Client, l)
		answers[i] = OwnerAnswer{Owner: owner}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			answers[i].Error = err.Error()
		}
	}
	return answers, nil
}

// RegisterReaper registers Reaper and its Temporal activity, over c. The
// reaper also needs the activities ListOwnedLeases and DestroyLease
// (activities.Activities.Register) on the same task queue.
func RegisterReaper(r Registry, c client.Client) {
	r.RegisterWorkflowWithOptions(Reaper, workflow.RegisterOptions{Name: ReaperWorkflowName})
	r.RegisterActivityWithOptions((&ReaperActivities{Client: c}).DescribeLeaseOwners,
		activity.RegisterOptions{Name: NameDescribeLeaseOwners})
}
