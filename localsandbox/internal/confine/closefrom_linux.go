package confine

import (
	"errors"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseFrom makes sure no descriptor numbered lowfd or above survives the
// next execve: it marks them all close-on-exec with
// close_range(lowfd, ~0, CLOSE_RANGE_CLOEXEC), or, on a kernel without it
// (before 5.11) or where a seccomp filter refuses it, by setting FD_CLOEXEC
// on each descriptor listed in /proc/self/fd.
//
// It marks rather than closes because the caller is a Go program: the
// runtime keeps descriptors of its own (the netpoller's epoll instance and
// its wake-up eventfd) and aborts if they vanish under it. Marked
// descriptors close in the execve, which is the moment that matters: the
// confined program never sees them. Call it right before the exec (or the
// ForkExec whose child should not inherit them), after the descriptors the
// child must keep have been put below lowfd.
func CloseFrom(lowfd int) error {
	if lowfd < 0 {
		return &Error{Step: StepCloseFrom, Err: unix.EBADF}
	}
	err := unix.CloseRange(uint(lowfd), math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EINVAL) {
		return &Error{Step: StepCloseFrom, Err: err}
	}
	if err := markFromProc(lowfd); err != nil {
		return &Error{Step: StepCloseFrom, Err: err}
	}
	return nil
}

// markFromProc is CloseFrom's fallback: FD_CLOEXEC on each descriptor >=
// lowfd that /proc/self/fd lists (the directory's own descriptor is
// close-on-exec already).
func markFromProc(lowfd int) error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd < lowfd {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return err
		}
	}
	return nil
}
