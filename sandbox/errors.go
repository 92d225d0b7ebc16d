package sandbox

import (
	"errors"
	"fmt"
)

// Type names of the failure taxonomy. They are stable API: activities and
// workflows report failures as Temporal ApplicationErrors of these types,
// and Kinds is their table. The first eleven are the typed errors of this
// package, which a Provider returns; the rest are raised by the activities
// and the workflows, with no error type of this package behind them.
const (
	TypeCleanup             = "SandboxCleanupError"
	TypeConnectionExhausted = "OutputConnectionError"
	TypeOutputEvicted       = "SandboxOutputEvicted"
	TypeProtocol            = "SandboxProtocolError"
	TypeInvalidInput        = "SandboxInvalidInput"
	TypeAPI                 = "SandboxAPIError"
	TypeLeaseGone           = "SandboxLeaseGone"
	TypeUnavailable         = "SandboxUnavailable"
	TypePaymentRequired     = "SandboxPaymentRequired"
	TypeHostLost            = "SandboxHostLost"
	// TypeTemplateBuildFailed: a template's build failed
	// (*TemplateBuildError). Non-retryable: the Dockerfile is at fault.
	TypeTemplateBuildFailed = "SandboxTemplateBuildFailed"

	// TypeUnexpected: a provider returned an error outside the taxonomy (a
	// provider bug, since Provider promises typed errors). Retryable.
	TypeUnexpected = "SandboxUnexpectedError"
	// TypeDetached: an Execute attempt left its command running for the
	// next attempt to attach to (its worker is shutting down, or Temporal
	// no longer counts it as the current attempt). Retryable.
	TypeDetached = "SandboxDetached"
	// TypeUnrecorded: an Execute attempt could not record its new process
	// in Temporal; the process was killed before its command started, so
	// the next attempt starts it afresh. Retryable.
	TypeUnrecorded = "SandboxProcessUnrecorded"
	// TypeUnattended: no Execute attempt followed the command to its end
	// within its timeout plus the horizon (Execute's
	// ScheduleToCloseTimeout): its workers kept dying or could not reach
	// Temporal. The run gives up: the lease, and with it the process tree,
	// is destroyed (KeepLease or not), so no command is left running
	// without an owner. Non-retryable.
	TypeUnattended = "SandboxUnattended"
	// TypeCompensationExhausted: a command used up its fresh leases and
	// still could not run. Non-retryable.
	TypeCompensationExhausted = "SandboxCompensationExhausted"
	// TypeSessionClosed: a session refused an Update because it is closing
	// or no longer running. Non-retryable.
	TypeSessionClosed = "SandboxSessionClosed"
)

// CleanupReason says which cleanup could not be confirmed.
type CleanupReason string

const (
	// CreationUnconfirmed: a process-create request was sent but no process
	// id came back, so a process may exist that nobody controls.
	CreationUnconfirmed CleanupReason = "creation_unconfirmed"
	// TerminationUnconfirmed: a process tree (or, without a ProcessID, a
	// whole sandbox) was told to die but its end could not be confirmed.
	TerminationUnconfirmed CleanupReason = "termination_unconfirmed"
	// ForkUnconfirmed: a fork request was sent but no answer came back,
	// and the sandbox it may have made was not found. LeaseID is the
	// source, which is intact: what may exist, uncontrolled, is a sandbox
	// forked from it, carrying the fork's labels.
	ForkUnconfirmed CleanupReason = "fork_unconfirmed"
)

// CleanupError means the lease may now hold an orphan process. The lease
// must never be used again: destroy it and take a fresh one. Retrying on the
// same lease is wrong, so the error is not retryable.
//
// A fork is the exception (Reason ForkUnconfirmed): the orphan may be a
// whole sandbox forked from LeaseID, and LeaseID itself is intact. Sending
// the fork again might make a second one, so that is not retryable either;
// the remedy is to sweep by the fork's labels.
type CleanupError struct {
	Reason    CleanupReason
	LeaseID   string
	ProcessID string // empty when creation was not confirmed
	// Err is what went wrong, when known.
	Err error
}

func (e *CleanupError) Error() string {
	var msg string
	switch e.Reason {
	case CreationUnconfirmed:
		msg = "process creation could not be confirmed; destroy the lease before reusing it"
	case TerminationUnconfirmed:
		msg = "command cleanup failed; process termination is unconfirmed"
		if e.ProcessID == "" {
			msg = "cleanup is unconfirmed: the sandbox may still exist; destroy it"
		}
	case ForkUnconfirmed:
		msg = "the fork could not be confirmed; a sandbox forked from it may exist: find it by its labels"
	default:
		msg = "cleanup could not be confirmed"
	}
	msg = fmt.Sprintf("sandbox %s: %s", e.LeaseID, msg)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *CleanupError) Unwrap() error { return e.Err }

// ConnectionExhaustedError means the output stream could not be attached or
// re-attached within the reconnect budget.
//
// With Running set, the process was left as it was — running, or exited
// with its exit status and output held by the server — so that a retry
// attaches to it again and reads on: a command is never run again only
// because its output could not be read. Otherwise there was no process to
// leave (it was never created), or it was killed.
type ConnectionExhaustedError struct {
	LeaseID   string
	ProcessID string
	// Attempts is how many connects were made.
	Attempts int
	// Running: the process was left for a later Attach, not killed.
	Running bool `json:",omitempty"`
	// Err is the last connection failure.
	Err error
}

func (e *ConnectionExhaustedError) Error() string {
	msg := fmt.Sprintf("output connection failed after %d attempts", e.Attempts)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *ConnectionExhaustedError) Unwrap() error { return e.Err }

// OutputEvictedError means the server dropped output before it was read: the
// cursor fell out of the output journal.
//
// With Gone set, the server no longer knows the process at all: a retry
// looked for the process of an earlier attempt and found neither it nor
// proof that its command never ran (ErrNeverStarted). The command may
// have run; it is not run again, since it might run twice.
type OutputEvictedError struct {
	ProcessID string
	// After is the cursor that was no longer in the journal.
	After int64
	// Gone: the whole process is unknown to the server, not just output.
	Gone bool `json:",omitempty"`
}

func (e *OutputEvictedError) Error() string {
	if e.Gone {
		return fmt.Sprintf("process %s is no longer known to the server: its output and exit status are lost", e.ProcessID)
	}
	return fmt.Sprintf("output of process %s after seq %d was evicted from the journal", e.ProcessID, e.After)
}

// ProtocolKind classifies a breach of the wire contract.
type ProtocolKind string

const (
	SequenceGap ProtocolKind = "sequence_gap"
	// SequenceRegression: inside one connection, a data frame's seq did
	// not grow. The stream is re-read from the cursor; only when that
	// keeps failing does the error surface (in a
	// *ConnectionExhaustedError).
	SequenceRegression ProtocolKind = "sequence_regression"
	InvalidFrame       ProtocolKind = "invalid_frame"
	BadBase64          ProtocolKind = "bad_base64"
	MissingExitStatus  ProtocolKind = "missing_exit_status"
	FrameTooLarge      ProtocolKind = "frame_too_large"
	UnknownEvent       ProtocolKind = "unknown_event"
	// ErrorEvent: the server ended a stream with an error frame.
	ErrorEvent ProtocolKind = "error_event"
	// InvalidResponse: a response did not have the contract's shape.
	InvalidResponse ProtocolKind = "invalid_response"
)

// ProtocolError means the server said something the contract does not allow.
type ProtocolError struct {
	Kind ProtocolKind
	// Detail is a short description. It never contains response bodies.
	Detail string
}

func (e *ProtocolError) Error() string {
	if e.Detail == "" {
		return "protocol error: " + string(e.Kind)
	}
	return fmt.Sprintf("protocol error: %s: %s", e.Kind, e.Detail)
}

// InvalidInputError means a request was rejected before anything was sent.
type InvalidInputError struct {
	Field  string
	Reason string
}

func (e *InvalidInputError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason)
}

// APIError is a failure status from the server. The response body is never
// kept in it: only the server's machine-readable code and request id.
type APIError struct {
	Status int
	// Operation names the request, for example "create process".
	Operation string
	// Code is the server's machine code for the failure (JSend data.code or
	// code), when it sent one, for example "name_taken".
	Code string
	// RequestID is the server's id for the request (its X-Request-Id
	// header), for the operator's logs.
	RequestID string
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("%s: HTTP %d", e.Operation, e.Status)
	if e.Code != "" {
		msg += " " + e.Code
	}
	if e.RequestID != "" {
		msg += " (request " + e.RequestID + ")"
	}
	return msg
}

// Retryable reports whether the same request may succeed later: server
// errors (5xx) and rate limiting (429) are; other client errors are not.
func (e *APIError) Retryable() bool { return e.Status >= 500 || e.Status == 429 }

// PaymentRequiredError means the account has no credit left (HTTP 402): no
// retry helps until somebody tops it up.
type PaymentRequiredError struct {
	Operation string
	Code      string
	RequestID string
}

func (e *PaymentRequiredError) Error() string {
	msg := e.Operation + ": HTTP 402 payment required"
	if e.Code != "" {
		msg += " " + e.Code
	}
	if e.RequestID != "" {
		msg += " (request " + e.RequestID + ")"
	}
	return msg
}

// LeaseGoneError means the lease no longer exists, or has reached a
// terminal state.
type LeaseGoneError struct {
	LeaseID string
	Status  LeaseStatus // the terminal state, if one was seen
}

func (e *LeaseGoneError) Error() string {
	if e.Status != "" {
		return fmt.Sprintf("sandbox %s is gone (%s)", e.LeaseID, e.Status)
	}
	return fmt.Sprintf("sandbox %s is gone", e.LeaseID)
}

// HostLostError means the host that holds a lease is lost: on a fleet of
// sandbox hosts, nobody took the lease's work on that host in time (its
// worker and sandbox server are gone, or cut off). The lease is as good as
// gone to whoever uses it: take a fresh one on another host. It may still
// exist on the host, which sweeps it when it returns.
type HostLostError struct {
	Host    string
	LeaseID string
	// Err is how the loss showed, when known.
	Err error
}

func (e *HostLostError) Error() string {
	msg := fmt.Sprintf("host %s of sandbox %s is lost", e.Host, e.LeaseID)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *HostLostError) Unwrap() error { return e.Err }

// UnavailableError means the server could not be reached, or did not answer
// in time. Its text never contains a URL.
type UnavailableError struct {
	Operation string
	Err       error
}

func (e *UnavailableError) Error() string {
	if e.Err == nil {
		return e.Operation + ": sandbox server unavailable"
	}
	return fmt.Sprintf("%s: sandbox server unavailable: %v", e.Operation, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// ErrDetached is the cause (see context.WithCancelCause) with which a caller
// cancels Execute or Attach to leave the process running: the provider then
// returns an error wrapping ErrDetached without killing the process or
// removing its staged files, so that a later Attach can follow it. A worker
// that is shutting down detaches rather than kills, and the retry on
// another worker re-attaches.
var ErrDetached = errors.New("detached from the running process")

// ErrNeverStarted is what Attach returns, wrapped, for a process that the
// server no longer knows and whose command provably never ran: the Execute
// that created it was refused by Observer.Started and killed it behind its
// start gate. Running the command now runs it once. A process that is
// gone without that proof is an *OutputEvictedError with Gone set: it may
// have run, and its result is lost.
var ErrNeverStarted = errors.New("the process was killed before its command started")
