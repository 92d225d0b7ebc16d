// Package proctree reads the host's process table as trees and acts on
// whole trees: the one way sandboxd follows the processes it started.
//
//	t, err := proctree.Read()             // a snapshot of /proc
//	n := t.Count(t.Children(initPID))     // the live processes of a lease but its init
//	proctree.Freeze(roots, time.Second)   // SIGSTOP every process of the trees, until none moves
//	proctree.Signal(roots, syscall.SIGKILL)
//
// A tree is followed through parent links (/proc/<pid>/stat), which no
// sandboxed process can leave: an orphan is adopted by its namespace's pid
// 1 (a lease init) or by its supervisor, a child subreaper, both inside the
// tree. That is why killing a tree freezes it first: a process stopped
// cannot fork, so a later scan finds every child forked meanwhile.
//
// Where each use is:
//
//   - Freeze and Signal: killing a managed process's tree (the lease init
//     does it in namespace mode, the server in process-group mode) and
//     pausing a lease without a cgroup freezer (SIGSTOP, then SIGCONT).
//   - Read and Tree: the supervisor forwarding a signal to its tree; the
//     server's Stats.
//   - Marked: finding what a server on a root started, by the marks its
//     processes carry (localsandbox.SandboxProcesses, the sweep at start).
//
// It depends on nothing but the standard library, so that the lease init,
// which uses it, starts fast.
package proctree
