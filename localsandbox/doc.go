// Package localsandbox is a local sandbox server that speaks the CreateOS
// sandbox HTTP API (see PROTOCOL.md): the server behind `make run`, and the
// real server that integration and fault tests run against. cmd/sandboxd
// runs it as a program; tests and other programs embed it:
//
//	srv, err := localsandbox.New(localsandbox.Options{InsecureNoAuth: true, Root: dir})
//	ln, err := net.Listen("tcp", "127.0.0.1:0")
//	go srv.Serve(ln)
//	defer srv.Shutdown(ctx)
//
// # Isolation
//
// A lease is a workspace directory and a tmp directory on the host. Where the
// kernel allows it, every managed process (and every one-shot exec) runs in
// its own new user, PID, mount, UTS, IPC and network namespaces: root inside
// is an unprivileged uid outside, the root file system is a read-only view
// of the host's system directories plus the lease's /workspace and /tmp,
// /proc shows only the process's own tree, the hostname is the lease id,
// and the only network interface is a loopback of its own. Each managed
// process gets fresh namespaces, so processes of one lease share files but
// not pids or network. Where namespaces are unavailable, the server falls
// back to process groups and says so in the log and in each sandbox's
// isolation field. See the README for what neither mode protects against.
//
// # The init hook
//
// A managed process runs under an init: the server re-executes its own
// binary with a marker argv[0] ("sandboxflow-init"), and this package's
// init function turns that process into the supervisor of the command's
// tree before main runs. Programs and test binaries that link the package
// therefore need nothing special; the hook does nothing in any process not
// started that way.
//
// # Test hooks
//
// Server.Stats counts live leases and the processes of their trees from the
// host's process table; Server.History records every process that ran, also
// after its lease is gone; SandboxProcesses lists every process of a given
// root that is still alive anywhere on the machine.
package localsandbox
