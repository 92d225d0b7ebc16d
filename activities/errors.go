package activities

import (
	"context"
	"errors"

	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// CleanupDetails are the details of a SandboxCleanupError: which lease may
// hold an orphan and why.
type CleanupDetails struct {
	LeaseID   string                `json:"leaseId"`
	ProcessID string                `json:"processId,omitempty"`
	Reason    sandbox.CleanupReason `json:"reason"`
}

// TypeUnexpected is the (retryable) error type of a provider error outside
// the sandbox taxonomy: a provider bug, since Provider promises typed errors.
const TypeUnexpected = "SandboxUnexpectedError"

// fail is classify for an activity's final error, counted first by the
// metrics that follow failures (cleanup errors, lost output connections).
func fail(ctx context.Context, err error) error {
	if err != nil {
		meterOf(ctx).failed(err)
	}
	return classify(err)
}

// classify turns a provider error into the failure an activity returns: a
// top-level *temporal.ApplicationError typed by the sandbox taxonomy, with
// retryability decided here rather than by a retry policy. Context errors
// pass through so that Temporal reports cancellations and timeouts as such.
func classify(err error) error {
	if err == nil {
		return nil
	}
	typ := sandbox.ErrorType(err)
	if typ == "" {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		// Outside the taxonomy: a bug or an unexpected condition. Retrying is
		// the safe default for operations that never reuse a tainted lease.
		return temporal.NewApplicationErrorWithCause(err.Error(), TypeUnexpected, err)
	}
	var details []any
	var cleanup *sandbox.CleanupError
	if errors.As(err, &cleanup) {
		details = append(details, CleanupDetails{LeaseID: cleanup.LeaseID, ProcessID: cleanup.ProcessID, Reason: cleanup.Reason})
	}
	return temporal.NewApplicationErrorWithOptions(err.Error(), typ, temporal.ApplicationErrorOptions{
		NonRetryable: !sandbox.Retryable(err),
		Details:      details,
	})
}
