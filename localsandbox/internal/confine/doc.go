// Package confine takes away, for good, what a sandboxed command must not
// have, in the process that is about to exec it.
//
//	// In the init's child, after the mount setup, on one goroutine:
//	if err := confine.CloseFrom(3); err != nil { ... }      // nothing the init holds leaks in
//	if err := confine.Apply(confine.Policy{}); err != nil { // irreversible
//		os.Exit(127) // partly confined: never run the command now
//	}
//	err := syscall.Exec(path, argv, env) // same goroutine: Apply locked its OS thread
//
// Apply does three things, all inherited across fork and execve and none
// reversible:
//
//   - Capabilities. The bounding set keeps Docker's default set and nothing
//     else: CHOWN, DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW, SETGID,
//     SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL,
//     AUDIT_WRITE. That is what a root-inside machine needs for package
//     tools (dpkg chowns and setuids, apt drops to _apt, ping opens raw
//     sockets, servers bind low ports). SYS_ADMIN, SYS_PTRACE, SYS_MODULE,
//     NET_ADMIN, SYS_RAWIO, SYS_TIME, BPF, PERFMON and the rest are dropped,
//     so no execve (of a setuid or file-capability binary either) can bring
//     them back. The ambient and inheritable sets are emptied (for root,
//     execve adds inheritable capabilities whatever the bounding set), and
//     the permitted and effective sets are masked the same way. The
//     capabilities are those of the user namespace the process is in: root
//     inside a lease's namespaces holds them over the lease only.
//
//   - no_new_privs, so that execve never grants privileges (setuid bits and
//     file capabilities are ignored) and the filter can be installed
//     without CAP_SYS_ADMIN.
//
//   - A seccomp filter: Docker's default profile, taken as data from
//     github.com/moby/profiles/seccomp and resolved for the kept
//     capabilities, assembled by github.com/elastic/go-seccomp-bpf (no
//     hand-written BPF). It is an allow-list: a syscall it does not name
//     fails with EPERM, so programs fail cleanly rather than being killed,
//     and syscalls newer than the profile are refused until the profile
//     names them. Refused, among others: the whole mount family (mount,
//     umount2, pivot_root, move_mount, open_tree, fsopen, fsmount, fsconfig,
//     fspick, mount_setattr), unshare and setns, clone with any namespace
//     flag, pidfd_getfd, bpf, perf_event_open, userfaultfd, io_uring, keyctl, add_key,
//     request_key, kexec_load, kexec_file_load, init_module, finit_module,
//     delete_module, open_by_handle_at, reboot, swapon, swapoff, acct,
//     quotactl, lookup_dcookie, syslog, iopl, ioperm, settimeofday,
//     clock_settime, vhangup, nfsservctl, kcmp, fanotify_init, socket of
//     AF_VSOCK (not namespaced: it reaches the host), and personality other
//     than Docker's few values. clone3 fails with ENOSYS instead, because its
//     flags sit in memory where seccomp cannot read them; glibc then falls
//     back to clone, whose flags it can. On amd64 the i386 (int 0x80) and
//     x32 ABIs are refused whole, so the filter cannot be sidestepped
//     through another syscall table.
//
//     Stricter than Docker: ptrace, process_vm_readv and process_vm_writev
//     (in a pid namespace the obvious target is the init, which holds the
//     server's descriptors; debuggers do not work in a lease), modify_ldt,
//     name_to_handle_at, adjtimex and clock_adjtime, and
//     ioctl(TIOCSTI) and ioctl(TIOCLINUX) (typing into a terminal someone
//     else reads; the request is matched on its low 32 bits, as the kernel
//     reads it, so junk in the upper half does not slip past).
//
// What still works, and is tested here: fork and exec, threads (Go's and
// glibc's), chown and setuid/setgid inside the namespace, sockets of the
// ordinary families (loopback TCP included), gcc, sh and coreutils.
//
// # Calling it correctly from Go
//
// Capabilities belong to a thread, and execve runs with the calling
// thread's: Apply locks the calling goroutine to its OS thread and never
// unlocks it, and the exec (syscall.Exec) or fork (syscall.ForkExec) must
// come from that same goroutine. The seccomp filter and no_new_privs are
// put on every thread of the process (SECCOMP_FILTER_FLAG_TSYNC), so the Go
// runtime's other threads are filtered too; they keep their capabilities,
// but run no untrusted code and end at the execve. Two ways to wire it:
//
//   - In a child of the init that is itself Go (a re-executed stage of the
//     init binary): Apply, then syscall.Exec. Only the command is confined.
//   - In the init itself, once its own setup is done: Apply, then
//     syscall.ForkExec of the command from the same goroutine. The init is
//     then confined as well, which it can afford: what it does afterwards
//     (wait4, kill, read and write on its pipes) is all allowed. But it
//     must also make itself non-dumpable (prctl(PR_SET_DUMPABLE, 0)):
//     /proc/<pid>/mem is guarded by the kernel's ptrace access check, not by
//     seccomp, and that check lets a process of the same uid whose
//     capabilities are a superset of the target's open it. An unconfined
//     init is out of reach because it holds capabilities the command lacks
//     (tested); a confined one, holding the same, is not unless
//     non-dumpable.
//
// The code between Apply and the exec runs under the filter: it must not
// need anything refused (mount setup, setns, sethostname come before).
//
// CloseFrom marks every descriptor from a number up close-on-exec
// (close_range with CLOSE_RANGE_CLOEXEC, or /proc/self/fd where that is
// missing) rather than closing them: the Go runtime owns some descriptors
// (its netpoller's) and aborts if they vanish. They close in the execve.
//
// Policy.AllowNestedUserNS allows unshare, setns, and clone/clone3 with
// namespace flags, for programs that sandbox themselves (Chromium's
// sandbox, `unshare -r`); the mount family stays refused.
//
// The package is Linux only; elsewhere Apply and CloseFrom fail.
package confine
