package activities

import (
	"context"
	"errors"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// CleanupDetails are the cleanup fields of the details of a
// SandboxCleanupError: which lease may hold an orphan and why. The details
// object is a sandbox.FailureDetails; this is the part of it that names
// the orphan, kept for callers that decode only that.
type CleanupDetails struct {
	LeaseID   string                `json:"leaseId"`
	ProcessID string                `json:"processId,omitempty"`
	Reason    sandbox.CleanupReason `json:"reason"`
}

// TypeUnexpected is the (retryable) error type of a provider error outside
// the sandbox taxonomy: a provider bug, since Provider promises typed errors.
const TypeUnexpected = sandbox.TypeUnexpected

// fail is classify for an activity's final error, counted first by the
// metrics that follow failures (cleanup errors, lost output connections).
func fail(ctx context.Context, err error) error {
	if err != nil {
		meterOf(ctx).failed(err)
	}
	return classifyAttempt(err, attemptOf(ctx))
}

// attemptOf is the attempt of the activity running in ctx, or 0 outside
// one.
func attemptOf(ctx context.Context) int {
	if !activity.IsActivity(ctx) {
		return 0
	}
	return int(activity.GetInfo(ctx).Attempt)
}

// classify turns a provider error into the failure an activity returns: a
// top-level *temporal.ApplicationError typed by the sandbox taxonomy, with
// retryability decided here rather than by a retry policy. Context errors
// pass through so that Temporal reports cancellations and timeouts as such.
func classify(err error) error { return classifyAttempt(err, 0) }

func classifyAttempt(err error, attempt int) error {
	return classifyWith(err, func(d *sandbox.FailureDetails) { d.Attempt = attempt })
}

// classifyWith is classify with details that adjust fills in further.
func classifyWith(err error, adjust func(*sandbox.FailureDetails)) error {
	if err == nil {
		return nil
	}
	if sandbox.ErrorType(err) == "" && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	// Outside the taxonomy: a bug or an unexpected condition, typed
	// SandboxUnexpectedError. Retrying is the safe default for operations
	// that never reuse a tainted lease.
	d := sandbox.DetailsOf(err)
	adjust(&d)
	return NewFailure(err.Error(), d, nil)
}

// Failure returns err, a typed error of the sandbox package (an
// *sandbox.InvalidInputError, say), as the failure a workflow or an
// activity raises: see NewFailure.
func Failure(err error) *temporal.ApplicationError {
	return NewFailure(err.Error(), sandbox.DetailsOf(err), nil)
}

// NewFailure is the one constructor of the ApplicationErrors sandboxflow
// raises, so that every one looks the same from any language: its type is
// details.Kind (a name of the sandbox taxonomy, never a Go type name), it
// is non-retryable when the details say so, and it carries details as its
// one detail, a JSON object (sandbox.FailureDetails, docs/POLYGLOT.md).
//
// cause is kept only when it is itself a Temporal failure (an activity's,
// a child's, a timeout): any other Go error would reach other languages as
// an ApplicationError typed by its Go type name ("wrapError",
// "InvalidInputError"), marked retryable whatever this failure says. Its
// text is in message already.
func NewFailure(message string, details sandbox.FailureDetails, cause error) *temporal.ApplicationError {
	if details.Cause == "" && cause != nil {
		details.Cause = sandbox.ErrorType(cause)
	}
	var failure *temporal.ApplicationError
	errors.As(temporal.NewApplicationErrorWithOptions(message, details.Kind, temporal.ApplicationErrorOptions{
		NonRetryable: !details.Retryable,
		Cause:        temporalCause(cause),
		Details:      []any{details},
	}), &failure)
	return failure
}

// temporalCause returns cause if the Temporal SDK converts it to a failure
// of its own kind, and nil otherwise.
func temporalCause(cause error) error {
	switch cause.(type) {
	case *temporal.ApplicationError, *temporal.ActivityError, *temporal.ChildWorkflowExecutionError,
		*temporal.TimeoutError, *temporal.CanceledError, *temporal.TerminatedError, *temporal.PanicError,
		*temporal.ServerError:
		return cause
	}
	return nil
}
