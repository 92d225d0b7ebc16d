package activities

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Labels that every lease created by these activities carries. Together
// with the idempotency key derived from them they make a lost create
// response harmless: the retry gets the same sandbox from a server that
// honours the key, and otherwise a sweep finds the orphan by its run label.
const (
	LabelRun        = "sandboxflow-run"
	LabelGeneration = "sandboxflow-generation"
	LabelWorkflowID = "sandboxflow-workflow-id"
)

// CreateLeaseInput asks for the first lease of a run.
type CreateLeaseInput struct {
	Spec sandbox.LeaseSpec `json:"spec"`
	// RunKey identifies the run that owns the lease; every lease of the run
	// is labelled with it.
	RunKey string `json:"runKey"`
	// Generation counts the leases of a run: 0 for the first, n for the
	// n-th fresh lease.
	Generation int `json:"generation"`
}

// AcquireFreshLeaseInput asks for a lease to replace one that must not be
// used again.
type AcquireFreshLeaseInput struct {
	// Replacing is the lease given up, if any. It is destroyed (or
	// confirmed gone) before the new lease is created.
	Replacing string            `json:"replacing,omitempty"`
	Spec      sandbox.LeaseSpec `json:"spec"`
	RunKey    string            `json:"runKey"`
	// Generation of the new lease; leases of this run from earlier
	// generations are swept.
	Generation int `json:"generation"`
}

// DestroyLeaseInput asks for a lease to be destroyed and, when RunKey is
// set, for every other lease of the run to be swept.
type DestroyLeaseInput struct {
	// LeaseID is destroyed; empty means sweep only.
	LeaseID string `json:"leaseId,omitempty"`
	// RunKey, when set, also destroys every sandbox labelled with this run
	// except Keep.
	RunKey string `json:"runKey,omitempty"`
	// Keep is a lease of the run that the sweep must leave alone (the lease
	// a caller asked to keep).
	Keep string `json:"keep,omitempty"`
}

var errMissingRunKey = &sandbox.InvalidInputError{Field: "runKey", Reason: "every lease must belong to a run"}

// CreateLease creates the first lease of a run, labelled with the run and
// created under an idempotency key derived from the run and generation.
func (a *Activities) CreateLease(ctx context.Context, in CreateLeaseInput) (sandbox.Lease, error) {
	if in.RunKey == "" {
		return sandbox.Lease{}, classify(errMissingRunKey)
	}
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	lease, err := a.create(ctx, a.labelledSpec(ctx, in.Spec, in.RunKey, in.Generation))
	return lease, fail(ctx, err)
}

// DestroyLease destroys a lease; a lease that is already gone is success.
// With a RunKey it then sweeps the run's other leases (the orphans of lost
// create responses), except Keep.
func (a *Activities) DestroyLease(ctx context.Context, in DestroyLeaseInput) error {
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	if in.LeaseID != "" {
		if err := a.Provider.DestroyLease(ctx, in.LeaseID); err != nil {
			return classify(err)
		}
		meterOf(ctx).leaseDestroyed()
	}
	if in.RunKey == "" {
		return nil
	}
	return classify(a.sweep(ctx, in.RunKey, func(l sandbox.Lease) bool { return l.ID != in.Keep && l.ID != in.LeaseID }))
}

// AcquireFreshLease replaces a lease that must not be used again: it makes
// sure the replaced lease (Replacing, if set) is gone, tries to destroy
// every lease of the run from an earlier generation (orphans of lost
// create responses), then creates the new lease. Leases of the new generation are left alone: they are what an
// earlier attempt of this activity created, and the idempotency key
// returns them.
func (a *Activities) AcquireFreshLease(ctx context.Context, in AcquireFreshLeaseInput) (sandbox.Lease, error) {
	if in.RunKey == "" {
		return sandbox.Lease{}, classify(errMissingRunKey)
	}
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	if in.Replacing != "" {
		// Not counted as destroyed: whoever asks for the replacement
		// destroyed it first (the workflows do, and do not send
		// Replacing); this makes sure.
		if err := a.Provider.DestroyLease(ctx, in.Replacing); err != nil {
			return sandbox.Lease{}, classify(err)
		}
	}
	// The sweep is best effort: an orphan it misses now is destroyed by
	// the run's release, which sweeps every lease of the run. Failing the
	// attempt for it would make a replacement lease far likelier to fail
	// than a first one, which needs no sweep.
	err := a.sweep(ctx, in.RunKey, func(l sandbox.Lease) bool {
		gen, err := strconv.Atoi(l.Labels[LabelGeneration])
		return err != nil || gen < in.Generation
	})
	if err != nil {
		activity.GetLogger(ctx).Warn("orphan sweep failed; the run's release sweeps again", "error", err)
	}
	lease, err := a.create(ctx, a.labelledSpec(ctx, in.Spec, in.RunKey, in.Generation))
	if err != nil {
		return sandbox.Lease{}, fail(ctx, err)
	}
	meterOf(ctx).compensation()
	return lease, nil
}

// maxGoneCreates bounds how many gone sandboxes one create steps over.
const maxGoneCreates = 3

// create creates a lease under spec's idempotency key. A create answered
// with a sandbox that is gone — typically one that an earlier attempt of
// the activity created under the same key, then destroyed because it could
// not be made ready — is repeated under a key derived from that sandbox's
// id: a new sandbox, instead of a SandboxLeaseGone that would cost the run
// a compensation. Every attempt walks the same chain of keys, so a lost
// create response anywhere along it is still answered with the same
// sandbox on the next attempt.
//
// A sandbox that was created but could neither be set up nor destroyed (a
// *sandbox.CleanupError without a process) is destroyed here once more (a
// few times, if need be): if that works, the run has lost nothing but the setup failure, which is
// returned as it is (and usually retried), instead of a cleanup error that
// would cost a compensation.
//
// Each lease it returns counts as created.
func (a *Activities) create(ctx context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
	for steps := 0; ; steps++ {
		lease, err := a.Provider.CreateLease(ctx, spec)
		if err == nil {
			meterOf(ctx).leaseCreated()
			return a.onHost(lease), nil
		}
		err = a.destroyHalfMade(ctx, err)
		var gone *sandbox.LeaseGoneError
		if sandbox.ErrorType(err) != sandbox.TypeLeaseGone || !errors.As(err, &gone) || gone.LeaseID == "" || steps == maxGoneCreates {
			return lease, err
		}
		activity.GetLogger(ctx).Info("the sandbox of this create is gone; creating another", "gone", gone.LeaseID)
		spec.IdempotencyKey = idempotencyKey(spec.IdempotencyKey, gone.LeaseID)
	}
}

// redestroys bounds the destroys of a sandbox that could not be set up
// (see create), redestroyDelay is the pause between two.
const (
	redestroys     = 3
	redestroyDelay = 250 * time.Millisecond
)

// destroyHalfMade returns err, the failure of a create or a fork, or —
// when err is the cleanup error of a sandbox that was made but could
// neither be set up nor destroyed, and destroying it once more works —
// the failure that cost it its setup.
func (a *Activities) destroyHalfMade(ctx context.Context, err error) error {
	var cleanup *sandbox.CleanupError
	if !errors.As(err, &cleanup) || cleanup.Reason != sandbox.TerminationUnconfirmed ||
		cleanup.ProcessID != "" || cleanup.LeaseID == "" || cleanup.Err == nil {
		return err
	}
	if a.destroyAgain(ctx, cleanup.LeaseID) != nil {
		return err
	}
	activity.GetLogger(ctx).Info("destroyed a sandbox that could not be set up", "lease", cleanup.LeaseID)
	meterOf(ctx).leaseDestroyed()
	return setupFailure(cleanup.Err)
}

// destroyAgain destroys a sandbox that could not be set up, trying a
// few times: a destroy is idempotent, and each one that fails costs the
// run a compensation.
func (a *Activities) destroyAgain(ctx context.Context, leaseID string) error {
	var err error
	for i := range redestroys {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(redestroyDelay):
			}
		}
		if err = a.Provider.DestroyLease(ctx, leaseID); err == nil || !sandbox.Retryable(err) {
			return err
		}
	}
	return err
}

// setupFailure returns the failure that cost a sandbox its setup, from
// the Err of the *sandbox.CleanupError that its failed destroy caused.
// That Err may join the setup failure and the destroy's own failure (an
// error whose Unwrap returns both, the setup failure first): once the
// destroy has been repeated and succeeded, the destroy's failure is stale
// and must not give the error its type (a 503 of the first DELETE would
// make an unavailable server's failure a SandboxAPIError).
func setupFailure(err error) error {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		if errs := joined.Unwrap(); len(errs) > 0 && errs[0] != nil {
			return errs[0]
		}
	}
	return err
}

// sweep destroys the run's leases that doom selects: orphans, each a
// suspected leak. A provider that cannot list by label has nothing to
// sweep; that is logged, not fatal.
func (a *Activities) sweep(ctx context.Context, runKey string, doom func(sandbox.Lease) bool) error {
	leases, err := a.Provider.ListLeases(ctx, map[string]string{LabelRun: runKey})
	var api *sandbox.APIError
	if errors.As(err, &api) && (api.Status == 404 || api.Status == 405 || api.Status == 501) {
		activity.GetLogger(ctx).Warn("sandbox server cannot list leases by label; orphan sweep skipped", "status", api.Status)
		return nil
	}
	if err != nil {
		return err
	}
	for _, l := range leases {
		if l.Status.Terminal() || !doom(l) {
			continue
		}
		activity.GetLogger(ctx).Info("destroying orphaned lease", "lease", l.ID, "generation", l.Labels[LabelGeneration])
		if err := a.Provider.DestroyLease(ctx, l.ID); err != nil {
			return fmt.Errorf("sweep orphaned lease %s: %w", l.ID, err)
		}
		meterOf(ctx).orphanDestroyed()
	}
	return nil
}

// labelledSpec adds the run's labels and idempotency key to spec.
func (a *Activities) labelledSpec(ctx context.Context, spec sandbox.LeaseSpec, runKey string, generation int) sandbox.LeaseSpec {
	spec.Labels = runLabels(ctx, spec.Labels, runKey, generation)
	spec.IdempotencyKey = idempotencyKey(runKey, strconv.Itoa(generation))
	return spec
}

// runLabels returns labels with those of a lease of the run's generation.
func runLabels(ctx context.Context, labels map[string]string, runKey string, generation int) map[string]string {
	labels = maps.Clone(labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelRun] = runKey
	labels[LabelGeneration] = strconv.Itoa(generation)
	labels[LabelWorkflowID] = activity.GetInfo(ctx).WorkflowExecution.ID
	return labels
}

// idempotencyKey derives a create's idempotency key from its parts.
func idempotencyKey(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return "sandboxflow-" + hex.EncodeToString(sum[:16])
}
