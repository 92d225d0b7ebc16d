package leaseinit

import "os"

// The init hook.
//
// The server re-executes its own binary (/proc/self/exe) with argv[0] set
// to Arg0, and the package-level init function below takes over that
// process before main (or the test runner) ever runs, and before the
// package inits of everything this package does not import: so the fewer
// it imports, the sooner a lease starts. Two kinds of process start that
// way:
//
//   - a lease init (argv[2] == LeaseArg, leaseinit.go): pid 1 of a lease's
//     namespaces, for the life of the sandbox;
//   - a supervisor (supervisor.go): the parent of one managed process, a
//     child subreaper, so that orphans of the command's tree come back to
//     it. It forwards termination signals to every process of its tree,
//     reaps them, reports the command's exit at once but exits only when
//     none is left, so "the supervisor is gone" means "the whole tree has
//     exited". In namespace mode the lease init forks it inside the lease;
//     in process-group mode the server starts it on the host.
//
// The hook does nothing in any other process: a program that links this
// package (sandboxd, a test binary) behaves normally unless it was started
// with that exact argv[0].

// Arg0 marks an init process. argv[1] is the server's root directory, so
// that a server restarted on the same root can find the inits a crashed
// predecessor left behind (localsandbox's sweep.go).
const Arg0 = "sandboxflow-init"

// LeaseArg is argv[2] of a lease init.
const LeaseArg = "lease"

func init() {
	if len(os.Args) < 2 || os.Args[0] != Arg0 {
		return
	}
	if len(os.Args) >= 3 && os.Args[2] == LeaseArg {
		os.Exit(runLeaseInit())
	}
	os.Exit(runSupervisor())
}
