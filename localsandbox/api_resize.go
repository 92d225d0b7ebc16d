package localsandbox

import (
	"errors"
	"net/http"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
)

// Disk resize (docs/CREATEOS-API.md §3.3).
//
//	POST /v1/sandboxes/{id}/resize {"disk_mib": 8192} → {"id": …, "disk_mib": 8192}
//
// disk_mib is the new total and must be larger than the sandbox's disk
// (400: a disk never shrinks). The disk grows online, the sandbox running
// or paused (a paused sandbox's processes are frozen, its file system is
// not); any other state is 409, an unknown or destroyed sandbox 404. The
// growth is held in the disk budget and checked against the host's room as
// a create's disk is (503 when either says no, nothing changed). A server
// that does not bound disks, or cannot grow a mounted one
// (machine.ResizeSupport), answers 400 UNSUPPORTED naming why.

type resizeRequest struct {
	DiskMiB int `json:"disk_mib"`
}

type resizeView struct {
	ID      string `json:"id"`
	DiskMiB int64  `json:"disk_mib"`
}

func (s *Server) resizeSandbox(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req resizeRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.DiskMiB > maxDiskMiB {
		return badRequest("disk_mib must be at most %d", maxDiskMiB)
	}
	size := int64(req.DiskMiB) * mib
	if current := l.diskBytes(); size <= current {
		return badRequest("disk_mib must be larger than the sandbox's disk, %d MiB: a disk never shrinks", current/mib)
	}
	switch {
	case s.diskErr != nil:
		return unsupported("disk resize", "this server does not bound disks: "+s.diskErr.Error())
	case l.disk == nil:
		return unsupported("disk resize", "this sandbox has no disk of its own")
	case s.resizeErr != nil:
		return unsupported("disk resize", s.resizeErr.Error())
	}
	l.mu.Lock()
	state, forks := l.state, l.forks
	l.mu.Unlock()
	if state != stateRunning && state != statePaused || forks > 0 {
		if forks > 0 {
			state = stateBeingForked
		}
		return conflict("only a running or paused sandbox's disk can grow; the sandbox is " + state)
	}
	if err := s.checkDiskRoom(); err != nil {
		return noCapacity(err)
	}
	if err := l.disk.Grow(size); errors.Is(err, machine.ErrNotLarger) {
		return badRequest("disk_mib must be larger than the sandbox's disk: %v", err)
	} else if err != nil {
		if l.status() == stateDestroyed {
			return notFound("sandbox")
		}
		return noCapacity(err)
	}
	l.mu.Lock()
	l.diskMax = l.disk.Size()
	l.mu.Unlock()
	return writeData(w, resizeView{ID: l.id, DiskMiB: l.diskBytes() / mib})
}

// diskBytes is the lease's disk_mib in bytes.
func (l *lease) diskBytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.diskMax
}
