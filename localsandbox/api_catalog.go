package localsandbox

import (
	"net/http"
)

// The unauthenticated routes (health and the catalog, docs/CREATEOS-API.md
// §3.1), whoami, and the pagination of lists (§1.7).

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	return writeData(w, map[string]bool{"up": true})
}

// readyz answers 200 {"ready": true}, or 503 with a fail envelope whose
// data says why not (the SDKs read both).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	select {
	case <-s.done:
		w.Header().Set("Retry-After", retryAfterSeconds)
		return writeJSON(w, http.StatusServiceUnavailable, "fail", map[string]any{"ready": false, "reason": "the server is shutting down"})
	default:
		return writeData(w, map[string]bool{"ready": true})
	}
}

// shapeView is a shape as GET /v1/shapes lists it.
type shapeView struct {
	ID             string `json:"id"`
	VCPU           int    `json:"vcpu"`
	MemMiB         int64  `json:"mem_mib"`
	DefaultDiskMiB int    `json:"default_disk_mib"`
	// CPUQuotaPct caps a shape of less than one vCPU, in percent of one
	// CPU (25 = 0.25 vCPU).
	CPUQuotaPct int `json:"cpu_quota_pct,omitempty"`
}

func (s *Server) getShapes(w http.ResponseWriter, r *http.Request) error {
	limit, offset, err := pageOf(r)
	if err != nil {
		return err
	}
	return writePage(w, shapes, limit, offset, func(sh shape) shapeView {
		v := shapeView{ID: sh.Name, VCPU: sh.vcpu(), MemMiB: sh.MemoryBytes / mib, DefaultDiskMiB: s.opts.DefaultDiskMiB}
		if sh.VCPUs < 1 {
			v.CPUQuotaPct = int(sh.VCPUs * 100)
		}
		return v
	})
}

// getRootfs answers GET /v1/rootfs (docs/CREATEOS-API.md §3.1): the
// images a create may name, the default first (images.go).
func (s *Server) getRootfs(w http.ResponseWriter, r *http.Request) error {
	names, def, entries := s.catalog()
	return writeData(w, map[string]any{"rootfs": names, "default": def, "entries": entries})
}

// whoami answers GET /v1/whoami: the one user of this server, and how many
// of its sandboxes are in which state (total: every live one).
func (s *Server) whoami(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	leases := make([]*lease, 0, len(s.leases))
	for _, l := range s.leases {
		leases = append(leases, l)
	}
	s.mu.Unlock()
	stats := map[string]int{"running": 0, "paused": 0, "other": 0, "total": 0}
	for _, l := range leases {
		switch l.status() {
		case stateDestroyed:
			continue
		case stateRunning:
			stats["running"]++
		case statePaused:
			stats["paused"]++
		default:
			stats["other"]++
		}
		stats["total"]++
	}
	return writeData(w, map[string]any{"user_id": "local", "stats": stats})
}

// Page sizes of the lists.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// pageOf reads limit and offset of a list request: limit is 50 when it is
// absent or 0, and at most 500 (larger ones are cut, as the service does).
func pageOf(r *http.Request) (limit, offset int, err error) {
	l, err := queryInt(r, "limit", defaultPageSize, maxInt)
	if err != nil {
		return 0, 0, err
	}
	o, err := queryInt(r, "offset", 0, maxInt)
	if err != nil {
		return 0, 0, err
	}
	if l == 0 {
		l = defaultPageSize
	}
	return int(min(l, maxPageSize)), int(o), nil
}

// maxInt bounds limit and offset.
const maxInt = 1<<31 - 1

// writePage answers the page of items at offset, at most limit of them,
// each shown by view: {"data":[…],"pagination":{total,limit,offset,count}}.
func writePage[T, V any](w http.ResponseWriter, items []T, limit, offset int, view func(T) V) error {
	page := []V{}
	if offset < len(items) {
		for _, item := range items[offset:min(len(items), offset+limit)] {
			page = append(page, view(item))
		}
	}
	return writeData(w, map[string]any{"data": page, "pagination": map[string]int{
		"total": len(items), "limit": limit, "offset": offset, "count": len(page)}})
}
