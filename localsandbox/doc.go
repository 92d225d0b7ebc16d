// Package localsandbox is a local sandbox server that speaks the CreateOS
// sandbox HTTP API (see PROTOCOL.md), in the official shapes: the vendor's
// SDKs run against it unchanged (officialsdk_test.go). It is the server
// behind `make run`, and the real server that integration and fault tests
// run against. cmd/sandboxd runs it as a program; tests and other programs
// embed it:
//
//	srv, err := localsandbox.New(localsandbox.Options{InsecureNoAuth: true, Root: dir})
//	ln, err := net.Listen("tcp", "127.0.0.1:0")
//	go srv.Serve(ln)
//	defer srv.Shutdown(ctx)
//
// # A lease is a small machine
//
// Where the kernel allows it, creating a sandbox starts its lease init: pid
// 1 of the lease's own user, mount, PID, UTS, IPC and network namespaces for
// the life of the sandbox. Every exec and managed process is forked by it,
// so processes of one lease see each other, share 127.0.0.1, and a
// background process outlives the exec that started it. The root file
// system is writable and the lease's own: overlays of the host's system
// directories (or of a rootfs) with a per-lease upper layer, where the
// lease's root (an unprivileged uid on the host) owns what it sees. Where
// sandboxd is root, the kernel enforces the shape per lease — memory, tasks
// and CPU through cgroups (v1 or v2), the disk as a file system of its own —
// pause freezes the lease's cgroup, and a paused lease can be forked. What
// is not enforced is said in the log and in each sandbox's view. Where
// namespaces are unavailable, the server falls back to process groups and
// says so. See the README for what neither mode protects against.
//
// The lease machine lives in internal/machine (the server's side of a
// lease init, the root file system's layout, cgroups and the freezer, the
// lease's disk, host ids) and internal/leaseinit (what runs inside a
// lease: the init, the supervisor of a managed process); the output
// journal in internal/journal. The API is http.go (envelopes,
// authentication) and the api_*.go files.
//
// # The init hook
//
// Lease inits and supervisors are re-executions of the server's own binary
// with a marker argv[0] ("sandboxflow-init"): the init function of package
// internal/leaseinit, which this package links, turns such a process into
// what it is meant to be before main runs, and before the package inits of
// everything leaseinit does not import. Programs and test binaries that
// link the package therefore need nothing special; the hook does nothing
// in any process not started that way.
//
// # Test hooks
//
// Server.Stats counts live leases and the processes of their trees from the
// host's process table; Server.History records every process that ran, also
// after its lease is gone; SandboxProcesses lists every process of a given
// root that is still alive anywhere on the machine.
package localsandbox
