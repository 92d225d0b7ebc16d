// Package hostfs is the one way the server touches a file of a tree a
// lease can write: its root's upper layer, its workspace and tmp, a fork's
// copy of them. The server runs as root on the host; a path it resolves
// there by name would follow whatever symlink the lease planted (/var ->
// /etc, /etc/resolv.conf -> /etc/shadow) and write host files as root
// (issue 26, item 1). So, as runc's libcontainer, gVisor and bubblewrap do
// for untrusted trees, every operation here starts from a directory
// descriptor the server opened on a path no lease can change (the lease
// directory, below the server's root) and resolves the rest with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|
// RESOLVE_NO_XDEV): no symlink, "..", magic link or mount crossing is
// followed, and a path that would need one fails with ELOOP, EXDEV or
// ENOTDIR instead. Only the final component is acted on, through its
// parent's descriptor: mkdirat, fchownat(AT_SYMLINK_NOFOLLOW), a chmod of
// the inode opened O_PATH|O_NOFOLLOW, a write to a new temporary file
// renamed over the name (which replaces a planted symlink rather than
// writing through it).
//
// Lookups a lease asks for (the files API) instead resolve in the lease's
// own root (RESOLVE_IN_ROOT): its symlinks are followed as the lease would
// follow them, and "/" and ".." stop at its root.
//
// Callers outside this package must not name a path below a lease
// directory to the os package (the hostfs_rule_test in package
// localsandbox keeps that rule; its allowlist names the host-owned paths).
package hostfs
