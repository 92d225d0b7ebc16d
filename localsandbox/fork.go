package localsandbox

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
)

// Fork.
//
//	POST /v1/sandboxes/{id}/fork   {"labels": {...}}?   (the source must be paused)
//	→ {"id": "sb-…", "status": "forking", "forked_from": "sb-…"}
//
// makes a new sandbox whose file system starts as a copy of the source's:
// its root's upper layer (everything the source wrote over its lower
// layer), /workspace and /tmp, with their owners, modes, extended
// attributes and the overlay's whiteouts. The new sandbox has the source's
// shape, rootfs and disk size, and the labels of the request (none by
// default: the source's labels name the source). It is "forking" while the
// copy runs, then "running" (or "error"). Processes are not carried over:
// the fork boots a fresh lease init over the copied files, as a machine
// booted from a disk snapshot would. The source stays paused, and cannot be
// resumed until the copy is done.

// forkRequest is the body of POST /fork.
type forkRequest struct {
	Labels map[string]string `json:"labels,omitempty"`
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	src, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req forkRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	check := createSandboxRequest{Labels: req.Labels, Shape: src.shape.Name}
	if _, err := s.validateRequest(&check); err != nil {
		return err
	}
	if src.isolation != IsolationNamespaces {
		return conflict("forking needs namespace isolation")
	}
	labels := req.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	if err := src.beginFork(); err != nil {
		return err
	}
	l, err := s.reserveFork(leaseSpec{shape: src.shape, labels: labels, rootfs: src.rootfs, disk: src.diskMax, net: src.netSpec})
	if err != nil {
		src.endFork()
		return err
	}
	s.log.Info("sandbox forking", "sandbox", l.id, "from", src.id)
	s.workers.Go(func() {
		defer l.spawning.Done()
		err := copyLeaseFiles(src, l)
		src.endFork()
		if err == nil {
			err = s.startLease(l)
		}
		if err != nil {
			s.log.Warn("forking a sandbox failed", "sandbox", l.id, "from", src.id, "err", err)
			l.setState(stateError)
			return
		}
		l.setState(stateRunning)
	})
	return writeData(w, map[string]any{"id": l.id, "status": stateForking, "forked_from": src.id})
}

// beginFork holds a paused lease for a fork's copy.
func (l *lease) beginFork() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != statePaused {
		return conflict("only a paused sandbox can be forked; the sandbox is " + l.state)
	}
	l.forks++
	l.spawning.Add(1) // a destroy of the source waits for the copy
	return nil
}

func (l *lease) endFork() {
	l.mu.Lock()
	l.forks--
	l.mu.Unlock()
	l.spawning.Done()
}

// reserveFork registers a new lease, forking, with its directories made;
// its spawning count is held until the fork has started (or failed), so a
// destroy waits for that.
func (s *Server) reserveFork(spec leaseSpec) (*lease, error) {
	return s.register(func() (*lease, error) {
		l, err := s.newLeaseDirs(newID("sb-"), spec, stateForking)
		if err == nil {
			l.spawning.Add(1) // before the lease is registered
		}
		return l, err
	}, (*lease).removeDirs)
}

// copyLeaseFiles copies the upper layer, workspace and tmp of src into the
// new lease dst, preserving owners, modes, timestamps, hard links, extended
// attributes (the overlay's user.overlay.* among them) and device nodes
// (the overlay's whiteouts), with GNU cp.
func copyLeaseFiles(src, dst *lease) error {
	var copies []string
	for _, dir := range []string{upperDir, "workspace", "tmp"} {
		from, to := filepath.Join(src.dir, dir), filepath.Join(dst.dir, dir)
		out, err := exec.Command("cp", "-a", "--preserve=all", "--no-target-directory", from, to).CombinedOutput()
		if err != nil {
			return fmt.Errorf("copying %s: %v: %.200s", dir, err, out)
		}
		copies = append(copies, to)
	}
	return shiftOwners(copies, src, dst) // into the fork's own id range
}
