package localsandbox

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// defaultMaxConnections is DefaultMaxConnections, or a quarter of the
// server's descriptor limit when that is lower: the rest stays for the
// leases (every process holds pipes, a pidfd and its init's descriptors).
// Go raises the soft RLIMIT_NOFILE to the hard one when a program starts,
// so this is the hard limit in practice.
func defaultMaxConnections() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur/4 >= DefaultMaxConnections {
		return DefaultMaxConnections
	}
	return max(16, int(lim.Cur/4))
}

// closeInheritedOnExec marks every descriptor from 3 up close-on-exec, so
// that none the server inherited reaches a command: started as
// `exec 9</; sandboxd`, the server would otherwise hand the host's root
// to every init and command as descriptor 9. Go opens its own descriptors
// close-on-exec and passes a child what it should have explicitly
// (ExtraFiles), so nothing the server means to pass is lost.
func closeInheritedOnExec() error {
	if unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC) == nil {
		return nil
	}
	// Before Linux 5.11: one by one.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("localsandbox: marking inherited descriptors close-on-exec: %w", err)
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC); err != nil {
				return fmt.Errorf("localsandbox: marking descriptor %d close-on-exec: %w", fd, err)
			}
		}
	}
	return nil
}
