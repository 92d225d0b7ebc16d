package sandbox

import "errors"

// FailureDetails is the details object of every failure sandboxflow raises:
// the one Temporal ApplicationError detail, as JSON, that a caller in any
// language reads instead of parsing the message. Kind is always set; the
// other fields are set when they apply to the kind (the table in the
// package documentation and docs/POLYGLOT.md says which). It never holds a
// secret, a response body or a URL.
type FailureDetails struct {
	// Kind is the failure's type name (a Type* constant), the same as the
	// ApplicationError's type.
	Kind string `json:"kind"`
	// Retryable: the same operation may succeed when tried again (the
	// ApplicationError's own NonRetryable flag is its negation).
	Retryable bool `json:"retryable"`
	// LeaseUnusable: the lease concerned must never be used again.
	LeaseUnusable bool `json:"leaseUnusable,omitempty"`

	// Field is the input field at fault (SandboxInvalidInput), as a JSON
	// path such as "command.timeout".
	Field string `json:"field,omitempty"`
	// Reason says why: what the field should be (SandboxInvalidInput), the
	// CleanupReason (SandboxCleanupError), the ProtocolKind
	// (SandboxProtocolError).
	Reason string `json:"reason,omitempty"`
	// LeaseID and ProcessID name the lease and the process concerned.
	LeaseID   string `json:"leaseId,omitempty"`
	ProcessID string `json:"processId,omitempty"`
	// Host is the sandbox host concerned, on a fleet (SandboxHostLost).
	Host string `json:"host,omitempty"`
	// Operation names the request to the sandbox server that failed, for
	// example "create process".
	Operation string `json:"operation,omitempty"`
	// Status, Code and RequestID are the server's HTTP status, its machine
	// code and its request id (SandboxAPIError, SandboxPaymentRequired).
	Status    int    `json:"status,omitempty"`
	Code      string `json:"code,omitempty"`
	RequestID string `json:"requestId,omitempty"`
	// Connects counts the output-stream connects made
	// (OutputConnectionError).
	Connects int `json:"connects,omitempty"`
	// After is the output cursor that fell out of the server's journal
	// (SandboxOutputEvicted).
	After int64 `json:"after,omitempty"`
	// Attempt is the activity attempt that failed, from 1 (failures raised
	// by an activity).
	Attempt int `json:"attempt,omitempty"`
	// FreshLeases counts the fresh leases the command took and
	// DestroyedLeases the leases destroyed (SandboxCompensationExhausted).
	FreshLeases     int      `json:"freshLeases,omitempty"`
	DestroyedLeases []string `json:"destroyedLeases,omitempty"`
	// Starts is how many times the command was started before the failure
	// (failures of Execute and of the workflows; see Result.Starts).
	Starts int `json:"starts,omitempty"`
	// Template names the template concerned and LogTail is the end of its
	// build's log (SandboxTemplateBuildFailed).
	Template string `json:"template,omitempty"`
	LogTail  string `json:"logTail,omitempty"`
	// Cause is the type name of the failure that caused this one, when it
	// is of the taxonomy (the failure that cost a compensated command its
	// last lease).
	Cause string `json:"cause,omitempty"`
}

// DetailsOf returns the details of err: its kind (ErrorType) with the
// table's retryability, and the fields of the typed error of this package
// in its chain, if any. An error outside the taxonomy has Kind
// TypeUnexpected.
func DetailsOf(err error) FailureDetails {
	d := FailureDetails{Kind: ErrorType(err)}
	if d.Kind == "" {
		d.Kind = TypeUnexpected
	}
	var (
		cleanup   *CleanupError
		conn      *ConnectionExhaustedError
		evicted   *OutputEvictedError
		protocol  *ProtocolError
		invalid   *InvalidInputError
		gone      *LeaseGoneError
		lost      *HostLostError
		payment   *PaymentRequiredError
		api       *APIError
		unavail   *UnavailableError
		build     *TemplateBuildError
		fillsKind = func(k string) bool { return d.Kind == k }
	)
	switch {
	case fillsKind(TypeCleanup) && errors.As(err, &cleanup):
		d.LeaseID, d.ProcessID, d.Reason = cleanup.LeaseID, cleanup.ProcessID, string(cleanup.Reason)
	case fillsKind(TypeConnectionExhausted) && errors.As(err, &conn):
		d.LeaseID, d.ProcessID, d.Connects = conn.LeaseID, conn.ProcessID, conn.Attempts
	case fillsKind(TypeOutputEvicted) && errors.As(err, &evicted):
		d.ProcessID, d.After = evicted.ProcessID, evicted.After
	case fillsKind(TypeProtocol) && errors.As(err, &protocol):
		d.Reason = string(protocol.Kind)
	case fillsKind(TypeInvalidInput) && errors.As(err, &invalid):
		d.Field, d.Reason = invalid.Field, invalid.Reason
	case fillsKind(TypeLeaseGone) && errors.As(err, &gone):
		d.LeaseID, d.Reason = gone.LeaseID, string(gone.Status)
	case fillsKind(TypeHostLost) && errors.As(err, &lost):
		d.Host, d.LeaseID = lost.Host, lost.LeaseID
	case fillsKind(TypePaymentRequired) && errors.As(err, &payment):
		d.Operation, d.Status, d.Code, d.RequestID = payment.Operation, 402, payment.Code, payment.RequestID
	case fillsKind(TypeAPI) && errors.As(err, &api):
		d.Operation, d.Status, d.Code, d.RequestID = api.Operation, api.Status, api.Code, api.RequestID
	case fillsKind(TypeUnavailable) && errors.As(err, &unavail):
		d.Operation = unavail.Operation
	case fillsKind(TypeTemplateBuildFailed) && errors.As(err, &build):
		d.Template, d.LogTail = build.Name, build.LogTail
	}
	d.Retryable = err != nil && Retryable(err)
	if k, ok := KindOf(d.Kind); ok {
		d.LeaseUnusable = k.LeaseUnusable
		if d.Kind == TypeUnexpected {
			d.Retryable = true
		}
	}
	return d
}

// NewFailureDetails returns the details of a failure of kind typ that has
// no error of this package behind it (a kind raised by the activities or
// the workflows), with the table's retryability.
func NewFailureDetails(typ string) FailureDetails {
	k, _ := KindOf(typ)
	return FailureDetails{Kind: typ, Retryable: k.Retry == RetryAlways, LeaseUnusable: k.LeaseUnusable}
}
