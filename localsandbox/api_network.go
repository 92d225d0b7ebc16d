package localsandbox

import (
	"net/http"
	"time"
)

// The network endpoints: GET/PUT /v1/sandboxes/{id}/egress and the
// bandwidth routes (docs/CREATEOS-API.md §3.6), PATCH /v1/sandboxes/{id} for
// ingress_enabled (§3.2).

// egressView is the answer of the egress endpoints: the egress in force.
type egressView struct {
	ID     string   `json:"id"`
	Egress []string `json:"egress"`
}

func (s *Server) getEgress(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	egress, _, _ := s.networkView(l)
	return writeData(w, egressView{ID: l.id, Egress: egress})
}

// putEgressRequest replaces the rules; null, [] or omitted asks for all
// that the operator's policy allows.
type putEgressRequest struct {
	Egress []string `json:"egress"`
}

func (s *Server) putEgress(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req putEgressRequest
	if err := s.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if l.isolation != IsolationNamespaces {
		return badRequest("process-group isolation cannot restrict egress: commands use the host's network")
	}
	set, err := s.compileEgress(r.Context(), req.Egress)
	if err != nil {
		return err
	}
	if n := l.network(); n != nil {
		if err := n.SetEgress(set); err != nil {
			return err
		}
	}
	if l.status() == stateDestroyed {
		return notFound("sandbox")
	}
	egress, _, _ := s.networkView(l)
	s.log.Info("sandbox egress set", "sandbox", l.id, "rules", len(egress))
	return writeData(w, egressView{ID: l.id, Egress: egress})
}

// patchSandboxRequest is the body of PATCH /sandboxes/{id}.
type patchSandboxRequest struct {
	IngressEnabled        *bool `json:"ingress_enabled"`
	AutoPauseAfterSeconds *int  `json:"auto_pause_after_seconds"`
	DisableAutoPause      *bool `json:"disable_auto_pause"`
}

func (s *Server) patchSandbox(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req patchSandboxRequest
	if err := s.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	// Everything is checked before anything changes.
	disable := req.DisableAutoPause != nil && *req.DisableAutoPause
	var after time.Duration
	switch {
	case disable && req.AutoPauseAfterSeconds != nil:
		return badRequest("auto_pause_after_seconds and disable_auto_pause exclude each other")
	case req.AutoPauseAfterSeconds != nil:
		if after, err = s.autoPauseAfter(*req.AutoPauseAfterSeconds); err != nil {
			return err
		}
	}
	n := l.network()
	if req.IngressEnabled != nil && *req.IngressEnabled && n == nil {
		return badRequest("ingress needs namespace isolation and a server running as root")
	}
	if disable || after > 0 {
		l.setAutoPause(after)
	}
	if req.IngressEnabled != nil && n != nil {
		if err := s.setIngress(l, n, *req.IngressEnabled); err != nil {
			return err
		}
	}
	return writeData(w, s.view(l, false))
}

// bandwidthView is GET /sandboxes/{id}/bandwidth (docs/CREATEOS-API.md §3.6). The
// local server meters nothing: quota and remaining are -1 (unmetered);
// used_bytes and ingress_bytes are what crossed the lease's outward
// interface, out and in.
type bandwidthView struct {
	ID             string `json:"id"`
	QuotaBytes     int64  `json:"quota_bytes"`
	UsedBytes      int64  `json:"used_bytes"`
	IngressBytes   int64  `json:"ingress_bytes"`
	RemainingBytes int64  `json:"remaining_bytes"`
	Capped         bool   `json:"capped"`
}

func (s *Server) bandwidth(l *lease) bandwidthView {
	_, _, n := s.networkView(l)
	return bandwidthView{ID: l.id, QuotaBytes: -1, UsedBytes: n.BytesOut, IngressBytes: n.BytesIn, RemainingBytes: -1}
}

func (s *Server) getBandwidth(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	return writeData(w, s.bandwidth(l))
}

// rechargeRequest is the body of POST /sandboxes/{id}/bandwidth/recharge.
type rechargeRequest struct {
	AddBytes int64 `json:"add_bytes"`
}

// rechargeBandwidth is a no-op, as on an unmetered hosted sandbox.
func (s *Server) rechargeBandwidth(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req rechargeRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.AddBytes <= 0 {
		return badRequest("add_bytes must be positive")
	}
	return writeData(w, s.bandwidth(l))
}
