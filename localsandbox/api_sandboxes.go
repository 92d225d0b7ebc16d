package localsandbox

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// sandboxView is a sandbox as the API shows it: the official SandboxView
// (docs/CREATEOS-API.md §3.2), then the project's extensions.
type sandboxView struct {
	ID            string    `json:"id"`
	Status        string    `json:"status"`
	Name          string    `json:"name,omitempty"`
	IP            string    `json:"ip,omitempty"`
	VCPU          int       `json:"vcpu"`
	MemMiB        int64     `json:"mem_mib"`
	DiskMiB       int64     `json:"disk_mib"`
	CreatedAt     time.Time `json:"created_at"`
	RunningAt     time.Time `json:"running_at,omitzero"`
	PausedAt      time.Time `json:"paused_at,omitzero"`
	LastResumedAt time.Time `json:"last_resumed_at,omitzero"`
	DestroyedAt   time.Time `json:"destroyed_at,omitzero"`
	SpawnMS       float64   `json:"spawn_ms,omitempty"`
	Shape         string    `json:"shape,omitempty"`
	Rootfs        string    `json:"rootfs,omitempty"`
	Region        string    `json:"region,omitempty"`
	// Egress is the egress in force, explicitly: ["*"] all, [] none.
	Egress             *[]string `json:"egress,omitempty"`
	Envs               []string  `json:"envs,omitempty"` // names only
	SSHPubkeys         []string  `json:"ssh_pubkeys,omitempty"`
	IngressEnabled     bool      `json:"ingress_enabled"`
	IngressURLTemplate string    `json:"ingress_url_template,omitempty"`
	ForkedFrom         string    `json:"forked_from,omitempty"`
	// ProcessesCarried [ext], on a fork only: false, its processes were
	// not carried over from the source (fork.go); its files were.
	ProcessesCarried      *bool `json:"processes_carried,omitempty"`
	AutoPause             int   `json:"auto_pause_after_seconds,omitempty"`
	BandwidthIngressBytes int64 `json:"bandwidth_ingress_bytes,omitempty"`
	// BandwidthQuotaBytes is in the create answer only: -1, unmetered.
	BandwidthQuotaBytes *int64 `json:"bandwidth_quota_bytes,omitempty"`

	// [ext] The project's extensions; limits in GET and create only.
	Labels    map[string]string `json:"labels"`
	Workspace string            `json:"workspace,omitempty"`
	Isolation Isolation         `json:"isolation,omitempty"`
	Limits    *limitsView       `json:"limits,omitempty"`
	Network   *networkView      `json:"network,omitempty"`
}

// serverRegion is the one region of this server: a create may name it, or
// none.
const serverRegion = "local"

// stamp is a view's time: UTC, to the microsecond (every SDK's parser
// takes it); the zero time stays zero (omitted).
func stamp(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// view shows l, with its limits when withLimits.
func (s *Server) view(l *lease, withLimits bool) sandboxView {
	l.mu.Lock()
	status, runningAt, pausedAt, resumedAt, spawnTime, disk := l.state, l.runningAt, l.pausedAt, l.resumedAt, l.spawnTime, l.diskMax
	keys := slices.Clone(l.sshPubkeys)
	l.mu.Unlock()
	v := sandboxView{
		ID:            l.id,
		Status:        status,
		Name:          l.name,
		VCPU:          l.shape.vcpu(),
		MemMiB:        l.shape.MemoryBytes / mib,
		DiskMiB:       disk / mib,
		CreatedAt:     stamp(l.created),
		RunningAt:     stamp(runningAt),
		PausedAt:      stamp(pausedAt),
		LastResumedAt: stamp(resumedAt),
		SpawnMS:       float64(spawnTime.Microseconds()) / 1000,
		Shape:         l.shape.Name,
		Rootfs:        l.rootfs,
		Region:        serverRegion,
		Envs:          slices.Sorted(maps.Keys(l.envs)),
		SSHPubkeys:    keys,
		ForkedFrom:    l.forkedFrom,
		AutoPause:     int(l.autoPause() / s.opts.autoPauseUnit),
		Labels:        l.labels,
		Workspace:     l.workspace,
		Isolation:     l.isolation,
	}
	if l.forkedFrom != "" {
		v.ProcessesCarried = new(false)
	}
	s.addNetworkView(l, &v)
	v.BandwidthIngressBytes = v.Network.BytesIn
	if ip := s.leaseIP(l); ip.IsValid() {
		v.IP = ip.String() // an address that identifies the lease (api_byip.go)
	}
	if withLimits {
		v.Limits = s.limitsView(l)
	}
	return v
}

// limitsView says which limits apply to a lease's processes, which of them
// the kernel enforces, and what the kernel counted against them.
type limitsView struct {
	MaxProcesses      int        `json:"max_processes"`
	ProcessesEnforced bool       `json:"processes_enforced"`
	MaxOpenFiles      int        `json:"max_open_files"`
	MemoryBytes       int64      `json:"memory_bytes"`
	MemoryEnforced    bool       `json:"memory_enforced"`
	VCPUs             float64    `json:"vcpus"`
	CPUEnforced       bool       `json:"cpu_enforced"`
	PauseFreezes      bool       `json:"pause_freezes"` // by the cgroup freezer, not SIGSTOP
	DiskBytes         int64      `json:"disk_bytes"`
	DiskEnforced      bool       `json:"disk_enforced"`
	Cgroup            string     `json:"cgroup,omitempty"`
	Usage             *usageView `json:"usage,omitempty"`
}

// usageView is what the kernel counted against a lease's limits.
type usageView struct {
	OOMKills          uint64 `json:"oom_kills"`
	MemoryBytes       uint64 `json:"memory_bytes"`
	Tasks             uint64 `json:"tasks"`
	CPUThrottled      uint64 `json:"cpu_throttled_periods"`
	CPUThrottledNanos uint64 `json:"cpu_throttled_ns"`
	DiskUsedBytes     uint64 `json:"disk_used_bytes"`
}

// limitsView reports, honestly, what is enforced for l.
func (s *Server) limitsView(l *lease) *limitsView {
	v := &limitsView{
		MaxProcesses: s.opts.MaxProcesses,
		MaxOpenFiles: s.opts.MaxOpenFiles,
		MemoryBytes:  l.shape.MemoryBytes,
		VCPUs:        l.shape.VCPUs,
		DiskBytes:    l.diskBytes(),
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
			v.Usage = &usageView{DiskUsedBytes: used}
		}
		return v
	}
	e := s.enforcedLimits()
	v.MemoryEnforced, v.ProcessesEnforced, v.CPUEnforced, v.PauseFreezes = e.Memory, e.Processes, e.CPU, e.Freezer
	v.Cgroup = s.limiter.Version()
	st := cg.Stats()
	v.Usage = &usageView{OOMKills: st.OOMKills, MemoryBytes: st.MemoryBytes, Tasks: st.Tasks,
		CPUThrottled: st.CPUThrottled, CPUThrottledNanos: st.CPUThrottledNanos, DiskUsedBytes: used}
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
// its activity. A destroyed sandbox is not found.
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

// createSandboxRequest is the body of POST /v1/sandboxes: every field of
// the official create (docs/CREATEOS-API.md §3.2), and the project's labels.
type createSandboxRequest struct {
	Shape          string            `json:"shape"`
	Rootfs         string            `json:"rootfs,omitempty"`
	Name           string            `json:"name,omitempty"`
	Region         string            `json:"region,omitempty"`
	DiskMiB        int               `json:"disk_mib,omitempty"`
	Egress         []string          `json:"egress,omitempty"`
	Envs           map[string]string `json:"envs,omitempty"`
	IngressEnabled bool              `json:"ingress_enabled"`
	AutoPause      int               `json:"auto_pause_after_seconds,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"` // [ext]

	// Official fields this server does not serve: refused by name when set.
	SSHPubkeys          []string          `json:"ssh_pubkeys,omitempty"`
	Networks            []json.RawMessage `json:"networks,omitempty"`
	Disks               []json.RawMessage `json:"disks,omitempty"`
	NodeSelector        map[string]string `json:"node_selector,omitempty"`
	HostID              string            `json:"host_id,omitempty"`
	BandwidthQuotaBytes int64             `json:"bandwidth_quota_bytes,omitempty"`
}

// Request limits.
const (
	maxLabels          = 64
	maxLabelKeyBytes   = 128
	maxLabelValueBytes = 1024
	maxIdempotencyKeys = 10000
	maxEnvs            = 256
	maxEnvBytes        = 128 << 10 // names and values of one map
)

// namePattern is what a sandbox name may be: a DNS-label-like token.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// envNamePattern is what a variable's name may be.
var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)

// validate checks the request and returns what to create (its name not
// yet reserved).
func (s *Server) validate(req *createSandboxRequest) (leaseSpec, error) {
	for _, u := range []struct {
		set        bool
		field, why string
	}{
		{len(req.Networks) > 0, "networks", "it has no overlay networks"},
		{len(req.Disks) > 0, "disks", "it has no S3 disks"},
		{len(req.NodeSelector) > 0, "node_selector", "it is one host"},
		{req.HostID != "", "host_id", "it is one host"},
	} {
		if u.set {
			return leaseSpec{}, unsupported(u.field, u.why)
		}
	}
	if req.BandwidthQuotaBytes != 0 {
		return leaseSpec{}, badRequest("bandwidth_quota_bytes cannot be set at create")
	}
	if req.Region != "" && req.Region != serverRegion {
		return leaseSpec{}, badRequest("region must be %q, this server's, or empty", serverRegion)
	}
	if req.Name != "" && !namePattern.MatchString(req.Name) {
		return leaseSpec{}, badRequest("name must be 1 to 63 characters of A-Z, a-z, 0-9, '.', '_' or '-', starting with a letter or digit")
	}
	if err := checkEnv("envs", req.Envs); err != nil {
		return leaseSpec{}, err
	}
	keys, err := mergeSSHPubkeys(nil, req.SSHPubkeys)
	if err != nil {
		return leaseSpec{}, err
	}
	sh, ok := lookupShape(req.Shape)
	if !ok {
		return leaseSpec{}, badRequest("unknown shape (GET /v1/shapes lists them)")
	}
	spec := leaseSpec{shape: sh, name: req.Name, envs: req.Envs, sshPubkeys: keys, disk: int64(s.opts.DefaultDiskMiB) * mib}
	if req.DiskMiB != 0 {
		if req.DiskMiB < minDiskMiB || req.DiskMiB > maxDiskMiB {
			return leaseSpec{}, badRequest("disk_mib must be between %d and %d", minDiskMiB, maxDiskMiB)
		}
		spec.disk = int64(req.DiskMiB) * mib
	}
	if req.AutoPause != 0 {
		after, err := s.autoPauseAfter(req.AutoPause)
		if err != nil {
			return leaseSpec{}, err
		}
		spec.autoPause = after
	}
	if spec.net, err = s.netSpec(context.Background(), req.Egress, req.IngressEnabled); err != nil {
		return leaseSpec{}, err
	}
	if spec.labels, err = checkLabels(req.Labels); err != nil {
		return leaseSpec{}, err
	}
	if len(req.Rootfs) > 200 {
		return leaseSpec{}, badRequest("rootfs must be at most 200 bytes")
	}
	if spec.rootfs, err = s.resolveImage(req.Rootfs); err != nil {
		return leaseSpec{}, err
	}
	if s.images != nil {
		spec.defaults = s.images.templates.config(spec.rootfs) // templates.go
	}
	return spec, nil
}

// autoPauseAfter checks auto_pause_after_seconds.
func (s *Server) autoPauseAfter(seconds int) (time.Duration, error) {
	if seconds < minAutoPauseSeconds || seconds > maxAutoPauseSeconds {
		return 0, badRequest("auto_pause_after_seconds must be between %d and %d", minAutoPauseSeconds, maxAutoPauseSeconds)
	}
	return time.Duration(seconds) * s.opts.autoPauseUnit, nil
}

// checkLabels checks the [ext] labels; none is an empty map.
func checkLabels(labels map[string]string) (map[string]string, error) {
	if len(labels) > maxLabels {
		return nil, badRequest("at most %d labels", maxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > maxLabelKeyBytes || strings.ContainsAny(k, "=\x00") || !utf8.ValidString(k) {
			return nil, badRequest("label keys must be 1 to %d bytes of UTF-8 without '=' or NUL", maxLabelKeyBytes)
		}
		if len(v) > maxLabelValueBytes || strings.ContainsRune(v, 0) || !utf8.ValidString(v) {
			return nil, badRequest("label values must be at most %d bytes of UTF-8 without NUL", maxLabelValueBytes)
		}
	}
	if labels == nil {
		labels = map[string]string{}
	}
	return labels, nil
}

// checkEnv checks a map of variables (field names it in errors, which
// never quote a value).
func checkEnv(field string, env map[string]string) error {
	if len(env) > maxEnvs {
		return badRequest("%s: at most %d variables", field, maxEnvs)
	}
	size := 0
	for k, v := range env {
		if !envNamePattern.MatchString(k) {
			return badRequest("%s: a variable's name must match %s", field, envNamePattern)
		}
		if strings.ContainsRune(v, 0) {
			return badRequest("%s: the value of %s contains NUL", field, k)
		}
		size += len(k) + len(v)
	}
	if size > maxEnvBytes {
		return badRequest("%s: at most %d bytes of names and values", field, maxEnvBytes)
	}
	return nil
}

// idempotentCreate is a create made with an Idempotency-Key: repeats wait
// for it and answer the same sandbox.
type idempotentCreate struct {
	request [sha256.Size]byte // of the canonical request, to refuse a key reused for another
	done    chan struct{}
	leaseID string // set before done is closed
	err     error  // set before done is closed
}

// createView is the answer of a create: the sandbox's view, running, and
// unmetered.
func (s *Server) createView(l *lease) sandboxView {
	v := s.view(l, true)
	unmetered := int64(-1)
	v.BandwidthQuotaBytes = &unmetered
	return v
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req createSandboxRequest
	if err := s.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	spec, err := s.validate(&req)
	if err != nil {
		return err
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		l, err := s.createLease(spec)
		if err != nil {
			return err
		}
		return writeData(w, s.createView(l))
	}
	if len(key) > 200 || strings.IndexFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
		return badRequest("Idempotency-Key must be 1 to 200 printable ASCII characters")
	}
	canonical, _ := json.Marshal(req)
	digest := sha256.Sum256(canonical)
	s.mu.Lock()
	if prior, ok := s.idempotency[key]; ok {
		s.mu.Unlock()
		if prior.request != digest {
			return withCode("IDEMPOTENCY_KEY_REUSED", &apiError{http.StatusUnprocessableEntity, "Idempotency-Key was used for a different request"})
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
		gone, _ := s.destroyed.get(prior.leaseID)
		s.mu.Unlock()
		if !ok {
			if gone.ID == "" {
				gone = sandboxView{ID: prior.leaseID, Status: stateDestroyed, Labels: spec.labels}
			}
			return writeData(w, gone)
		}
		return writeData(w, s.createView(l))
	}
	create := &idempotentCreate{request: digest, done: make(chan struct{})}
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
	return writeData(w, s.createView(l))
}

// createLease reserves the spec's name and makes a new lease under it.
// Starting a lease's machine takes a while, so it happens outside the
// server's lock, on a reserved place.
func (s *Server) createLease(spec leaseSpec) (*lease, error) {
	name, err := s.reserveName(spec.name)
	if err != nil {
		return nil, err
	}
	spec.name = name
	began := time.Now()
	l, err := s.register(func() (*lease, error) {
		l, err := s.newLease(newID("sb-"), spec)
		if err == nil {
			l.spawnTime = time.Since(began)
		}
		return l, err
	}, (*lease).destroy)
	if err != nil {
		s.releaseName(name)
		return nil, err
	}
	s.log.Info("sandbox created", "sandbox", l.id, "shape", spec.shape.Name, "rootfs", spec.rootfs)
	return l, nil
}

// reserveName takes name for a new lease, or a new name when it is empty.
// A name is unique among the live leases (and those being created):
// another is a 409.
func (s *Server) reserveName(name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name == "" {
		if candidate := newID("sandbox-")[:len("sandbox-")+8]; !s.names[candidate] {
			name = candidate
		}
	}
	if s.names[name] {
		return "", withCode("NAME_TAKEN", conflict("a live sandbox already has this name"))
	}
	s.names[name] = true
	return name, nil
}

// releaseName frees the name of a lease that is gone (or was never made).
func (s *Server) releaseName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.names, name)
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
		return nil, withCode("TOO_MANY_SANDBOXES", &apiError{http.StatusTooManyRequests, "too many sandboxes"})
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

// getSandbox answers GET /v1/sandboxes/{id}: a live sandbox's view, or a
// destroyed one's while it is remembered (destroyedRetention).
func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, "id")
	if err != nil {
		return err
	}
	s.mu.Lock()
	l, ok := s.leases[id]
	gone, wasDestroyed := s.destroyed.get(id)
	s.mu.Unlock()
	switch {
	case ok:
		return writeData(w, s.view(l, true))
	case wasDestroyed:
		return writeData(w, gone)
	}
	return notFound("sandbox")
}

// listStates are the statuses a list may be filtered by.
var listStates = []string{stateRunning, statePausing, statePaused, stateResuming, stateForking, stateError, stateDestroyed,
	"creating", "destroying", "failed"}

// listSandboxes answers GET /v1/sandboxes?limit=&offset=&status=&label=k=v…
// with a page of the sandboxes, oldest first: the live ones, or with
// status=destroyed the destroyed ones still remembered; [ext] each label
// filter (repeated = AND) keeps those that carry it.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	limit, offset, err := pageOf(r)
	if err != nil {
		return err
	}
	status := r.URL.Query().Get("status")
	if status != "" && !slices.Contains(listStates, status) {
		return badRequest("status must be one of %s", strings.Join(listStates, ", "))
	}
	want := map[string]string{}
	none := false
	for _, kv := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return badRequest("label filters must look like key=value")
		}
		if prev, dup := want[k]; dup && prev != v {
			none = true
		}
		want[k] = v
	}
	carries := func(labels map[string]string) bool {
		for k, v := range want {
			if got, has := labels[k]; !has || got != v {
				return false
			}
		}
		return !none
	}
	if status == stateDestroyed {
		s.mu.Lock()
		var matched []sandboxView
		for _, v := range s.destroyed.all() {
			if carries(v.Labels) {
				matched = append(matched, v)
			}
		}
		s.mu.Unlock()
		return writePage(w, matched, limit, offset, func(v sandboxView) sandboxView { return v })
	}
	s.mu.Lock()
	var matched []*lease
	for _, l := range s.leases {
		if carries(l.labels) {
			matched = append(matched, l)
		}
	}
	s.mu.Unlock()
	matched = slices.DeleteFunc(matched, func(l *lease) bool {
		st := l.status()
		return st == stateDestroyed || status != "" && st != status
	})
	sort.Slice(matched, func(i, j int) bool { return matched[i].created.Before(matched[j].created) })
	return writePage(w, matched, limit, offset, func(l *lease) sandboxView { return s.view(l, false) })
}

// deleteSandbox answers DELETE /v1/sandboxes/{id}: the sandbox and every
// process in it are destroyed before the answer, {id, status: destroyed};
// again on a destroyed sandbox that is still remembered.
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, "id")
	if err != nil {
		return err
	}
	s.mu.Lock()
	l, ok := s.leases[id]
	_, wasDestroyed := s.destroyed.get(id)
	s.mu.Unlock()
	answer := map[string]any{"id": id, "status": stateDestroyed}
	switch {
	case !ok && wasDestroyed:
		return writeData(w, answer)
	case !ok:
		return notFound("sandbox")
	}
	if err := s.destroySandbox(l); err != nil {
		return err
	}
	return writeData(w, answer)
}

// destroySandbox destroys l and every process in it and remembers its
// last view as destroyed (the API's delete, and the lease's own through
// its self API).
func (s *Server) destroySandbox(l *lease) error {
	l.deleting.Lock()
	defer l.deleting.Unlock()
	s.mu.Lock()
	current := s.leases[l.id] == l
	s.mu.Unlock()
	if !current {
		return nil // destroyed while this one waited
	}
	last := s.view(l, false)
	if err := l.destroy(); err != nil {
		l.setErrorAfterFailedDestroy()
		return err
	}
	last.Status, last.DestroyedAt, last.Network = stateDestroyed, stamp(time.Now()), nil
	s.mu.Lock()
	if s.leases[l.id] == l {
		delete(s.leases, l.id)
		delete(s.names, l.name)
		s.destroyed.add(last)
	}
	s.mu.Unlock()
	s.log.Info("sandbox destroyed", "sandbox", l.id)
	return nil
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
	return writeData(w, s.view(l, false))
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
	return writeData(w, s.view(l, false))
}

// Destroyed sandboxes are remembered, for GET, DELETE and
// ?status=destroyed, for destroyedRetention after their destroy, the
// newest maxDestroyed of them.
const (
	destroyedRetention = time.Hour
	maxDestroyed       = 1000
)

// destroyedLeases are the last views of destroyed sandboxes, oldest first;
// guarded by Server.mu.
type destroyedLeases struct {
	views   []sandboxView
	index   map[string]int // id → position in views + dropped
	dropped int            // views dropped from the front so far
}

// forget drops the views past their retention or beyond maxDestroyed.
func (d *destroyedLeases) forget() {
	n := 0
	for n < len(d.views) && (len(d.views)-n > maxDestroyed || time.Since(d.views[n].DestroyedAt) > destroyedRetention) {
		delete(d.index, d.views[n].ID)
		n++
	}
	if n > 0 {
		clear(d.views[:n])
		d.views = d.views[n:]
		d.dropped += n
	}
}

func (d *destroyedLeases) add(v sandboxView) {
	if d.index == nil {
		d.index = make(map[string]int)
	}
	d.index[v.ID] = d.dropped + len(d.views)
	d.views = append(d.views, v)
	d.forget()
}

func (d *destroyedLeases) get(id string) (sandboxView, bool) {
	d.forget()
	i, ok := d.index[id]
	if !ok {
		return sandboxView{}, false
	}
	return d.views[i-d.dropped], true
}

func (d *destroyedLeases) all() []sandboxView {
	d.forget()
	return d.views
}
