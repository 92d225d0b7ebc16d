package activities

import (
	"context"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// LeaseInput names one lease: the input of PauseLease and ResumeLease.
type LeaseInput struct {
	LeaseID string `json:"leaseId"`
}

// settlePollInterval is how often PauseLease and ResumeLease look at a
// lease that is still between two states (the protocol asks for ~250 ms).
const settlePollInterval = 250 * time.Millisecond

// PauseLease freezes every process of an idle lease and returns once the
// sandbox is paused, so that an idle session costs nothing but its
// workspace. A lease that is already paused is success.
func (a *Activities) PauseLease(ctx context.Context, in LeaseInput) (sandbox.Lease, error) {
	if err := sandbox.CheckID("leaseId", in.LeaseID); err != nil {
		return sandbox.Lease{}, classify(err)
	}
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	if err := a.Provider.PauseLease(ctx, in.LeaseID); err != nil {
		return sandbox.Lease{}, classify(err)
	}
	lease, err := a.settle(ctx, in.LeaseID)
	return a.onHost(lease), classify(err)
}

// ResumeLease thaws a paused lease and returns once it runs again: the
// next command may start at once. A lease that already runs is success; a
// lease that settles in any other state is a *sandbox.LeaseGoneError, so
// that the workflow replaces it.
func (a *Activities) ResumeLease(ctx context.Context, in LeaseInput) (sandbox.Lease, error) {
	if err := sandbox.CheckID("leaseId", in.LeaseID); err != nil {
		return sandbox.Lease{}, classify(err)
	}
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	lease, err := a.Provider.GetLease(ctx, in.LeaseID)
	if err != nil {
		return sandbox.Lease{}, classify(err)
	}
	if lease.Status == sandbox.StatusRunning {
		return a.onHost(lease), nil
	}
	if err := a.Provider.ResumeLease(ctx, in.LeaseID); err != nil {
		return sandbox.Lease{}, classify(err)
	}
	if lease, err = a.settle(ctx, in.LeaseID); err != nil {
		return sandbox.Lease{}, classify(err)
	}
	if lease.Status != sandbox.StatusRunning {
		return sandbox.Lease{}, classify(&sandbox.LeaseGoneError{LeaseID: lease.ID, Status: lease.Status})
	}
	return a.onHost(lease), nil
}

// settle polls a lease until it is no longer between two states. The
// activity's own timeout bounds the wait.
func (a *Activities) settle(ctx context.Context, leaseID string) (sandbox.Lease, error) {
	ticker := time.NewTicker(settlePollInterval)
	defer ticker.Stop()
	for {
		lease, err := a.Provider.GetLease(ctx, leaseID)
		if err != nil || !lease.Status.Transitional() {
			return lease, err
		}
		select {
		case <-ctx.Done():
			return lease, ctx.Err()
		case <-ticker.C:
		}
	}
}
