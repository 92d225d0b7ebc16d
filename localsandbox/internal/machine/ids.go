package machine

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
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

// Chown gives path to o, when the server is root (else the server's ids
// are the lease's).
func (o Owner) Chown(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(path, o.UID, o.GID)
}

// shiftOwners moves every file below dirs whose owner (or group) lies in
// from's id range to the same id of to's range: a fork's copy of its
// source's files, made with the source's ids. The mode is set again after
// chown, which clears set-user-id and set-group-id bits.
func shiftOwners(dirs []string, from, to Owner) error {
	if from == to {
		return nil
	}
	shift := func(id, fromBase, toBase int) int {
		if id >= fromBase && id < fromBase+IDsPerLease {
			return toBase + id - fromBase
		}
		return id
	}
	for _, dir := range dirs {
		err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			st := fi.Sys().(*syscall.Stat_t)
			uid, gid := shift(int(st.Uid), from.UID, to.UID), shift(int(st.Gid), from.GID, to.GID)
			if uid == int(st.Uid) && gid == int(st.Gid) {
				return nil
			}
			if err := os.Lchown(path, uid, gid); err != nil {
				return err
			}
			if fi.Mode()&os.ModeSymlink == 0 && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
				return os.Chmod(path, fi.Mode())
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
