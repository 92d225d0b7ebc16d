// Package testsuite is what tests of sandboxflow — ours and yours — need to
// inject real failures and check that nothing leaked: a FaultProxy to put
// between a client and any CreateOS-compatible server, and helpers that
// start the local sandbox server (Linux only, like the server) and wire the
// workflow and activities into the Temporal SDK's test environment.
package testsuite
