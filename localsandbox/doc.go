// Package localsandbox is a local sandbox server that speaks the CreateOS
// sandbox HTTP API (docs/PROTOCOL.md), in the official shapes: the vendor's
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
// system is writable and the lease's own: an overlay of a read-only image
// (by default Debian of the host's release, built once from Debian's
// packages; images.go) with a per-lease upper layer, where the lease's root
// (an unprivileged uid on the host) owns what it sees. A lease never sees
// the host's files, unless the operator offers the host image, and then
// nothing that is not world-readable on the host. Where
// sandboxd is root, the kernel enforces the shape per lease — memory, tasks
// and CPU through cgroups (v1 or v2), the disk as a file system of its own —
// pause freezes the lease's cgroup, and a paused lease can be forked. What
// is not enforced is said in the log and in each sandbox's view. Where
// namespaces are unavailable, the server falls back to process groups and
// says so. What neither mode protects against: docs/THREAT-MODEL.md.
//
// # Where things are
//
// This package is the server: the HTTP API (routes.go for the one table
// of routes served and declined, http.go for envelopes and
// authentication, listener.go for the connection caps, the api_*.go files,
// files.go, ingress.go for preview requests), the lease registry and a
// lease's states (server.go, lease.go, autopause.go, fork.go), managed
// processes and the pump of their output (process.go), the leases'
// network settings and views (network.go), and the sweep of what a
// crashed server left (sweep.go). The rest lives in rooms of its own, each
// with a package doc that says where each mechanism is applied. Imports run
// one way, down the list: the server imports the rooms; machine and network
// import leaseinit, which imports confine and proctree.
//
//	internal/network    a lease's network namespace, slirp4netns, the egress table, its resolver, the preview proxy
//	internal/machine    the server's side of a lease machine: its init in its namespaces, the root's
//	                    layout, host id ranges, cgroups and the freezer, the disk, a fork's copy
//	internal/journal    a process's output journal
//	internal/leaseinit  what runs inside a lease: the init hook, the lease init, the supervisor,
//	                    the mounts of its root, the protocol with the server; and the spawner,
//	                    which clones the lease inits for the server
//	internal/confine    capabilities, no_new_privs, the seccomp filter
//	internal/proctree   process trees of /proc: freeze, signal, find by mark
//	internal/hostfs     the server's every file operation below a lease directory: by descriptor, never through a symlink
//	internal/image      the leases' default image, built from Debian's packages by mmdebstrap, cached by recipe
//	internal/template   the Dockerfile subset of a template, read into the steps of its build (templates.go builds)
//
// Where is
//
//   - the memory limit applied (and the tasks limit, the CPU quota):
//     internal/machine/cgroups.go, Limiter.Create; the init joins the group
//     before it forks anything in machine.Start
//     (internal/machine/machine.go);
//   - the disk limit: internal/machine/disk.go, NewDisk;
//   - a pause: internal/machine/freezer.go (without a freezer,
//     proctree.Freeze from lease.go);
//   - the egress rule enforced: internal/network/egress.go, applyEgress,
//     an nftables table in the lease's network namespace; its names
//     answered: internal/network/dns.go, decideDNS;
//   - the output journal evicted: internal/journal/journal.go,
//     Journal.Append;
//   - the root file system mounted: internal/leaseinit/rootfs.go,
//     buildRoot (its layers chosen in internal/machine/rootfs.go);
//   - the seccomp filter applied: internal/leaseinit/leaseinit.go,
//     confineChild, through internal/confine.
//
// # The init program
//
// Lease inits and supervisors run the init program with a marker argv[0]
// ("sandboxflow-init"): the init function of package internal/leaseinit
// turns such a process into what it is meant to be before main runs. The
// program is cmd/sandboxflow-init, a small binary of that package alone,
// found beside the server's binary or named by Options.InitProgram or
// $SANDBOXD_INIT_PROGRAM (init_program.go opens it, and refuses one that
// speaks another protocol); without it the server re-executes its own
// binary, which links the hook too, so programs and test binaries that
// link this package need nothing special — they only start each command
// more slowly. The hook does nothing in any process not started that way.
//
// # Test hooks
//
// Server.Stats counts live leases and the processes of their trees from the
// host's process table; Server.History records every process that ran, also
// after its lease is gone; SandboxProcesses lists every process of a given
// root that is still alive anywhere on the machine.
package localsandbox
