package sandbox

import (
	"context"
	"errors"
)

// Retry says whether an operation that failed with an error of a kind may
// succeed when it is simply tried again on the same lease.
type Retry int

const (
	// RetryNever: trying again cannot help, or (for a cleanup error) must
	// not happen on that lease.
	RetryNever Retry = iota + 1
	// RetryAlways: the failure is transient.
	RetryAlways
	// RetryByStatus: an *APIError is retried on 5xx and 429 only.
	RetryByStatus
)

// Kind is one entry of the failure taxonomy. The table of kinds (Kinds) is
// the one place that names every failure sandboxflow raises and says which
// is retried and which leaves the lease unusable; Retryable,
// NonRetryableTypes and LeaseUnusable read it, and so do the activities and
// the workflows' retry policies.
type Kind struct {
	// Type is the stable type name (a Type* constant): the type of the
	// Temporal ApplicationError that carries the failure, the same in
	// every language.
	Type string
	// RaisedBy says where the failure starts: "provider" (a typed error of
	// this package, which the activities pass on), "activity" or
	// "workflow".
	RaisedBy string
	// Retry says whether the same operation may be tried again.
	Retry Retry
	// LeaseUnusable: the lease must never be used again (it may hold an
	// orphan process, or it is gone). The remedy is a fresh lease: a
	// compensation.
	LeaseUnusable bool
	// is reports whether err's chain holds an error of this kind.
	is func(err error) bool
}

// Where a failure starts (Kind.RaisedBy).
const (
	RaisedByProvider = "provider"
	RaisedByActivity = "activity"
	RaisedByWorkflow = "workflow"
)

// kinds is the taxonomy, in the order ErrorType looks for them: cleanup
// errors come first, because they wrap the failure that caused them and
// the lease's state matters more than that cause. The kinds without an
// error type of this package (is is nil) are known by their type name
// only.
var kinds = []Kind{
	{Type: TypeCleanup, RaisedBy: RaisedByProvider, Retry: RetryNever, LeaseUnusable: true, is: has[*CleanupError]},
	{Type: TypeConnectionExhausted, RaisedBy: RaisedByProvider, Retry: RetryAlways, is: has[*ConnectionExhaustedError]},
	{Type: TypeOutputEvicted, RaisedBy: RaisedByProvider, Retry: RetryNever, is: has[*OutputEvictedError]},
	{Type: TypeProtocol, RaisedBy: RaisedByProvider, Retry: RetryNever, is: has[*ProtocolError]},
	{Type: TypeInvalidInput, RaisedBy: RaisedByProvider, Retry: RetryNever, is: has[*InvalidInputError]},
	{Type: TypeLeaseGone, RaisedBy: RaisedByProvider, Retry: RetryNever, LeaseUnusable: true, is: has[*LeaseGoneError]},
	{Type: TypeHostLost, RaisedBy: RaisedByProvider, Retry: RetryNever, LeaseUnusable: true, is: has[*HostLostError]},
	{Type: TypePaymentRequired, RaisedBy: RaisedByProvider, Retry: RetryNever, is: has[*PaymentRequiredError]},
	{Type: TypeTemplateBuildFailed, RaisedBy: RaisedByProvider, Retry: RetryNever, is: has[*TemplateBuildError]},
	{Type: TypeAPI, RaisedBy: RaisedByProvider, Retry: RetryByStatus, is: has[*APIError]},
	{Type: TypeUnavailable, RaisedBy: RaisedByProvider, Retry: RetryAlways, is: has[*UnavailableError]},
	{Type: TypeUnexpected, RaisedBy: RaisedByActivity, Retry: RetryAlways},
	{Type: TypeDetached, RaisedBy: RaisedByActivity, Retry: RetryAlways},
	{Type: TypeUnrecorded, RaisedBy: RaisedByActivity, Retry: RetryAlways},
	{Type: TypeUnattended, RaisedBy: RaisedByWorkflow, Retry: RetryNever},
	{Type: TypeCompensationExhausted, RaisedBy: RaisedByWorkflow, Retry: RetryNever},
	{Type: TypeSessionClosed, RaisedBy: RaisedByWorkflow, Retry: RetryNever},
}

// KindOf returns the entry of the table for type name typ.
func KindOf(typ string) (Kind, bool) {
	for _, k := range kinds {
		if k.Type == typ {
			return k, true
		}
	}
	return Kind{}, false
}

func has[T error](err error) bool {
	var target T
	return errors.As(err, &target)
}

// Kinds returns the failure taxonomy, in the order of precedence of
// ErrorType.
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// NonRetryableTypes returns the type names that are never retried: what a
// Temporal retry policy's NonRetryableErrorTypes should list.
func NonRetryableTypes() []string {
	var out []string
	for _, k := range kinds {
		if k.Retry == RetryNever {
			out = append(out, k.Type)
		}
	}
	return out
}

// typed is an error that names its type, as a Temporal ApplicationError
// does (Type) and, optionally, its retryability (NonRetryable): the form
// in which an activity's failure reaches a workflow or a client.
type typed interface {
	error
	Type() string
}

type nonRetryable interface{ NonRetryable() bool }

// kindOf returns the kind of err: that of a typed error of this package in
// its chain, or else that of the first error in the chain that names a
// type (a Temporal ApplicationError), which it also returns, if the name
// is one of the taxonomy. Only the first named error counts, as only the
// top-level failure counts for Temporal's retries: a
// SandboxCompensationExhausted that wraps the SandboxCleanupError behind
// it is not a cleanup error.
func kindOf(err error) (Kind, error, bool) {
	if err == nil {
		return Kind{}, nil, false
	}
	for _, k := range kinds {
		if k.is != nil && k.is(err) {
			return k, nil, true
		}
	}
	var t typed
	if errors.As(err, &t) {
		for _, k := range kinds {
			if k.Type == t.Type() {
				return k, t, true
			}
		}
	}
	return Kind{}, nil, false
}

// ErrorType returns the type name (a Type* constant) of the first error in
// err's chain that belongs to the taxonomy, or "" if none does. An error
// that names its type, as a Temporal ApplicationError does, counts by that
// name.
func ErrorType(err error) string {
	k, _, _ := kindOf(err)
	return k.Type
}

// Retryable reports whether the operation that failed with err may succeed
// if it is simply tried again on the same lease. Errors outside the
// taxonomy are retryable, except the caller's own context ending. An
// error that names its type and says whether it is retryable (a Temporal
// ApplicationError) is taken at its word.
func Retryable(err error) bool {
	k, named, ok := kindOf(err)
	switch {
	case !ok:
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	case named != nil:
		if nr, ok := named.(nonRetryable); ok {
			return !nr.NonRetryable()
		}
	case k.Retry == RetryByStatus:
		var api *APIError
		errors.As(err, &api)
		return api.Retryable()
	}
	return k.Retry == RetryAlways
}

// LeaseUnusable reports whether err leaves the lease it happened on
// unusable (a cleanup error, a lease that is gone, a lost host): destroy the lease and
// take a fresh one, never retry on it.
func LeaseUnusable(err error) bool {
	k, _, ok := kindOf(err)
	return ok && k.LeaseUnusable
}

// The Is… functions report whether err's chain holds a failure of one
// kind, as a typed error of this package or as an error that names the
// kind's type (a Temporal ApplicationError from an activity or a
// workflow), in the style of the Temporal SDK's temporal.Is… functions.
// Use errors.As to reach the details of a typed error.

// IsCleanupError: the lease may hold an orphan process (SandboxCleanupError).
func IsCleanupError(err error) bool { return ErrorType(err) == TypeCleanup }

// IsConnectionExhaustedError: the output stream could not be attached
// (OutputConnectionError).
func IsConnectionExhaustedError(err error) bool { return ErrorType(err) == TypeConnectionExhausted }

// IsOutputEvictedError: output was lost from the server's journal
// (SandboxOutputEvicted).
func IsOutputEvictedError(err error) bool { return ErrorType(err) == TypeOutputEvicted }

// IsProtocolError: the server broke the wire contract (SandboxProtocolError).
func IsProtocolError(err error) bool { return ErrorType(err) == TypeProtocol }

// IsInvalidInputError: the request was rejected before anything was sent
// (SandboxInvalidInput).
func IsInvalidInputError(err error) bool { return ErrorType(err) == TypeInvalidInput }

// IsAPIError: the server answered with a failure status (SandboxAPIError).
func IsAPIError(err error) bool { return ErrorType(err) == TypeAPI }

// IsLeaseGoneError: the lease no longer exists (SandboxLeaseGone).
func IsLeaseGoneError(err error) bool { return ErrorType(err) == TypeLeaseGone }

// IsHostLostError: the host of the lease is lost (SandboxHostLost).
func IsHostLostError(err error) bool { return ErrorType(err) == TypeHostLost }

// IsUnavailableError: the server could not be reached or did not answer in
// time (SandboxUnavailable).
func IsUnavailableError(err error) bool { return ErrorType(err) == TypeUnavailable }

// IsPaymentRequiredError: the account has no credit (SandboxPaymentRequired).
func IsPaymentRequiredError(err error) bool { return ErrorType(err) == TypePaymentRequired }

// IsTemplateBuildFailed: a template's build failed
// (SandboxTemplateBuildFailed); FailureDetails.LogTail says why.
func IsTemplateBuildFailed(err error) bool { return ErrorType(err) == TypeTemplateBuildFailed }

// IsUnexpectedError: a provider returned an error outside the taxonomy
// (SandboxUnexpectedError).
func IsUnexpectedError(err error) bool { return ErrorType(err) == TypeUnexpected }

// IsDetached: an Execute attempt left its command running for the next
// attempt (SandboxDetached).
func IsDetached(err error) bool { return ErrorType(err) == TypeDetached }

// IsUnrecorded: an Execute attempt could not record its process, which was
// killed before its command started (SandboxProcessUnrecorded).
func IsUnrecorded(err error) bool { return ErrorType(err) == TypeUnrecorded }

// IsUnattended: no Execute attempt followed the command to its end within
// its timeout plus the horizon; the run gave up on it (SandboxUnattended).
func IsUnattended(err error) bool { return ErrorType(err) == TypeUnattended }

// IsCompensationExhausted: a command used up its fresh leases
// (SandboxCompensationExhausted).
func IsCompensationExhausted(err error) bool { return ErrorType(err) == TypeCompensationExhausted }

// IsSessionClosed: a session refused an Update because it is closing or no
// longer running (SandboxSessionClosed).
func IsSessionClosed(err error) bool { return ErrorType(err) == TypeSessionClosed }
