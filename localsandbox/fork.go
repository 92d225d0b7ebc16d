package localsandbox

import (
	"context"
	"net/http"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
)

// Fork.
//
//	POST /v1/sandboxes/{id}/fork   {"start_paused"?, "egress"?, "envs"?, "ingress_enabled"?, "labels"? [ext]}
//	→ the new sandbox's view: {"id": "sb-…", "status": "forking", "forked_from": "sb-…", …}
//
// (the source must be paused) makes a new sandbox whose file system starts
// as a copy of the source's: its root's upper layer (everything the source
// wrote over its lower layer), /workspace and /tmp, with their owners,
// modes, extended attributes and the overlay's whiteouts. The new sandbox
// has the source's shape, rootfs, disk size and auto-pause, and the
// source's egress, ingress, envs and SSH keys unless the request sets
// them; the labels of the request (none by default: the source's labels
// name the source); a name of its own. It is "forking" while the copy
// runs, then "running" ("error" if it failed); with start_paused the
// request is answered once the copy is done, "paused" (or "error").
// Processes are not carried over: the fork boots a fresh lease init over
// the copied files, as a machine booted from a disk snapshot would, and
// its view says so ([ext] "processes_carried": false). The source stays
// paused, and cannot be resumed until the copy is done.

// forkRequest is the body of POST /fork (docs/CREATEOS-API.md §3.3); an omitted
// field inherits the source's.
type forkRequest struct {
	StartPaused    bool              `json:"start_paused,omitempty"`
	Egress         *[]string         `json:"egress,omitempty"`
	Envs           map[string]string `json:"envs,omitempty"`
	IngressEnabled *bool             `json:"ingress_enabled,omitempty"`
	SSHPubkeys     []string          `json:"ssh_pubkeys,omitempty"`
	// BandwidthQuotaBytes is tolerated and ignored: nothing is metered.
	BandwidthQuotaBytes *int64            `json:"bandwidth_quota_bytes,omitempty"`
	Labels              map[string]string `json:"labels,omitempty"` // [ext]
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	src, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req forkRequest
	if err := s.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	spec, err := s.forkSpec(src, &req)
	if err != nil {
		return err
	}
	if src.isolation != IsolationNamespaces {
		return conflict("forking needs namespace isolation")
	}
	if err := src.beginFork(); err != nil {
		return err
	}
	l, err := s.reserveFork(spec)
	if err != nil {
		src.endFork()
		return err
	}
	l.setAutoPause(src.autoPause())
	s.log.Info("sandbox forking", "sandbox", l.id, "from", src.id)
	forked := make(chan struct{})
	s.workers.Go(func() {
		defer close(forked)
		began := time.Now()
		err := machine.CopyFiles(src.dir, l.dir, src.owner(), l.owner())
		src.endFork()
		if err == nil {
			err = s.startLease(l)
		}
		next := stateRunning
		switch {
		case err != nil:
			s.log.Warn("forking a sandbox failed", "sandbox", l.id, "from", src.id, "err", err)
			next = stateError
		case req.StartPaused:
			next = statePausing
		}
		l.mu.Lock()
		l.spawnTime = time.Since(began)
		l.mu.Unlock()
		l.setState(next)
		l.spawning.Done()
		if next == statePausing && l.status() == statePausing {
			l.pause()
		}
	})
	if req.StartPaused {
		// A fork asked to start paused is answered paused (or error),
		// as the service's transitions show it: never "forking", then
		// a state the client must poll for.
		<-forked
	}
	return writeData(w, s.view(l, false))
}

// forkSpec checks a fork's request and returns what to create: the
// source's, but for what the request sets.
func (s *Server) forkSpec(src *lease, req *forkRequest) (leaseSpec, error) {
	labels, err := checkLabels(req.Labels)
	if err != nil {
		return leaseSpec{}, err
	}
	src.mu.Lock()
	keys, disk := src.sshPubkeys, src.diskMax
	src.mu.Unlock()
	spec := leaseSpec{shape: src.shape, labels: labels, rootfs: src.rootfs, disk: disk, envs: src.envs, sshPubkeys: keys, net: src.netSpec, forkedFrom: src.id, defaults: src.defaults}
	if req.SSHPubkeys != nil {
		if spec.sshPubkeys, err = mergeSSHPubkeys(nil, req.SSHPubkeys); err != nil {
			return leaseSpec{}, err
		}
	}
	if n := src.network(); n != nil {
		egress, ingress, _ := n.State()
		spec.net = netSpec{egress: egress, ingress: ingress}
	}
	if req.Envs != nil {
		if err := checkEnv("envs", req.Envs); err != nil {
			return leaseSpec{}, err
		}
		spec.envs = req.Envs
	}
	if req.Egress != nil || req.IngressEnabled != nil {
		egress := spec.net.egress.List()
		if req.Egress != nil {
			egress = *req.Egress
		}
		ingress := spec.net.ingress
		if req.IngressEnabled != nil {
			ingress = *req.IngressEnabled
		}
		if spec.net, err = s.netSpec(context.Background(), egress, ingress); err != nil {
			return leaseSpec{}, err
		}
	}
	return spec, nil
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
	name, err := s.reserveName("")
	if err != nil {
		return nil, err
	}
	spec.name = name
	l, err := s.register(func() (*lease, error) {
		l, err := s.newLeaseDirs(newID("sb-"), spec, stateForking)
		if err == nil {
			l.spawning.Add(1) // before the lease is registered
		}
		return l, err
	}, (*lease).removeDirs)
	if err != nil {
		s.releaseName(name)
	}
	return l, err
}
