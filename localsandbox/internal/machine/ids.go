package machine

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
)

// Host ids of the leases.
//
// A root server maps every lease's ids 0..65535 to a range of host ids of
// its own: slot n is HostIDBase + n×65536 … + 65535. Leases therefore share
// no uid or gid with each other, nor with the host's users (HostIDBase is
// far above the ids a distribution hands out): a process that got out of
// one lease would own nothing of another. A range is free again once the
// lease's files are gone; a fork's copy is moved into its own range.

// IDsPerLease is the size of a lease's id range: ids 0..65535.
const IDsPerLease = 1 << 16

// IDSlots hands out id ranges; the server makes twice as many as
// Options.MaxLeases, so that leases whose files could not be removed yet
// do not starve new ones.
type IDSlots struct {
	mu   sync.Mutex
	used []bool
}

// NewIDSlots returns n free slots.
func NewIDSlots(n int) *IDSlots { return &IDSlots{used: make([]bool, n)} }

// Take takes a free slot (a *CapacityError when there is none).
func (s *IDSlots) Take() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range s.used {
		if !u {
			s.used[i] = true
			return i, nil
		}
	}
	return -1, &CapacityError{"no free host id range for a sandbox"}
}

// Release frees slot i, once the lease's files are gone.
func (s *IDSlots) Release(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used[i] = false
}

// Owner is the host uid and gid of a lease's root.
type Owner struct{ UID, GID int }

// Host is o as package hostfs gives files away: nil when the server is
// not root (its leases' ids are then its own, and it could not).
func (o Owner) Host() *hostfs.Owner {
	if os.Geteuid() != 0 {
		return nil
	}
	return &hostfs.Owner{UID: o.UID, GID: o.GID}
}

// shiftOwners moves every file below dirs (relative to the lease
// directory dir) whose owner (or group) lies in from's id range to the
// same id of to's range: a fork's copy of its source's files, made with
// the source's ids. The mode is set again after chown, which clears
// set-user-id and set-group-id bits. The copy holds what the source's
// lease made, so the walk and every change go through package hostfs: a
// symlink is re-owned itself, never what it points to.
func shiftOwners(dir string, dirs []string, from, to Owner) error {
	if from == to {
		return nil
	}
	shift := func(id uint32, fromBase, toBase int) int {
		if int(id) >= fromBase && int(id) < fromBase+IDsPerLease {
			return toBase + int(id) - fromBase
		}
		return int(id)
	}
	lease, err := hostfs.Open(dir)
	if err != nil {
		return err
	}
	defer lease.Close()
	for _, name := range dirs {
		top, err := lease.OpenDir(name)
		if err != nil {
			return err
		}
		change := func(parent *hostfs.Dir, name string, st *unix.Stat_t) error {
			uid, gid := shift(st.Uid, from.UID, to.UID), shift(st.Gid, from.GID, to.GID)
			if uid == int(st.Uid) && gid == int(st.Gid) {
				return nil
			}
			if err := parent.Lchown(name, uid, gid); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
				return parent.Chmod(name, fileMode(st.Mode))
			}
			return nil
		}
		// The top directory itself, then what it holds.
		var st unix.Stat_t
		err = unix.Fstat(top.FD(), &st)
		if err == nil {
			err = change(lease, name, &st)
		}
		if err == nil {
			err = top.Walk(change)
		}
		top.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// fileMode is the permission and set-id bits of a stat mode.
func fileMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}
