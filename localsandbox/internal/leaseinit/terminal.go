package leaseinit

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openTerminal opens a new pseudo-terminal of the given size: its master
// and, through the master (TIOCGPTPEER, no path looked up), its slave.
// The supervisor calls it inside the lease, where /dev/ptmx is the
// lease's own devpts instance (rootfs.go, setupDev): the terminal is
// the lease's, numbered among its own, invisible to the host's /dev/pts.
func openTerminal(size *WinSize) (master, slave int, err error) {
	master, err = unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("opening /dev/ptmx: %w", err)
	}
	fail := func(what string, err error) (int, int, error) {
		unix.Close(master)
		return -1, -1, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlocking the terminal", err)
	}
	if err := unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols}); err != nil {
		return fail("setting the terminal's size", err)
	}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return fail("opening the terminal's slave", errno)
	}
	return master, int(fd), nil
}

// sendTerminal writes the Started line on the status channel with the
// terminal's master attached, for the server to read output from, write
// input to and resize.
func sendTerminal(status *os.File, m Status, master int) error {
	return unix.Sendmsg(int(status.Fd()), m.Encode(), unix.UnixRights(master), nil, 0)
}
