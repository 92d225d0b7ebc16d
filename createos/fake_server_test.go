package createos

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/require"
)

// fakeServer is the one CreateOS server of the tests. It implements the
// protocol's semantics in memory: sandboxes, files, one-shot exec, and
// managed processes whose output journal is streamed as NDJSON. It speaks
// one of two dialects (fakeDialect): sandboxd's, or the hosted service's;
// a wire change is made here once, and where the two servers differ, in
// the dialect table alone.
//
// A process "runs" when its start gate opens — its token's line is
// written to its stdin, or, for a script of an earlier version
// (newLegacyProc), its gate file is written: the server then calls
// program, which writes output and exits (or not) through the *fakeProc.
//
// Each test scripts what it needs on top with hooks (see on) and checks
// afterwards what the client asked (see requests, routes).
type fakeServer struct {
	dialect fakeDialect
	srv     *httptest.Server
	mux     *http.ServeMux
	routeOf map[string]string // mux pattern → route name

	mu        sync.Mutex
	log       []fakeRequest
	calls     map[string]int
	hooks     map[string]fakeHook
	sandboxes map[string]*fakeSandbox
	byIdemKey map[string]string
	templates map[string]*fakeTemplate // by id
	nextID    int
	closed    chan struct{}

	// Set before the first request.
	program       func(p *fakeProc) // runs when a process's gate opens; nil: exit 0
	creatingPolls int               // GETs for which a new sandbox stays "creating" (sandboxd: create answers at once)
	workspace     string            // reported as data.workspace when not empty
	// boot runs while a held create waits for its sandbox to run (hosted:
	// create answers once running); it may block. The boot goes on when
	// the client gives up.
	boot func(sb *fakeSandbox)
	// build builds a template (synchronously, at its create): its log's
	// lines and whether it succeeded. Nil: one line, ready.
	build func(dockerfile string) (lines []string, ok bool)
	// hideGone leaves destroyed and failed sandboxes out of a list without
	// a status filter (whether the hosted service does is unconfirmed).
	hideGone bool
}

// fakeDialect is where the hosted service and sandboxd differ on the wire
// (docs/PROTOCOL.md §8, docs/CREATEOS-API.md): each difference the fake
// models is a field here, and each is asked for in one place.
type fakeDialect struct {
	// sandboxPrefix and procPrefix begin the ids of sandboxes and
	// processes.
	sandboxPrefix, procPrefix string
	// labels: a create's labels and Idempotency-Key are honoured, views
	// carry the labels, and a list filters by label=k=v. Without: all
	// three are ignored.
	labels bool
	// heldCreate: a create is answered once its sandbox runs (boot runs
	// while it is held, the row listed as creating). Without: it is
	// answered at once, creating for creatingPolls GETs.
	heldCreate bool
	// paginated: a list is {data:{data,pagination}}, clamped to
	// fakePageLimit.
	// Without: the {"sandboxes":[…]} of earlier sandboxd versions, whole.
	paginated bool
	// jsend: failures are JSend (fail with data.code below 500, error with
	// a code above) and every answer carries an X-Request-Id. Without: the
	// {"status":"error","error":…} of earlier sandboxd versions (fail).
	jsend bool
	// keepsDestroyed: a DELETE answers destroying, the sandbox reads
	// destroyed after one read and stays readable. Without: it is gone
	// (404) at once.
	keepsDestroyed bool
	// makesParents: a file's upload makes its parent directories. Without:
	// the parent must exist (exec mkdir -p makes it), else 404.
	makesParents bool
	// waitTimeout408: a wait that outlasts its timeout is answered 408, as
	// earlier sandboxd versions do. Without: the current, not-exited
	// process.
	waitTimeout408 bool
}

var (
	dialectSandboxd = fakeDialect{sandboxPrefix: "sb-", procPrefix: "p-",
		labels: true, makesParents: true, waitTimeout408: true}
	dialectHosted = fakeDialect{sandboxPrefix: "sb_", procPrefix: "proc_",
		heldCreate: true, paginated: true, jsend: true, keepsDestroyed: true}
)

// A fakeHook may answer a request itself (returning true) instead of the
// default semantics. n counts the requests of the route, from 1. The
// request is already recorded and its key checked.
type fakeHook func(w http.ResponseWriter, r *http.Request, n int) bool

// fakeRequest is a request as the server saw it.
type fakeRequest struct {
	Route  string
	Method string
	Path   string // below /v1
	Query  url.Values
	Header http.Header
	Body   []byte
	At     time.Time
}

type fakeSandbox struct {
	n                int // its place in creation order
	id, name, status string
	labels           map[string]string
	envs             []string // the names of the create's envs
	forkedFrom       string
	egress           []string
	polls            int // GETs left in "creating"
	dirs             map[string]bool
	files            map[string][]byte
	procs            map[string]*fakeProc
}

// fakeProc is a managed process: a script that waits for its gate, and an
// output journal.
type fakeProc struct {
	f    *fakeServer
	sb   *fakeSandbox
	id   string
	body struct {
		Cmd, Cwd string
		Args     []string
	}
	started        bool
	input          []byte   // written to its stdin before it passed its gate
	journal        []string // data frames; seq = index + 1
	evictedThrough int64    // seqs up to this one are gone from the journal
	exitCode       *int
	signal         string
	changed        chan struct{} // closed and replaced on every change
}

const testKey = "key-b1c2d3-secret"

// fakePageLimit clamps a paginated list's limit, so that every walk takes
// several pages.
const fakePageLimit = 2

// newFakeServer returns a fake sandboxd.
func newFakeServer(t testing.TB) *fakeServer { return newFakeServerIn(t, dialectSandboxd) }

// newFakeServerIn returns a fake server that speaks a dialect.
func newFakeServerIn(t testing.TB, dialect fakeDialect) *fakeServer {
	f := &fakeServer{
		dialect:   dialect,
		mux:       http.NewServeMux(),
		routeOf:   map[string]string{},
		calls:     map[string]int{},
		hooks:     map[string]fakeHook{},
		sandboxes: map[string]*fakeSandbox{},
		byIdemKey: map[string]string{},
		templates: map[string]*fakeTemplate{},
		closed:    make(chan struct{}),
	}
	for _, r := range []struct {
		pattern, name string
		h             http.HandlerFunc
	}{
		{"POST /v1/sandboxes", "createSandbox", f.createSandbox},
		{"GET /v1/sandboxes", "listSandboxes", f.listSandboxes},
		{"GET /v1/sandboxes/{sb}", "getSandbox", f.getSandbox},
		{"DELETE /v1/sandboxes/{sb}", "deleteSandbox", f.deleteSandbox},
		{"POST /v1/sandboxes/{sb}/pause", "pause", f.transition("running", "paused")},
		{"POST /v1/sandboxes/{sb}/resume", "resume", f.transition("paused", "running")},
		{"POST /v1/sandboxes/{sb}/fork", "fork", f.fork},
		{"PUT /v1/sandboxes/{sb}/egress", "setEgress", f.setEgress},
		{"POST /v1/sandboxes/{sb}/exec", "exec", f.exec},
		{"PUT /v1/sandboxes/{sb}/files", "putFile", f.putFile},
		{"POST /v1/sandboxes/{sb}/processes", "createProcess", f.createProcess},
		{"POST /v1/sandboxes/{sb}/processes/{pid}/input", "input", f.input},
		{"GET /v1/sandboxes/{sb}/processes/{pid}/connect", "connect", f.connect},
		{"GET /v1/sandboxes/{sb}/processes/{pid}/wait", "wait", f.wait},
		{"DELETE /v1/sandboxes/{sb}/processes/{pid}", "deleteProcess", f.deleteProcess},
		{"POST /v1/templates", "createTemplate", f.createTemplate},
		{"GET /v1/templates/{tpl}", "getTemplate", f.getTemplate},
		{"GET /v1/templates/{tpl}/logs", "followTemplate", f.followTemplate},
	} {
		f.mux.HandleFunc(r.pattern, r.h)
		f.routeOf[r.pattern] = r.name
	}
	f.srv = httptest.NewServer(f)
	t.Cleanup(func() {
		close(f.closed)
		f.srv.Close()
	})
	return f
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	_, pattern := f.mux.Handler(r)
	route := f.routeOf[pattern]
	f.mu.Lock()
	f.log = append(f.log, fakeRequest{
		Route: route, Method: r.Method, Path: strings.TrimPrefix(r.URL.Path, "/v1"),
		Query: r.URL.Query(), Header: r.Header.Clone(), Body: body, At: time.Now(),
	})
	f.calls[route]++
	n, hook, requestID := f.calls[route], f.hooks[route], "req-"+strconv.Itoa(len(f.log))
	f.mu.Unlock()
	if f.dialect.jsend {
		w.Header().Set("X-Request-Id", requestID)
	}
	if r.Header.Get("X-Api-Key") != testKey {
		f.refuse(w, http.StatusUnauthorized, "UNAUTHORIZED")
		return
	}
	if hook != nil && hook(w, r, n) {
		return
	}
	f.mux.ServeHTTP(w, r)
}

// on scripts a route (a name of the table in newFakeServerIn).
func (f *fakeServer) on(route string, h fakeHook) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks[route] = h
}

// requests returns the recorded requests of a route, or all with "".
func (f *fakeServer) requests(route string) []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeRequest
	for _, rq := range f.log {
		if route == "" || rq.Route == route {
			out = append(out, rq)
		}
	}
	return out
}

// routes returns the route of every request, in order.
func (f *fakeServer) routes() []string {
	var out []string
	for _, rq := range f.requests("") {
		out = append(out, rq.Route)
	}
	return out
}

func (f *fakeServer) count(route string) int { return len(f.requests(route)) }

// ids returns the ids of the sandboxes a user would still pay for
// (neither destroying nor destroyed), in creation order.
func (f *fakeServer) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, sb := range f.inOrderLocked() {
		if sb.status != "destroying" && sb.status != "destroyed" {
			ids = append(ids, sb.id)
		}
	}
	return ids
}

func (f *fakeServer) inOrderLocked() []*fakeSandbox {
	return slices.SortedFunc(maps.Values(f.sandboxes), func(a, b *fakeSandbox) int { return a.n - b.n })
}

// sandboxOf returns a copy of a sandbox's state.
func (f *fakeServer) sandboxOf(id string) fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *f.sandboxes[id]
}

// addSandbox puts a running sandbox in place without a request, as
// another client would have made it.
func (f *fakeServer) addSandbox(name string) *fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addSandboxLocked("running", name, nil)
}

// newLease puts a running sandbox in place without a request.
func (f *fakeServer) newLease() sandbox.Lease {
	sb := f.addSandbox("")
	return sandbox.Lease{ID: sb.id, Status: sandbox.StatusRunning, Workspace: DefaultWorkspace}
}

// pausedSource puts a paused sandbox with a file in place.
func (f *fakeServer) pausedSource(t *testing.T) sandbox.Lease {
	t.Helper()
	lease := f.newLease()
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[lease.ID]
	sb.status = "paused"
	sb.files[DefaultWorkspace+"/f"] = []byte("original")
	return lease
}

// newProc puts a process in place without a request, as an earlier
// Execute with this token would have left it; started says whether its
// gate was opened already.
func (f *fakeServer) newProc(lease sandbox.Lease, token string, started bool) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.addProcLocked(f.sandboxes[lease.ID], started)
	spec := scriptSpec{token: token, dir: lease.Workspace, argv: []string{"true"}}
	p.body.Cmd, p.body.Cwd, p.body.Args = shell, lease.Workspace, []string{"-c", spec.build()}
	return p
}

// newLegacyProc puts in place a process that an earlier version of the
// client started and left behind its gate: a bash script that polls for
// its gate file.
func (f *fakeServer) newLegacyProc(lease sandbox.Lease, token string) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.addProcLocked(f.sandboxes[lease.ID], false)
	script := "gate=" + shellQuote(legacyGatePath(lease.Workspace, token)) + "\n" +
		"while [ ! -e \"$gate\" ]; do sleep 0.02; done\nrm -f -- \"$gate\"\n" +
		"cd -- " + shellQuote(lease.Workspace) + " || exit 1\nexec -- 'true' < '/dev/null'\n"
	p.body.Cmd, p.body.Cwd, p.body.Args = "/bin/bash", lease.Workspace, []string{"-lc", script}
	return p
}

// addSandboxLocked makes a sandbox; body is its create's (or fork's), if
// any.
func (f *fakeServer) addSandboxLocked(status, name string, body *createBody) *fakeSandbox {
	f.nextID++
	sb := &fakeSandbox{n: f.nextID, id: f.dialect.sandboxPrefix + strconv.Itoa(f.nextID), name: name, status: status,
		polls: f.creatingPolls, dirs: map[string]bool{"/": true, "/workspace": true, "/tmp": true},
		files: map[string][]byte{}, procs: map[string]*fakeProc{}}
	if body != nil {
		if f.dialect.labels {
			sb.labels = body.Labels
		}
		sb.envs = slices.Sorted(maps.Keys(body.Envs))
		sb.egress = body.Egress
	}
	f.sandboxes[sb.id] = sb
	return sb
}

func (f *fakeServer) addProcLocked(sb *fakeSandbox, started bool) *fakeProc {
	f.nextID++
	p := &fakeProc{f: f, sb: sb, id: f.dialect.procPrefix + strconv.Itoa(f.nextID), started: started, changed: make(chan struct{})}
	sb.procs[p.id] = p
	return p
}

// file returns a file of a sandbox, and whether it exists.
func (f *fakeServer) file(leaseID, name string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.sandboxes[leaseID].files[name]
	return b, ok
}

// --- what a program can do

// write appends a data frame to the journal.
func (p *fakeProc) write(stream, data string) {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	p.journal = append(p.journal, dataFrame(int64(len(p.journal)+1), stream, data))
	p.changedLocked()
}

// exit ends the process with a code.
func (p *fakeProc) exit(code int) {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	p.exitLocked(&code, "")
}

func (p *fakeProc) exitLocked(code *int, signal string) {
	if p.exited() {
		return
	}
	p.exitCode, p.signal = code, signal
	p.changedLocked()
}

func (p *fakeProc) exited() bool { return p.exitCode != nil || p.signal != "" }

func (p *fakeProc) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// stdin returns the file the script redirects the command's stdin from.
func (p *fakeProc) stdin() []byte {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	for name, content := range p.sb.files {
		if strings.HasSuffix(name, ".stdin") && strings.Contains(p.script(), "< "+shellQuote(name)) {
			return content
		}
	}
	return nil
}

// script is the process's script: inline (`sh -c SCRIPT`) or uploaded
// (`sh FILE`). f.mu is held.
func (p *fakeProc) script() string {
	switch len(p.body.Args) {
	case 1:
		return string(p.sb.files[p.body.Args[0]])
	case 2:
		return p.body.Args[1]
	}
	return ""
}

// --- sandboxes

// createBody is what the fake reads of a create or a fork.
type createBody struct {
	Shape               string            `json:"shape"`
	Name                string            `json:"name"`
	Labels              map[string]string `json:"labels"`
	Envs                map[string]string `json:"envs"`
	Egress              []string          `json:"egress"`
	BandwidthQuotaBytes int64             `json:"bandwidth_quota_bytes"`
	AutoPauseSeconds    *int              `json:"auto_pause_after_seconds"`
}

func (f *fakeServer) createSandbox(w http.ResponseWriter, r *http.Request) {
	var body createBody
	switch {
	case json.NewDecoder(r.Body).Decode(&body) != nil:
		f.refuse(w, http.StatusBadRequest, "INVALID_BODY")
		return
	case body.Shape == "":
		f.refuse(w, http.StatusBadRequest, "SHAPE_REQUIRED")
		return
	case body.BandwidthQuotaBytes != 0:
		f.refuse(w, http.StatusBadRequest, "BANDWIDTH_QUOTA_AT_CREATE")
		return
	case body.AutoPauseSeconds != nil && (*body.AutoPauseSeconds < 60 || *body.AutoPauseSeconds > 86400):
		f.refuse(w, http.StatusBadRequest, "AUTO_PAUSE_OUT_OF_RANGE")
		return
	}
	f.mu.Lock()
	sb := f.createLocked(r.Header.Get("Idempotency-Key"), &body)
	boot := f.boot
	f.mu.Unlock()
	if sb == nil {
		f.refuse(w, http.StatusConflict, "NAME_TAKEN")
		return
	}
	if f.dialect.heldCreate && boot != nil {
		boot(sb)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dialect.heldCreate && sb.status == "creating" {
		sb.status = "running"
	}
	writeData(w, f.viewLocked(sb))
}

// createLocked returns the sandbox of a create: the one its key made
// before, if the dialect honours keys, else a new one; nil if its name is
// taken.
func (f *fakeServer) createLocked(key string, body *createBody) *fakeSandbox {
	if !f.dialect.labels {
		key = ""
	}
	if sb := f.sandboxes[f.byIdemKey[key]]; key != "" && sb != nil {
		return sb
	}
	for _, sb := range f.sandboxes {
		if body.Name != "" && sb.name == body.Name {
			return nil
		}
	}
	status := "running"
	if f.dialect.heldCreate || f.creatingPolls > 0 {
		status = "creating"
	}
	sb := f.addSandboxLocked(status, body.Name, body)
	if key != "" {
		f.byIdemKey[key] = sb.id
	}
	return sb
}

// viewLocked is a sandbox's view (SandboxView, and sandboxd's labels and
// workspace).
func (f *fakeServer) viewLocked(sb *fakeSandbox) map[string]any {
	v := map[string]any{"id": sb.id, "status": sb.status, "name": sb.name, "vcpu": 1, "mem_mib": 1024, "disk_mib": 4096,
		"created_at": "2026-09-01T12:00:00Z", "ingress_enabled": false}
	if sb.status != "creating" {
		v["ip"] = "10.0.0." + strconv.Itoa(sb.n)
	}
	if f.dialect.labels {
		v["labels"] = sb.labels
	}
	if sb.forkedFrom != "" {
		v["forked_from"] = sb.forkedFrom
	}
	if sb.envs != nil {
		v["envs"] = sb.envs
	}
	if f.workspace != "" {
		v["workspace"] = f.workspace
	}
	return v
}

// sandboxLocked finds the sandbox of a request, or answers 404. f.mu is
// held.
func (f *fakeServer) sandboxLocked(w http.ResponseWriter, r *http.Request) *fakeSandbox {
	sb := f.sandboxes[r.PathValue("sb")]
	if sb == nil {
		f.refuse(w, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	}
	return sb
}

func (f *fakeServer) getSandbox(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxLocked(w, r)
	if sb == nil {
		return
	}
	if sb.status == "creating" && !f.dialect.heldCreate {
		if sb.polls--; sb.polls <= 0 {
			sb.status = "running"
		}
	}
	writeData(w, f.viewLocked(sb))
	if sb.status == "destroying" {
		sb.status = "destroyed" // the reclaim ends after one read
	}
}

func (f *fakeServer) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := strconv.Atoi(orDefault(q.Get("limit"), "50"))
	offset, err2 := strconv.Atoi(orDefault(q.Get("offset"), "0"))
	if err != nil || err2 != nil || limit < 0 || offset < 0 {
		f.refuse(w, http.StatusBadRequest, "INVALID_PAGINATION")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	matching := []map[string]any{}
	for _, sb := range f.inOrderLocked() {
		gone := sb.status == "destroyed" || sb.status == "failed"
		if st := q.Get("status"); st != sb.status && (st != "" || gone && f.hideGone) {
			continue
		}
		if f.dialect.labels && !hasLabels(sb, q["label"]) {
			continue
		}
		matching = append(matching, f.viewLocked(sb))
	}
	if !f.dialect.paginated {
		writeData(w, map[string]any{"sandboxes": matching})
		return
	}
	limit = min(limit, fakePageLimit)
	page := matching[min(offset, len(matching)):min(offset+limit, len(matching))]
	writeData(w, map[string]any{"data": page,
		"pagination": map[string]any{"total": len(matching), "limit": limit, "offset": offset, "count": len(page)}})
}

// hasLabels reports whether a sandbox carries every k=v pair.
func hasLabels(sb *fakeSandbox, pairs []string) bool {
	for _, pair := range pairs {
		k, v, _ := strings.Cut(pair, "=")
		if sb.labels[k] != v {
			return false
		}
	}
	return true
}

func (f *fakeServer) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxLocked(w, r)
	if sb == nil {
		return
	}
	for _, p := range sb.procs {
		p.exitLocked(nil, "SIGKILL")
	}
	switch {
	case !f.dialect.keepsDestroyed:
		delete(f.sandboxes, sb.id)
		sb.status = "destroyed"
	case sb.status != "destroyed":
		sb.status = "destroying"
	}
	writeData(w, map[string]any{"id": sb.id, "status": sb.status})
}

// transition is pause and resume: from one state to another, else 409.
func (f *fakeServer) transition(from, to string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		sb := f.sandboxLocked(w, r)
		switch {
		case sb == nil:
		case sb.status != from:
			f.refuse(w, http.StatusConflict, "INVALID_TRANSITION")
		default:
			sb.status = to
			writeData(w, f.viewLocked(sb))
		}
	}
}

// fork makes a copy of a paused sandbox: its files and egress (unless the
// request names other rules) and, where the dialect keeps them, the
// request's labels. Its answer reads forking; it runs at once.
func (f *fakeServer) fork(w http.ResponseWriter, r *http.Request) {
	var body createBody
	if r.ContentLength != 0 && json.NewDecoder(r.Body).Decode(&body) != nil {
		f.refuse(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src := f.sandboxLocked(w, r)
	switch {
	case src == nil:
		return
	case src.status != "paused":
		f.refuse(w, http.StatusConflict, "INVALID_TRANSITION")
		return
	}
	sb := f.addSandboxLocked("forking", "", &body)
	sb.forkedFrom, sb.files, sb.dirs = src.id, maps.Clone(src.files), maps.Clone(src.dirs)
	if body.Egress == nil {
		sb.egress = src.egress
	}
	answer := f.viewLocked(sb)
	sb.status = "running"
	writeData(w, answer)
}

func (f *fakeServer) setEgress(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Egress *[]string `json:"egress"`
	}
	if json.NewDecoder(r.Body).Decode(&body) != nil || body.Egress == nil {
		f.refuse(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandboxLocked(w, r); sb != nil {
		sb.egress = *body.Egress
		writeData(w, map[string]any{"id": sb.id, "egress": sb.egress})
	}
}

// --- files and exec

// exec knows mkdir (-p), rm (-f) and test (-e); any other program is not
// found.
func (f *fakeServer) exec(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Cmd  string   `json:"cmd"`
		Args []string `json:"args"`
	}
	if json.NewDecoder(r.Body).Decode(&body) != nil {
		f.refuse(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxLocked(w, r)
	if sb == nil {
		return
	}
	code := 0
	switch body.Cmd {
	case "mkdir":
		for _, dir := range body.Args {
			if !strings.HasPrefix(dir, "-") {
				makeDirs(sb, dir)
			}
		}
	case "rm":
		for _, name := range body.Args {
			delete(sb.files, name)
		}
	case "test":
		if _, ok := sb.files[body.Args[len(body.Args)-1]]; !ok {
			code = 1
		}
	default:
		code = 127
	}
	writeData(w, map[string]any{"result": map[string]any{"exit_code": code, "stdout": "", "stderr": ""}, "exec_ms": 3.5})
}

func makeDirs(sb *fakeSandbox, dir string) {
	for d := dir; d != "/"; d = path.Dir(d) {
		sb.dirs[d] = true
	}
}

func (f *fakeServer) putFile(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	name := r.URL.Query().Get("path")
	f.mu.Lock()
	sb := f.sandboxLocked(w, r)
	if sb == nil || !f.placeLocked(w, sb, name) {
		f.mu.Unlock()
		return
	}
	sb.files[name] = body
	var gated *fakeProc
	if strings.HasSuffix(name, ".gate") {
		for _, p := range sb.procs {
			if !p.started && strings.Contains(p.script(), "gate="+shellQuote(name)+"\n") {
				p.started, gated = true, p
				delete(sb.files, name) // the legacy script removes its gate
			}
		}
	}
	f.mu.Unlock()
	f.run(gated)
	writeData(w, map[string]any{"bytes": len(body), "path": name})
}

// placeLocked checks that a file can be written at name, or answers why
// not.
func (f *fakeServer) placeLocked(w http.ResponseWriter, sb *fakeSandbox, name string) bool {
	switch {
	case !path.IsAbs(name):
		f.refuse(w, http.StatusBadRequest, "RELATIVE_PATH")
		return false
	case f.dialect.makesParents:
		makeDirs(sb, path.Dir(name))
	case !sb.dirs[path.Dir(name)]:
		f.refuse(w, http.StatusNotFound, "PARENT_NOT_FOUND")
		return false
	}
	return true
}

// --- managed processes

// run runs the program of a process whose gate just opened, if any.
func (f *fakeServer) run(gated *fakeProc) {
	if gated == nil {
		return
	}
	f.mu.Lock()
	program := f.program
	f.mu.Unlock()
	if program == nil {
		gated.exit(0)
	} else {
		program(gated)
	}
}

func (f *fakeServer) createProcess(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxLocked(w, r)
	if sb == nil {
		return
	}
	p := f.addProcLocked(sb, false)
	if json.NewDecoder(r.Body).Decode(&p.body) != nil || len(p.body.Args) == 0 || len(p.body.Args) > 2 {
		delete(sb.procs, p.id)
		f.refuse(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	writeData(w, p.viewLocked())
}

// proc finds the process of a request, or answers 404.
func (f *fakeServer) proc(w http.ResponseWriter, r *http.Request) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxLocked(w, r)
	if sb == nil {
		return nil
	}
	p := sb.procs[r.PathValue("pid")]
	if p == nil {
		f.refuse(w, http.StatusNotFound, "PROCESS_NOT_FOUND")
	}
	return p
}

// viewLocked is a ManagedProcess.
func (p *fakeProc) viewLocked() map[string]any {
	state := "running"
	if !p.started {
		state = "starting"
	}
	v := map[string]any{"process_id": p.id, "kind": "process", "pid": 7, "state": state,
		"leader_exited": p.exited(), "tree_exited": p.exited(), "created_at": "2026-09-01T12:00:00Z",
		"output": map[string]any{"oldest_seq": min(1, len(p.journal)), "newest_seq": len(p.journal), "bytes": 0}}
	switch {
	case p.signal != "":
		v["state"], v["signal"] = "exited", p.signal
	case p.exitCode != nil:
		v["state"], v["exit_code"] = "exited", *p.exitCode
	}
	return v
}

// input writes to a process's stdin, where its script waits for its
// token's line: the line opens the gate and runs the program. Once the
// script went past its gate (or the process ended), nothing reads the
// stdin any more: 409, as sandboxd answers.
func (f *fakeServer) input(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	var body struct {
		DataBase64 string `json:"data_base64"`
	}
	data, err := []byte(nil), json.NewDecoder(r.Body).Decode(&body)
	if err == nil {
		data, err = base64.StdEncoding.DecodeString(body.DataBase64)
	}
	if err != nil {
		f.refuse(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	if p.started || p.exited() {
		f.mu.Unlock()
		f.refuse(w, http.StatusConflict, "STDIN_CLOSED")
		return
	}
	p.input = append(p.input, data...)
	line, _, complete := strings.Cut(string(p.input), "\n")
	var gated *fakeProc
	if complete && strings.Contains(p.script(), `"$gate" = `+shellQuote(line)+" ]") {
		p.started, gated = true, p
	}
	f.mu.Unlock()
	f.run(gated)
	writeData(w, map[string]any{"input_seq": 1})
}

// connect streams the journal after a seq, a heartbeat first, until the
// process exits; 410 when the seq was evicted.
func (f *fakeServer) connect(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	after, err := strconv.ParseInt(orDefault(r.URL.Query().Get("after"), "0"), 10, 64)
	if err != nil || after < 0 {
		f.refuse(w, http.StatusBadRequest, "INVALID_CURSOR")
		return
	}
	f.mu.Lock()
	evicted := after < p.evictedThrough
	f.mu.Unlock()
	if evicted {
		f.refuse(w, http.StatusGone, "OUTPUT_OFFSET_EXPIRED")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, `{"type":"heartbeat"}`+"\n")
	w.(http.Flusher).Flush()
	next := int(after)
	for {
		f.mu.Lock()
		var lines []string
		if next < len(p.journal) {
			lines = append(lines, p.journal[next:]...)
			next = len(p.journal)
		}
		exit := ""
		if p.exited() {
			exit = exitLine(p.exitCode, p.signal)
		}
		changed := p.changed
		f.mu.Unlock()
		for _, l := range lines {
			io.WriteString(w, l+"\n")
		}
		if exit != "" {
			io.WriteString(w, exit+"\n")
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-f.closed:
			return
		}
	}
}

func (f *fakeServer) wait(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	if r.URL.Query().Get("scope") != "tree" {
		f.refuse(w, http.StatusBadRequest, "SCOPE")
		return
	}
	ms, _ := strconv.Atoi(r.URL.Query().Get("timeout_ms"))
	timeout := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer timeout.Stop()
	for {
		f.mu.Lock()
		exited, changed, view := p.exited(), p.changed, p.viewLocked()
		f.mu.Unlock()
		if exited {
			writeData(w, view)
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			if f.dialect.waitTimeout408 {
				f.refuse(w, http.StatusRequestTimeout, "WAIT_TIMEOUT")
			} else {
				writeData(w, view) // the current state: not exited yet
			}
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (f *fakeServer) deleteProcess(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	if r.URL.Query().Get("grace_ms") == "" {
		f.refuse(w, http.StatusBadRequest, "GRACE_REQUIRED")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p.exitLocked(nil, "SIGTERM")
	writeData(w, p.viewLocked())
}

// --- answers and frames

// bodySecret is in every failure body: it must never reach an error.
const bodySecret = "body-secret-7e1f"

// refuse answers a failure in the dialect's shape: JSend (fail with
// data.code below 500, error with a code above), or the earlier sandboxd's
// (fail).
func (f *fakeServer) refuse(w http.ResponseWriter, status int, code string) {
	if !f.dialect.jsend {
		fail(w, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if status >= 500 {
		fmt.Fprintf(w, `{"status":"error","message":%q,"code":%d}`, bodySecret, status)
		return
	}
	fmt.Fprintf(w, `{"status":"fail","data":{"code":%q,"message":%q}}`, code, bodySecret)
}

// fail answers a failure as earlier sandboxd versions did.
func fail(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"status":"error","error":%q}`, bodySecret)
}

func writeData(w http.ResponseWriter, data any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
}

// loseAnswer breaks the connection instead of answering.
func loseAnswer(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

// serveAndLoseAnswer does what the request asks, and breaks the
// connection instead of answering: the work is done, the client never
// hears of it.
func (f *fakeServer) serveAndLoseAnswer(w http.ResponseWriter, r *http.Request) {
	f.mux.ServeHTTP(httptest.NewRecorder(), r)
	loseAnswer(w)
}

// streamLines answers 200 with NDJSON lines, then ends the stream.
func streamLines(w http.ResponseWriter, lines ...string) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	for _, l := range lines {
		io.WriteString(w, l+"\n")
	}
	w.(http.Flusher).Flush()
}

func dataFrame(seq int64, stream, data string) string {
	return fmt.Sprintf(`{"type":"data","seq":%d,"stream":%q,"data_base64":%q}`, seq, stream, base64.StdEncoding.EncodeToString([]byte(data)))
}

func exitFrame(code int) string { return exitLine(&code, "") }

func exitLine(code *int, signal string) string {
	if signal != "" {
		return fmt.Sprintf(`{"type":"exit","signal":%q}`, signal)
	}
	return fmt.Sprintf(`{"type":"exit","exit_code":%d}`, *code)
}

// --- client side

// newTestClient returns a Client of f with test-fast reconnects, polls
// and retries.
func newTestClient(t testing.TB, f *fakeServer, configure ...func(*Config)) *Client {
	cfg := Config{BaseURL: f.srv.URL, APIKey: testKey}
	for _, c := range configure {
		c(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	c.reconnectDelay = time.Millisecond
	c.pollInterval = time.Millisecond
	c.retryBase = time.Millisecond
	return c
}

// recorder is an Observer that keeps what it learns. onStarted, if set,
// answers Started.
type recorder struct {
	started   []sandbox.Process
	chunks    []sandbox.Chunk
	onStarted func(sandbox.Process) error
	onOutput  func(sandbox.Chunk)
}

func (r *recorder) Started(p sandbox.Process) error {
	r.started = append(r.started, p)
	if r.onStarted != nil {
		return r.onStarted(p)
	}
	return nil
}

func (r *recorder) Output(c sandbox.Chunk) {
	r.chunks = append(r.chunks, c)
	if r.onOutput != nil {
		r.onOutput(c)
	}
}

// text joins the chunks of a stream.
func (r *recorder) text(s sandbox.Stream) string {
	var b strings.Builder
	for _, c := range r.chunks {
		if c.Stream == s {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// fakeTemplate is a template: its create answers pending, and the build
// (fakeServer.build) is over by the next request.
type fakeTemplate struct {
	id, name, dockerfile, status string
	fromSandbox                  string // a snapshot's
	lines                        []string
}

func (f *fakeServer) templateLocked(idOrName string) *fakeTemplate {
	for _, t := range f.templates {
		if t.id == idOrName || t.name == idOrName {
			return t
		}
	}
	return nil
}

func (f *fakeServer) createTemplate(w http.ResponseWriter, r *http.Request) {
	var body struct{ Name, Dockerfile string }
	if json.NewDecoder(r.Body).Decode(&body) != nil || body.Name == "" || body.Dockerfile == "" {
		f.refuse(w, http.StatusBadRequest, "BAD_REQUEST")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.templateLocked(body.Name) != nil {
		f.refuse(w, http.StatusConflict, "NAME_TAKEN")
		return
	}
	f.nextID++
	t := &fakeTemplate{id: fmt.Sprintf("tpl-%d", f.nextID), name: body.Name, dockerfile: body.Dockerfile, status: "pending"}
	f.templates[t.id] = t
	writeData(w, map[string]any{"id": t.id, "name": t.name, "status": t.status})
	t.lines, t.status = []string{"step 1/1"}, "ready"
	if f.build != nil {
		var ok bool
		if t.lines, ok = f.build(body.Dockerfile); !ok {
			t.status = "failed"
		}
	}
}

func (f *fakeServer) getTemplate(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.templateLocked(r.PathValue("tpl"))
	if t == nil {
		f.refuse(w, http.StatusNotFound, "NOT_FOUND")
		return
	}
	view := map[string]any{"id": t.id, "name": t.name, "status": t.status}
	if t.fromSandbox != "" {
		view["from_sandbox"] = t.fromSandbox
	}
	if r.URL.Query().Get("include") == "dockerfile" && t.dockerfile != "" {
		view["dockerfile"] = t.dockerfile
	}
	writeData(w, view)
}

// followTemplate answers the log, followed (NDJSON, ending with the final
// event) or not (plain text).
func (f *fakeServer) followTemplate(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	t := f.templateLocked(r.PathValue("tpl"))
	var lines []string
	var status string
	if t != nil {
		lines, status = slices.Clone(t.lines), t.status
	}
	f.mu.Unlock()
	if t == nil {
		f.refuse(w, http.StatusNotFound, "NOT_FOUND")
		return
	}
	enc := json.NewEncoder(w)
	for _, line := range lines {
		enc.Encode(map[string]string{"line": line})
	}
	enc.Encode(map[string]any{"final": true, "status": status})
}
