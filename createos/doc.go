// Package createos is a sandbox.Provider over the CreateOS sandbox HTTP API
// (the contract is the project's PROTOCOL.md): the hosted service, or the
// project's own local server, which speaks the same protocol with a few
// extensions (labels, Idempotency-Key). The client works without the
// extensions, and also reads the older shapes of earlier local servers.
//
//	client, err := createos.New(createos.Config{BaseURL: "https://api.sb.createos.sh", APIKey: key})
//	lease, err := client.CreateLease(ctx, sandbox.LeaseSpec{Labels: map[string]string{"run": id}})
//	res, err := client.Execute(ctx, lease, sandbox.Command{Argv: []string{"make", "test"}}, nil)
//
// A Client leases sandboxes (CreateLease, GetLease, DestroyLease,
// ListLeases, PauseLease, ResumeLease, ForkLease of a paused one), sets
// their egress (SetEgress) and runs commands in them (Execute, and Attach
// to follow a command again after its caller died).
//
// # How a command runs
//
// A command is never given to a shell as text. Execute builds a short sh
// script in which every word of the command is single-quoted: the script
// waits at a start gate (it reads the run's random token from the
// process's stdin), enters the working directory, exports the variables
// and execs the command with its stdin redirected from a staged file or
// /dev/null. The client attaches to the process's output stream first and
// opens the gate second, by writing the token, so no output can be
// missed: three requests for a command without stdin. The output
// is a journal of numbered frames; a lost stream is reconnected after the
// last frame read, within a budget, and every frame is checked against the
// contract.
//
// # Failures
//
// Errors are the typed errors of package sandbox or wrap a context error;
// their text never holds a URL, the API key, a response body, an
// environment value or stdin. Two outcomes matter most to a caller:
//
//   - *sandbox.CleanupError: a process may be left in the lease that
//     nobody controls (its creation or its end could not be confirmed).
//     Destroy the lease; never reuse it.
//   - *sandbox.ConnectionExhaustedError: the output could not be followed;
//     the process was killed, so running the command again is safe.
//
// # A create whose answer is lost
//
// The hosted service holds a create until the sandbox runs (CreateTimeout
// bounds it) and has neither labels nor idempotency keys. On such a server
// a create carries a name derived from its labels and idempotency key:
// when the answer never comes, or the name is taken, the sandbox is looked
// up by that name instead of being created twice, and ListLeases finds a
// run's sandboxes by their names, so the orphan sweep works there too.
//
// A fork has no name and no key. One whose answer is lost is looked for by
// its labels, or as the one new fork of its source (forked_from); not
// found, it is a *sandbox.CleanupError (ForkUnconfirmed), never sent again.
//
// # Retries
//
// Requests follow the official SDKs' rules: idempotent ones are repeated
// after a network error or 408/500/502/504, any after 429 or 503, up to
// three attempts, honouring Retry-After. Failures keep the server's machine
// code and request id (*sandbox.APIError); 402 is a
// *sandbox.PaymentRequiredError.
//
// # Rate limit
//
// The hosted service allows 300 requests a minute per caller. A Client
// spaces its requests (Config.PaceInterval, 300 ms by default, off on
// loopback); an output stream counts once, when it opens.
package createos
