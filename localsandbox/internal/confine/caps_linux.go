package confine

import (
	"errors"

	"golang.org/x/sys/unix"
)

// capability is one Linux capability, by number and by the name Docker's
// profile uses.
type capability struct {
	num  uintptr
	name string
}

// keptCapabilities is Docker's default capability set: what a root-inside
// machine needs for package tools (dpkg chowns and setuids, apt drops to
// the _apt user, ping opens a raw socket, servers bind low ports). Every
// other capability is dropped.
var keptCapabilities = []capability{
	{unix.CAP_CHOWN, "CAP_CHOWN"},
	{unix.CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"},
	{unix.CAP_FSETID, "CAP_FSETID"},
	{unix.CAP_FOWNER, "CAP_FOWNER"},
	{unix.CAP_MKNOD, "CAP_MKNOD"},
	{unix.CAP_NET_RAW, "CAP_NET_RAW"},
	{unix.CAP_SETGID, "CAP_SETGID"},
	{unix.CAP_SETUID, "CAP_SETUID"},
	{unix.CAP_SETFCAP, "CAP_SETFCAP"},
	{unix.CAP_SETPCAP, "CAP_SETPCAP"},
	{unix.CAP_NET_BIND_SERVICE, "CAP_NET_BIND_SERVICE"},
	{unix.CAP_SYS_CHROOT, "CAP_SYS_CHROOT"},
	{unix.CAP_KILL, "CAP_KILL"},
	{unix.CAP_AUDIT_WRITE, "CAP_AUDIT_WRITE"},
}

// keptMask is keptCapabilities as a 64-bit capability mask.
func keptMask() uint64 {
	var m uint64
	for _, c := range keptCapabilities {
		m |= 1 << c.num
	}
	return m
}

// dropCapabilities confines the calling thread's capabilities to
// keptCapabilities: it drops the rest from the bounding set (so that no
// execve, not even of a setuid-root or file-capability binary, can bring
// them back), clears the ambient set, clears the inheritable set (for root,
// execve adds inheritable capabilities to the new permitted set, bounding
// set or not: CVE-2022-24769), and masks the permitted and effective sets.
// Capabilities are per thread: the caller must stay on this thread until it
// executes.
func dropCapabilities() error {
	keep := keptMask()
	for c := uintptr(0); ; c++ {
		// PR_CAPBSET_READ fails with EINVAL past the kernel's last capability.
		if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, c, 0, 0, 0); errors.Is(err, unix.EINVAL) {
			break
		} else if err != nil {
			return err
		}
		if keep&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return err
		}
	}
	// EINVAL: a kernel without ambient capabilities (< 4.3) has none to clear.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	for i := range data {
		k := uint32(keep >> (32 * i))
		data[i].Effective &= k
		data[i].Permitted &= k
		data[i].Inheritable = 0
	}
	return unix.Capset(&hdr, &data[0])
}
