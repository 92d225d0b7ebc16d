package workflows

import (
	"fmt"
	"slices"

	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// TypeCompensationExhausted is the error type of a command that used up
// its fresh leases and still could not run.
const TypeCompensationExhausted = sandbox.TypeCompensationExhausted

// CompensationDetails are the compensation fields of the details of a
// SandboxCompensationExhausted error (a sandbox.FailureDetails), kept for
// callers that decode only those.
type CompensationDetails struct {
	// FreshLeases is how many fresh leases the command took.
	FreshLeases     int      `json:"freshLeases"`
	DestroyedLeases []string `json:"destroyedLeases"`
}

// IsCompensationExhausted reports whether err is (or wraps) the failure of
// a command that used up its fresh leases. errors.As to a
// *temporal.ApplicationError and its Details give the
// sandbox.FailureDetails. It is sandbox.IsCompensationExhausted.
func IsCompensationExhausted(err error) bool { return sandbox.IsCompensationExhausted(err) }

// IsSessionClosed reports whether err is (or wraps) a session's refusal of
// an Update because it is closing or no longer running. It is
// sandbox.IsSessionClosed.
func IsSessionClosed(err error) bool { return sandbox.IsSessionClosed(err) }

// compensation is the one compensation policy, of RunCommand and of
// SessionWorkflow alike (package documentation, "Compensation"). It owns:
//
//   - whether a failure leaves the lease unusable: sandbox.LeaseUnusable,
//     that is SandboxCleanupError, SandboxLeaseGone or SandboxHostLost
//     (unusable);
//   - giving such a lease up: it is destroyed — or, when its host is lost,
//     left to that host's sweep — and never used again (giveUp), whatever
//     the budget;
//   - the budget: each command may take MaxFreshLeases fresh leases, each
//     counted in State.FreshLeases when it is taken (replace);
//   - the typed error once the budget is spent: SandboxCompensationExhausted
//     with CompensationDetails, wrapping the failure that cost the last
//     lease.
//
// A fresh lease is any lease after a run's first: the one replacing a
// lease given up during the command, and, in a session, the one replacing
// a lease that was found gone while idle or on resume.
type compensation struct {
	r *run
	// max is the fresh leases one command may take; 0 disables
	// compensation.
	max int
	// spent counts the fresh leases the current command has taken.
	spent int
	// replaced is the lease given up last, which the next fresh lease
	// replaces ("" once replaced).
	replaced string
	// cause is the failure that made the last lease unusable.
	cause error
}

// unusable reports whether err leaves the lease it happened on unusable.
func (c *compensation) unusable(err error) bool { return sandbox.LeaseUnusable(err) }

// begin starts the budget of a command.
func (c *compensation) begin() { c.spent = 0 }

// giveUp destroys the lease in use after err made it unusable, or
// abandons it when err is its host's loss. A run without a lease (its
// acquisition failed so) has nothing to destroy.
func (c *compensation) giveUp(ctx workflow.Context, err error) error {
	r := c.r
	c.cause = err
	r.state.LastError = err.Error()
	workflow.GetLogger(ctx).Warn("lease unusable; compensating", "lease", r.state.LeaseID, "error", err)
	if r.lease == nil {
		return nil
	}
	lease := *r.lease
	r.setPhase(ctx, PhaseCompensating)
	if sandbox.IsHostLostError(err) {
		// Nobody would take a DestroyLease on that host.
		r.abandon(ctx, lease, err)
	} else if err := r.destroy(ctx, lease); err != nil {
		return err
	}
	r.lease, c.replaced = nil, lease.ID
	r.setLease(ctx, sandbox.Lease{})
	return nil
}

// replace takes a fresh lease if the command's budget allows, and
// otherwise returns the typed exhaustion error.
func (c *compensation) replace(ctx workflow.Context) error {
	r := c.r
	if c.spent >= c.max {
		return c.exhausted()
	}
	c.spent++
	r.state.FreshLeases++
	if err := r.acquire(ctx, c.spent, c.replaced); err != nil {
		return err
	}
	c.replaced = ""
	return nil
}

// exhausted is the failure of a command that may take no more fresh
// leases.
func (c *compensation) exhausted() error {
	destroyed := slices.Clone(c.r.state.DestroyedLeases)
	d := sandbox.NewFailureDetails(TypeCompensationExhausted)
	d.FreshLeases, d.DestroyedLeases = c.spent, destroyed
	if lease := c.replaced; lease != "" {
		d.LeaseID = lease
	}
	return activities.NewFailure(
		fmt.Sprintf("no usable lease after %d fresh leases; destroyed %v", c.spent, destroyed), d, c.cause)
}
