// Package createos is a sandbox.Provider over the CreateOS sandbox HTTP API
// (the contract is the project's PROTOCOL.md): the hosted service, or the
// project's own local server, which speaks the same protocol.
//
// A Client leases sandboxes (CreateLease, GetLease, DestroyLease,
// ListLeases, PauseLease, ResumeLease) and runs commands in them (Execute,
// and Attach to follow a command again after its caller died).
//
// # How a command runs
//
// A command is never given to a shell as text. Execute builds a short bash
// script in which every word of the command is single-quoted: the script
// waits for a start-gate file, enters the working directory, exports the
// variables and execs the command with its stdin redirected from a staged
// file or /dev/null. The client attaches to the process's output stream
// first and opens the gate second, so no output can be missed. The output
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
// # Rate limit
//
// The hosted service allows 300 requests a minute per caller. A Client
// spaces its requests (Config.PaceInterval, 300 ms by default, off on
// loopback); an output stream counts once, when it opens.
package createos
