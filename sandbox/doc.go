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
// typed errors below, each with a stable type name (the Type* constants).
// Those names become Temporal ApplicationError types, so they are API: code
// and retry policies match on them.
//
//	error                     type name                  retryable  meaning
//	*CleanupError             SandboxCleanupError        no         the lease may hold an orphan process; destroy it
//	*ConnectionExhaustedError OutputConnectionError      yes        the output stream could not be attached; the process was killed
//	*OutputEvictedError       SandboxOutputEvicted       no         output was lost from the server's journal
//	*ProtocolError            SandboxProtocolError       no         the server broke the wire contract
//	*InvalidInputError        SandboxInvalidInput        no         the request was rejected before anything was sent
//	*APIError                 SandboxAPIError            5xx, 429   the server answered with a failure status
//	*LeaseGoneError           SandboxLeaseGone           no         the lease no longer exists
//	*HostLostError            SandboxHostLost            no         the lease's host (on a fleet) took no work in time
//	*UnavailableError         SandboxUnavailable         yes        the server could not be reached or did not answer in time
//	*PaymentRequiredError     SandboxPaymentRequired     no         the account has no credit (HTTP 402)
//
// The activities and the workflows raise five more, which no Provider
// returns:
//
//	raised by                 type name                     retryable  meaning
//	activities                SandboxUnexpectedError        yes        a provider returned an error outside this table
//	Execute                   SandboxDetached               yes        the attempt left its command running for the next
//	Execute                   SandboxProcessUnrecorded      yes        the process could not be recorded; killed before it started
//	workflows                 SandboxCompensationExhausted  no         the command used up its fresh leases
//	sessions                  SandboxSessionClosed          no         the session is closing or no longer running
//
// The table is [Kinds], the one place that names every failure, says which
// is retried and which leaves the lease unusable (Cleanup, LeaseGone and HostLost:
// give the lease up, take a fresh one); [Retryable], [NonRetryableTypes] (a retry
// policy's NonRetryableErrorTypes) and [LeaseUnusable] read it, and so do
// the activities and the workflows.
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
