package localsandbox

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// routes maps the protocol's endpoints (PROTOCOL.md §3–§5).
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	for pattern, h := range map[string]handlerFunc{
		"GET /v1/shapes":                                      s.getShapes,
		"POST /v1/sandboxes":                                  s.createSandbox,
		"GET /v1/sandboxes":                                   s.listSandboxes,
		"GET /v1/sandboxes/{id}":                              s.getSandbox,
		"DELETE /v1/sandboxes/{id}":                           s.deleteSandbox,
		"POST /v1/sandboxes/{id}/pause":                       s.pauseSandbox,
		"POST /v1/sandboxes/{id}/resume":                      s.resumeSandbox,
		"POST /v1/sandboxes/{id}/fork":                        s.forkSandbox,
		"PUT /v1/sandboxes/{id}/files":                        s.putFile,
		"GET /v1/sandboxes/{id}/files":                        s.getFile,
		"POST /v1/sandboxes/{id}/exec":                        s.exec,
		"POST /v1/sandboxes/{id}/processes":                   s.createProcess,
		"DELETE /v1/sandboxes/{id}/processes/{pid}":           s.deleteProcess,
		"POST /v1/sandboxes/{id}/processes/{pid}/stdin/close": s.closeStdin,
		"POST /v1/sandboxes/{id}/processes/{pid}/input":       s.input,
		"POST /v1/sandboxes/{id}/processes/{pid}/signal":      s.signal,
		"GET /v1/sandboxes/{id}/processes/{pid}/connect":      s.connect,
		"GET /v1/sandboxes/{id}/processes/{pid}/wait":         s.wait,
		"PATCH /v1/sandboxes/{id}":                            s.patchSandbox,
		"GET /v1/sandboxes/{id}/egress":                       s.getEgress,
		"PUT /v1/sandboxes/{id}/egress":                       s.putEgress,
		"GET /v1/sandboxes/{id}/bandwidth":                    s.getBandwidth,
		"POST /v1/sandboxes/{id}/bandwidth/recharge":          s.rechargeBandwidth,
	} {
		mux.Handle(pattern, s.endpoint(h))
	}
	mux.Handle("/", s.endpoint(func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{http.StatusNotFound, "no such endpoint"}
	}))
	return s.withRecover(s.withIngress(s.withAuth(s.withOpen(mux))))
}

func (s *Server) getShapes(w http.ResponseWriter, r *http.Request) error {
	return writeData(w, map[string]any{"shapes": shapes})
}

// sandboxView is a lease as the API shows it.
type sandboxView struct {
	ID        string            `json:"id"`
	Status    string            `json:"status"`
	Labels    map[string]string `json:"labels"`
	Workspace string            `json:"workspace,omitempty"`
	// The rest only in create and GET.
	Isolation Isolation   `json:"isolation,omitempty"`
	Shape     string      `json:"shape,omitempty"`
	Rootfs    string      `json:"rootfs,omitempty"`
	AutoPause int         `json:"auto_pause_after_seconds,omitempty"`
	CreatedAt time.Time   `json:"created_at,omitzero"`
	Limits    *limitsView `json:"limits,omitempty"`
	// The egress in force (["*"] all, [] none), ingress, and [ext] network.
	Egress             *[]string    `json:"egress,omitempty"`
	IngressEnabled     bool         `json:"ingress_enabled"`
	IngressURLTemplate string       `json:"ingress_url_template,omitempty"`
	Network            *networkView `json:"network,omitempty"`
}

// limitsView says which limits apply to a lease's processes, which of them
// the kernel enforces, and what the kernel counted against them.
type limitsView struct {
	MaxProcesses      int          `json:"max_processes"`
	ProcessesEnforced bool         `json:"processes_enforced"`
	MaxOpenFiles      int          `json:"max_open_files"`
	MemoryBytes       int64        `json:"memory_bytes"`
	MemoryEnforced    bool         `json:"memory_enforced"`
	VCPUs             float64      `json:"vcpus"`
	CPUEnforced       bool         `json:"cpu_enforced"`
	PauseFreezes      bool         `json:"pause_freezes"` // by the cgroup freezer, not SIGSTOP
	DiskBytes         int64        `json:"disk_bytes"`
	DiskEnforced      bool         `json:"disk_enforced"`
	Cgroup            string       `json:"cgroup,omitempty"`
	Usage             *cgroupStats `json:"usage,omitempty"`
}

func (s *Server) view(l *lease) sandboxView {
	v := sandboxView{
		ID:        l.id,
		Status:    l.status(),
		Labels:    l.labels,
		Workspace: l.workspace,
		Isolation: l.isolation,
		Shape:     l.shape.Name,
		Rootfs:    l.rootfs,
		AutoPause: int(l.autoPause / l.server.opts.autoPauseUnit),
		CreatedAt: l.created.UTC(),
		Limits:    s.limitsView(l),
	}
	s.addNetworkView(l, &v)
	return v
}

// limitsView reports, honestly, what is enforced for l.
func (s *Server) limitsView(l *lease) *limitsView {
	v := &limitsView{
		MaxProcesses: s.opts.MaxProcesses,
		MaxOpenFiles: s.opts.MaxOpenFiles,
		MemoryBytes:  l.shape.MemoryBytes,
		VCPUs:        l.shape.VCPUs,
		DiskBytes:    l.diskMax,
		DiskEnforced: l.disk != nil,
	}
	var used uint64
	if l.disk != nil {
		var st unix.Statfs_t
		if unix.Statfs(l.dir, &st) == nil {
			used = (st.Blocks - st.Bfree) * uint64(st.Bsize)
		}
	}
	_, cg := l.parts()
	if cg == nil {
		if l.disk != nil {
			v.Usage = &cgroupStats{DiskUsedBytes: used}
		}
		return v
	}
	e := s.enforcedLimits()
	v.MemoryEnforced, v.ProcessesEnforced, v.CPUEnforced, v.PauseFreezes = e.Memory, e.Processes, e.CPU, e.Freezer
	v.Cgroup = string(s.limiter.version)
	st := cg.stats()
	st.DiskUsedBytes = used
	v.Usage = &st
	return v
}

// lookupLease finds the request's sandbox, and counts the request as
// activity of it (see autopause.go).
func (s *Server) lookupLease(r *http.Request) (*lease, error) {
	l, err := s.peekLease(r)
	if err != nil {
		return nil, err
	}
	l.touch()
	return l, nil
}

// peekLease finds the request's sandbox without counting the request as
// its activity.
func (s *Server) peekLease(r *http.Request) (*lease, error) {
	id, err := pathID(r, "id")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	l, ok := s.leases[id]
	s.mu.Unlock()
	if !ok {
		return nil, notFound("sandbox")
	}
	return l, nil
}

// createSandboxRequest is the body of POST /sandboxes.
type createSandboxRequest struct {
	Shape          string            `json:"shape"`
	Rootfs         string            `json:"rootfs,omitempty"`
	Region         string            `json:"region,omitempty"`
	IngressEnabled bool              `json:"ingress_enabled"`
	DiskMiB        int               `json:"disk_mib,omitempty"`
	AutoPause      int               `json:"auto_pause_after_seconds,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	Egress         []string          `json:"egress,omitempty"`
}

// Label limits.
const (
	maxLabels          = 64
	maxLabelKeyBytes   = 128
	maxLabelValueBytes = 1024
	maxIdempotencyKeys = 10000
)

// validate checks the request and returns what to create.
func (s *Server) validate(req *createSandboxRequest) (leaseSpec, error) {
	spec, err := s.validateRequest(req)
	if err != nil {
		return leaseSpec{}, err
	}
	labels := req.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	spec.labels = labels
	return spec, nil
}

func (s *Server) validateRequest(req *createSandboxRequest) (leaseSpec, error) {
	sh, ok := lookupShape(req.Shape)
	if !ok {
		return leaseSpec{}, badRequest("unknown shape (GET /v1/shapes lists them)")
	}
	spec := leaseSpec{shape: sh, disk: int64(s.opts.DefaultDiskMiB) * mib}
	if req.DiskMiB != 0 {
		if req.DiskMiB < minDiskMiB || req.DiskMiB > maxDiskMiB {
			return leaseSpec{}, badRequest("disk_mib must be between %d and %d", minDiskMiB, maxDiskMiB)
		}
		spec.disk = int64(req.DiskMiB) * mib
	}
	if req.AutoPause != 0 {
		if req.AutoPause < minAutoPauseSeconds || req.AutoPause > maxAutoPauseSeconds {
			return leaseSpec{}, badRequest("auto_pause_after_seconds must be between %d and %d", minAutoPauseSeconds, maxAutoPauseSeconds)
		}
		spec.autoPause = time.Duration(req.AutoPause) * s.opts.autoPauseUnit
	}
	var err error
	if spec.net, err = s.netSpec(context.Background(), req.Egress, req.IngressEnabled); err != nil {
		return leaseSpec{}, err
	}
	if len(req.Rootfs) > 200 || len(req.Region) > 200 {
		return leaseSpec{}, badRequest("rootfs and region must be at most 200 bytes")
	}
	if len(req.Labels) > maxLabels {
		return leaseSpec{}, badRequest("at most %d labels", maxLabels)
	}
	for k, v := range req.Labels {
		if k == "" || len(k) > maxLabelKeyBytes || strings.ContainsAny(k, "=\x00") || !utf8.ValidString(k) {
			return leaseSpec{}, badRequest("label keys must be 1 to %d bytes of UTF-8 without '=' or NUL", maxLabelKeyBytes)
		}
		if len(v) > maxLabelValueBytes || strings.ContainsRune(v, 0) || !utf8.ValidString(v) {
			return leaseSpec{}, badRequest("label values must be at most %d bytes of UTF-8 without NUL", maxLabelValueBytes)
		}
	}
	if req.Rootfs != "" {
		if err := s.checkRootfs(req.Rootfs); err != nil {
			return leaseSpec{}, err
		}
		spec.rootfs = req.Rootfs
	}
	return spec, nil
}

// checkRootfs checks that name is one of the root file systems of
// Options.RootfsDir.
func (s *Server) checkRootfs(name string) error {
	if s.opts.RootfsDir == "" {
		return badRequest("unknown rootfs: this server has no root file systems but the host's (leave rootfs empty)")
	}
	if s.isolation != IsolationNamespaces {
		return badRequest("rootfs needs namespace isolation")
	}
	if name == "." || name == ".." || strings.ContainsAny(name, "/\\,:\x00") {
		return badRequest("unknown rootfs")
	}
	if fi, err := os.Stat(filepath.Join(s.opts.RootfsDir, name)); err != nil || !fi.IsDir() {
		return badRequest("unknown rootfs %q", name)
	}
	return nil
}

// idempotentCreate is a create made with an Idempotency-Key: repeats wait
// for it and answer the same sandbox.
type idempotentCreate struct {
	request string // the canonical request, to refuse a key reused for another
	done    chan struct{}
	leaseID string // set before done is closed
	err     error  // set before done is closed
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req createSandboxRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	spec, err := s.validate(&req)
	if err != nil {
		return err
	}
	labels := spec.labels
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		l, err := s.createLease(spec)
		if err != nil {
			return err
		}
		return writeData(w, s.view(l))
	}
	if len(key) > 200 || strings.IndexFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
		return badRequest("Idempotency-Key must be 1 to 200 printable ASCII characters")
	}
	canonical, _ := json.Marshal(req)
	s.mu.Lock()
	if prior, ok := s.idempotency[key]; ok {
		s.mu.Unlock()
		if prior.request != string(canonical) {
			return &apiError{http.StatusUnprocessableEntity, "Idempotency-Key was used for a different request"}
		}
		select {
		case <-prior.done:
		case <-r.Context().Done():
			return nil // the client is gone
		}
		if prior.err != nil {
			return prior.err
		}
		s.mu.Lock()
		l, ok := s.leases[prior.leaseID]
		s.mu.Unlock()
		if !ok {
			return writeData(w, sandboxView{ID: prior.leaseID, Status: stateDestroyed, Labels: labels})
		}
		return writeData(w, s.view(l))
	}
	create := &idempotentCreate{request: string(canonical), done: make(chan struct{})}
	s.idempotency[key] = create
	s.idemOrder = append(s.idemOrder, key)
	if len(s.idemOrder) > maxIdempotencyKeys {
		delete(s.idempotency, s.idemOrder[0])
		s.idemOrder = s.idemOrder[1:]
	}
	s.mu.Unlock()

	l, err := s.createLease(spec)
	if err != nil {
		// A failed create may be tried again with the same key.
		s.mu.Lock()
		if s.idempotency[key] == create {
			delete(s.idempotency, key)
		}
		s.mu.Unlock()
		create.err = err
		close(create.done)
		return err
	}
	create.leaseID = l.id
	close(create.done)
	return writeData(w, s.view(l))
}

// createLease makes a new lease and registers it. Starting a lease's
// machine takes a while, so it happens outside the server's lock, on a
// reserved place.
func (s *Server) createLease(spec leaseSpec) (*lease, error) {
	l, err := s.register(func() (*lease, error) { return s.newLease(newID("sb-"), spec) }, (*lease).destroy)
	if err == nil {
		s.log.Info("sandbox created", "sandbox", l.id, "shape", spec.shape.Name, "rootfs", spec.rootfs)
	}
	return l, err
}

// register makes a lease with newLease, outside the server's lock on a
// place reserved under MaxLeases, and registers it. When the server shut
// down meanwhile, undo releases what newLease made.
func (s *Server) register(newLease func() (*lease, error), undo func(*lease) error) (*lease, error) {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		return nil, &apiError{http.StatusServiceUnavailable, "the server is shutting down"}
	}
	if len(s.leases)+s.creating >= s.opts.MaxLeases {
		s.mu.Unlock()
		return nil, &apiError{http.StatusTooManyRequests, "too many sandboxes"}
	}
	s.creating++
	s.mu.Unlock()

	l, err := newLease()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creating--
	if err != nil {
		return nil, err
	}
	if s.shutdown {
		undo(l)
		return nil, &apiError{http.StatusServiceUnavailable, "the server is shutting down"}
	}
	s.leases[l.id] = l
	return l, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	l, err := s.peekLease(r)
	if err != nil {
		return err
	}
	return writeData(w, s.view(l))
}

// listSandboxes answers GET /sandboxes?label=k=v&label=…: the live
// sandboxes carrying every given label.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	want := map[string]string{}
	for _, kv := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return badRequest("label filters must look like key=value")
		}
		if prev, dup := want[k]; dup && prev != v {
			return writeData(w, map[string]any{"sandboxes": []sandboxView{}})
		}
		want[k] = v
	}
	s.mu.Lock()
	var matched []*lease
	for _, l := range s.leases {
		ok := true
		for k, v := range want {
			if got, has := l.labels[k]; !has || got != v {
				ok = false
				break
			}
		}
		if ok {
			matched = append(matched, l)
		}
	}
	s.mu.Unlock()
	sort.Slice(matched, func(i, j int) bool { return matched[i].created.Before(matched[j].created) })
	out := make([]sandboxView, 0, len(matched))
	for _, l := range matched {
		out = append(out, sandboxView{ID: l.id, Status: l.status(), Labels: l.labels, Workspace: l.workspace})
	}
	return writeData(w, map[string]any{"sandboxes": out})
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	if err := l.destroy(); err != nil {
		l.setErrorAfterFailedDestroy()
		return err
	}
	s.mu.Lock()
	if s.leases[l.id] == l {
		delete(s.leases, l.id)
	}
	s.mu.Unlock()
	s.log.Info("sandbox destroyed", "sandbox", l.id)
	return writeData(w, map[string]any{"id": l.id, "status": stateDestroyed})
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	state, ok := l.transition([]string{stateRunning}, statePausing)
	if !ok && state != statePaused {
		return conflict("the sandbox is " + state)
	}
	if ok {
		s.workers.Go(l.pause)
	}
	return writeData(w, map[string]any{"id": l.id, "status": state})
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	state, ok := l.transition([]string{statePaused, stateError}, stateResuming)
	if !ok && state != stateRunning {
		return conflict("the sandbox is " + state)
	}
	if ok {
		s.workers.Go(l.resume)
	}
	return writeData(w, map[string]any{"id": l.id, "status": state})
}
