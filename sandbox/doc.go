// Package sandbox is the domain of sandboxflow: what a lease is, what a
// command and its result are, what a sandbox provider can do, and how every
// failure is named.
//
// It imports nothing of Temporal and nothing of HTTP. The createos package
// implements [Provider] over the CreateOS sandbox HTTP API; the activities and
// workflows packages run a Provider's operations as Temporal activities.
//
// # Failures
//
// Every error a Provider returns is either a context error or one of the
// typed errors of this package (*CleanupError, *ConnectionExhaustedError,
// *OutputEvictedError, *ProtocolError, *InvalidInputError, *APIError,
// *LeaseGoneError, *HostLostError, *UnavailableError,
// *PaymentRequiredError, *TemplateBuildError), each with a stable type
// name (the Type* constants). Those names become Temporal ApplicationError types, so they
// are API: code and retry policies match on them.
//
// [Kinds] is the one place in code that names every failure (those above,
// and five that the activities and workflows raise), says which failure is retried and
// which leaves the lease unusable (Cleanup, LeaseGone and HostLost: give
// the lease up, take a fresh one); [Retryable], [NonRetryableTypes] (a
// retry policy's NonRetryableErrorTypes) and [LeaseUnusable] read it, and
// so do the activities and the workflows. The one table of every failure,
// what it means, whether it is retried and where it goes is
// docs/RELIABILITY.md, "Where each failure goes"; a test holds it to
// [Kinds].
//
// Classify an error without a type switch with [ErrorType] or the Is…
// functions ([IsCleanupError], [IsLeaseGoneError], …), in the style of the
// Temporal SDK's temporal.Is… functions. They see the typed errors of this
// package and equally the Temporal ApplicationErrors that carry their type
// names, so a workflow or a client can ask the same question of an
// activity's failure:
//
//	if sandbox.IsCleanupError(err) { … }  // a provider's error, or an activity's
//
// Use errors.As to reach the details of a particular kind.
//
// # Details
//
// Every failure sandboxflow raises as a Temporal ApplicationError carries
// one detail, a [FailureDetails] JSON object: its kind and the field, lease,
// process, host, server status, attempt or fresh-lease count concerned, so
// that a caller in any language reads them without parsing the message.
// [DetailsOf] builds it from a typed error. The ApplicationError's type is
// always a name of the table and its cause, when it has one, is another
// Temporal failure: no Go type name reaches another language.
package sandbox
