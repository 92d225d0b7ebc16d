package activities

import (
	"context"

	"go.temporal.io/sdk/activity"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// ForkLeaseInput asks for a fork of a paused lease: the first lease of
// another run (a forked session).
type ForkLeaseInput struct {
	// SourceID is the lease to fork. It must be paused (PauseLease).
	SourceID string `json:"sourceId"`
	// Spec is what the fork changes of the source's settings; its labels
	// are the run's, added here.
	Spec sandbox.ForkSpec `json:"spec,omitzero"`
	// RunKey is the run that owns the fork. The fork is labelled with it
	// as the run's first generation, so that the run's release (a
	// DestroyLease with this RunKey) sweeps a fork whose answer was lost.
	RunKey string `json:"runKey"`
	// WorkflowID is the workflow that will hold the fork (a forked
	// session), its LabelWorkflowID, by which a fleet host's sweep asks
	// whether it is still held (workflows.SweepHost). Empty means the
	// workflow that runs this activity.
	WorkflowID string `json:"workflowId,omitempty"`
}

// ForkLease forks a paused lease into a new lease labelled with the run of
// RunKey, and returns it once it runs. The source is left paused.
//
// The provider finds a fork whose answer was lost by its labels (see
// sandbox.Provider.ForkLease) and otherwise fails with a non-retryable
// SandboxCleanupError (ForkUnconfirmed), so a retry never forks twice for
// a lost answer. A retry after the worker died mid-fork sweeps the run's
// leases first (best effort): whatever an earlier attempt forked is
// destroyed, on a server that keeps labels, before the fork is made again.
// On one that keeps none (the hosted service), such a fork is left to
// whoever lists the source's forks (forked_from).
func (a *Activities) ForkLease(ctx context.Context, in ForkLeaseInput) (sandbox.Lease, error) {
	if in.RunKey == "" {
		return sandbox.Lease{}, classify(errMissingRunKey)
	}
	if err := sandbox.CheckID("sourceId", in.SourceID); err != nil {
		return sandbox.Lease{}, classify(err)
	}
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	if activity.GetInfo(ctx).Attempt > 1 {
		// Best effort, as in AcquireFreshLease: the run's release sweeps
		// again.
		if err := a.sweep(ctx, in.RunKey, func(sandbox.Lease) bool { return true }); err != nil {
			activity.GetLogger(ctx).Warn("sweeping an earlier attempt's fork failed; the run's release sweeps again", "error", err)
		}
	}
	spec := in.Spec
	spec.Labels = runLabels(ctx, spec.Labels, in.RunKey, 0)
	if in.WorkflowID != "" {
		spec.Labels[LabelWorkflowID] = in.WorkflowID
	}
	lease, err := a.Provider.ForkLease(ctx, in.SourceID, spec)
	if err != nil {
		return sandbox.Lease{}, fail(ctx, a.destroyHalfMade(ctx, err))
	}
	meterOf(ctx).leaseCreated()
	return a.onHost(lease), nil
}

// SetEgressInput replaces the egress rules of a lease.
type SetEgressInput struct {
	LeaseID string `json:"leaseId"`
	// Egress is the new list (sandbox.LeaseSpec.Egress): empty allows
	// everything the server allows.
	Egress []string `json:"egress"`
}

// SetEgress replaces the egress rules of a lease; new connections follow
// them. A lease that is gone is a SandboxLeaseGone.
func (a *Activities) SetEgress(ctx context.Context, in SetEgressInput) error {
	if err := sandbox.CheckID("leaseId", in.LeaseID); err != nil {
		return classify(err)
	}
	if err := sandbox.CheckEgress("egress", in.Egress); err != nil {
		return classify(err)
	}
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	return classify(a.Provider.SetEgress(ctx, in.LeaseID, in.Egress))
}
