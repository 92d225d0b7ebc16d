// Package leaseinit is what runs inside a lease: the lease init, pid 1 of
// a lease's namespaces for the life of the sandbox, and the supervisor of
// a managed process. Both are executions of the init program — a build of
// cmd/sandboxflow-init (Program), which holds this package and little
// else, or else the server's own binary — caught by this package's init
// function before main runs:
//
//	// The server (package machine) starts a lease init in new namespaces:
//	cmd := &exec.Cmd{Path: program, Args: []string{leaseinit.Arg0, root, leaseinit.LeaseArg}, …}
//	// then sends it a Config on its control socket (fd 3), and Requests.
//
//	// A supervisor: forked by a lease init (from its own program,
//	// /proc/self/exe), or started by the server on the host in
//	// process-group mode, with a SupervisorConfig on fd 3 and a status
//	// pipe on fd 4.
//	cmd := &exec.Cmd{Path: program, Args: []string{leaseinit.Arg0, root}, …}
//
//	// The spawner: started once by the server, it clones the lease inits
//	// (SpawnRequest on its socket, fd 3) and reaps them.
//	cmd := &exec.Cmd{Path: program, Args: []string{leaseinit.Arg0, "-", leaseinit.SpawnerArg}, …}
//
//	// The handshake: a server runs a program it did not build once, and
//	// uses it only if it prints ProtocolVersion.
//	cmd := &exec.Cmd{Path: program, Args: []string{leaseinit.Arg0, "-", leaseinit.VersionArg}}
//
// A program that links the package (sandboxd, the devserver, a test
// binary) needs nothing special: the hook does nothing in a process not
// started with argv[0] Arg0.
//
// # Where each mechanism is applied
//
// The namespaces (user, mount, PID, UTS, IPC, network) are made by the
// clone of the init, which the spawner (spawner.go) makes at the server's
// request (machine.Start). Inside them:
//
//   - leaseinit.go, runLeaseInit: non-dumpable (PR_SET_DUMPABLE),
//     inherited descriptors close-on-exec (close_range), a session of its
//     own; the signals that would end a pid 1 dropped; then the request
//     loop: an exec is forked by the init itself, a managed process under
//     a supervisor; kill freezes and kills a supervisor's tree.
//   - rootfs.go, buildRoot: the lease's root file system — the overlays
//     of each lower layer and its upper directory (mount "overlay"), the
//     masks of what the host image must not show (hideInUpper), the
//     workspace and tmp binds, /dev from scratch with a devpts of the
//     lease's own (setupDev), its own
//     /proc, pivot_root out of the host's tree, the hostname (the lease
//     id), and loopback up (LoopbackUp).
//   - leaseinit.go, confineChild: no_new_privs, the capability bounding
//     set and the seccomp filter, through package confine — in the init
//     itself, so that every command it forks inherits them.
//   - initproc.go, the hook (init) and the supervisor: applyRlimits,
//     RLIMIT_NPROC, RLIMIT_NOFILE, no core dumps; runSupervisor,
//     PR_SET_CHILD_SUBREAPER, so that orphans of a managed process's tree
//     come back to its supervisor; for a pty process, the terminal
//     (terminal.go: opened on the lease's devpts, the slave the command's
//     controlling terminal, the master sent to the server).
//
// The limits of a shape (cgroups, the disk) are the server's business:
// the init is put in its lease's cgroup before it forks anything
// (package machine).
//
// # The protocol
//
// protocol.go holds everything the server and its inits say to each
// other, in one place: the Config and Requests on a lease init's control
// socket (SOCK_SEQPACKET, one message per request, the stdio and status
// pipes of a new command attached as SCM_RIGHTS) and its Reply; the
// SupervisorConfig; the Status lines on a command's status pipe (started,
// exited, or why it could not start — a line longer than MaxStatusLine
// or one that does not parse is a protocol failure, never an exit
// status); the names of the lease directory; the timeouts.
//
// # Why a program of its own
//
// Every lease and every managed process starts the init program, and pays
// for everything that runs before the hook: the Go runtime, and the
// package inits that Go runs first — in dependency order, and by import
// path among the packages that are ready, so in a large binary many that
// this package does not import (crypto/..., cloud.google.com/...,
// github.com/aws/... in the devserver, which links the Temporal server).
// Measured on 2 cores: a supervisor of `true` costs 43 ms of CPU as a
// re-execution of the 220 MB bench binary, 16 ms as sandboxflow-init
// (4 MB). Hence a program that links only this package, which itself
// imports only the standard library's early packages, golang.org/x/sys/unix,
// and confine and proctree. Check with
//
//	GODEBUG=inittrace=1 bash -c 'exec -a sandboxflow-init bin/sandboxflow-init /x' 3</dev/null 4>/dev/null
//
// which lists every package init that ran before the hook.
package leaseinit
