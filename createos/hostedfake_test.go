package createos

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostedFake is a server that behaves like the hosted CreateOS service as
// docs/CREATEOS-API.md describes it, where it differs from the project's own
// sandboxd:
//
//   - no labels (the create's labels field is ignored, views have none) and
//     no Idempotency-Key (ignored);
//   - names unique per user: a create with a taken name (even a destroyed
//     sandbox's) is 409 NAME_TAKEN;
//   - create is synchronous: the row is listed as creating while the
//     request is held, and the answer comes once it runs — the boot goes on
//     when the client gives up;
//   - lists are paginated ({data:{data,pagination}}), and clamped to
//     pageLimit so that every walk takes several pages;
//   - errors are JSend (fail with data.code, error with code), with an
//     X-Request-Id on every answer;
//   - DELETE answers destroying; the row reads back destroyed afterwards,
//     and stays readable;
//   - a file's parent directory must exist (exec mkdir -p makes it);
//   - wait answers the current process at its timeout, not 408.
//
// Processes run a program when their start gate opens, as in
// fakeServer.
type hostedFake struct {
	t   testing.TB
	srv *httptest.Server
	mux *http.ServeMux

	mu        sync.Mutex
	log       []hostedRequest
	sandboxes []*hostedSandbox // in creation order
	nextID    int
	pageLimit int
	// hideGone leaves destroyed and failed sandboxes out of a list without
	// a status filter (whether the hosted service does is unconfirmed).
	hideGone bool

	// Set before the first request.
	// boot runs while a create is held, before the sandbox runs; it may
	// block. The boot goes on even when the client is gone.
	boot func(sb *hostedSandbox)
	// answerCreate may replace the answer of the n-th create (returning
	// true), after the sandbox runs: to lose it, for example.
	answerCreate func(w http.ResponseWriter, n int) bool
	// failCreate may refuse the n-th create before anything happens.
	failCreate func(w http.ResponseWriter, n int) bool
	// answerFork may replace the answer of the n-th fork (returning
	// true), after the fork was made: to lose it, for example.
	answerFork func(w http.ResponseWriter, n int) bool
	// program runs when a process's gate opens; nil writes "hosted\n" and
	// exits 0.
	program func(p *hostedProc)
	// listed is told of every list request, before it is answered.
	listed func()
}

type hostedRequest struct {
	Method, Path string
	Query        map[string][]string
	Header       http.Header
	Body         []byte
}

type hostedSandbox struct {
	id, name, status string
	body             map[string]any // the create body as sent
	forkedFrom       string
	egress           []string
	dirs             map[string]bool
	files            map[string][]byte
	procs            map[string]*hostedProc
}

type hostedProc struct {
	f       *hostedFake
	id      string
	script  string
	started bool
	stdin   []byte // written to it before it passed its gate
	journal []string
	exit    *int
	signal  string
	changed chan struct{}
}

func newHostedFake(t testing.TB) *hostedFake {
	f := &hostedFake{t: t, mux: http.NewServeMux(), pageLimit: 2}
	for pattern, h := range map[string]http.HandlerFunc{
		"POST /v1/sandboxes":                             f.create,
		"GET /v1/sandboxes":                              f.list,
		"GET /v1/sandboxes/{sb}":                         f.get,
		"DELETE /v1/sandboxes/{sb}":                      f.destroy,
		"POST /v1/sandboxes/{sb}/exec":                   f.exec,
		"PUT /v1/sandboxes/{sb}/files":                   f.putFile,
		"POST /v1/sandboxes/{sb}/processes":              f.createProcess,
		"POST /v1/sandboxes/{sb}/processes/{pid}/input":  f.input,
		"GET /v1/sandboxes/{sb}/processes/{pid}/connect": f.connect,
		"GET /v1/sandboxes/{sb}/processes/{pid}/wait":    f.wait,
		"DELETE /v1/sandboxes/{sb}/processes/{pid}":      f.killProcess,
		"POST /v1/sandboxes/{sb}/{verb}":                 f.lifecycle,
		"POST /v1/sandboxes/{sb}/fork":                   f.fork,
		"PUT /v1/sandboxes/{sb}/egress":                  f.setEgress,
	} {
		f.mux.HandleFunc(pattern, h)
	}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *hostedFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	f.mu.Lock()
	f.log = append(f.log, hostedRequest{Method: r.Method, Path: strings.TrimPrefix(r.URL.Path, "/v1"), Query: r.URL.Query(), Header: r.Header.Clone(), Body: body})
	id := "req-" + strconv.Itoa(len(f.log))
	f.mu.Unlock()
	w.Header().Set("X-Request-Id", id)
	if r.Header.Get("X-Api-Key") != testKey {
		hostedFail(w, http.StatusUnauthorized, "UNAUTHORIZED")
		return
	}
	f.mux.ServeHTTP(w, r)
}

// requests returns the requests with this method and path ("" matches
// any path).
func (f *hostedFake) requests(method, p string) []hostedRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []hostedRequest
	for _, rq := range f.log {
		if rq.Method == method && (p == "" || rq.Path == p) {
			out = append(out, rq)
		}
	}
	return out
}

// alive returns the ids of the sandboxes that are neither destroying nor
// destroyed: what a user would still pay for.
func (f *hostedFake) alive() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, sb := range f.sandboxes {
		if sb.status != "destroying" && sb.status != "destroyed" {
			ids = append(ids, sb.id)
		}
	}
	return ids
}

// addSandbox puts a running sandbox of another client in place.
func (f *hostedFake) addSandbox(name string) *hostedSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.newSandboxLocked(name, nil)
	sb.status = "running"
	return sb
}

func (f *hostedFake) newSandboxLocked(name string, body map[string]any) *hostedSandbox {
	f.nextID++
	if name == "" {
		name = "brave-otter-" + strconv.Itoa(f.nextID)
	}
	sb := &hostedSandbox{id: "sb_" + strconv.Itoa(f.nextID), name: name, status: "creating", body: body,
		dirs: map[string]bool{"/": true, "/workspace": true, "/tmp": true}, files: map[string][]byte{}, procs: map[string]*hostedProc{}}
	f.sandboxes = append(f.sandboxes, sb)
	return sb
}

func (f *hostedFake) sandbox(w http.ResponseWriter, r *http.Request) *hostedSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sb := range f.sandboxes {
		if sb.id == r.PathValue("sb") {
			return sb
		}
	}
	hostedFail(w, http.StatusNotFound, "SANDBOX_NOT_FOUND")
	return nil
}

// view is a SandboxView: no labels, no workspace.
func (sb *hostedSandbox) view() map[string]any {
	v := map[string]any{"id": sb.id, "status": sb.status, "name": sb.name, "vcpu": 1, "mem_mib": 1024, "disk_mib": 4096,
		"created_at": "2026-09-01T12:00:00Z", "ingress_enabled": false}
	if sb.status != "creating" {
		v["ip"] = "10.0.0." + strings.TrimPrefix(sb.id, "sb_")
	}
	if sb.forkedFrom != "" {
		v["forked_from"] = sb.forkedFrom
	}
	if envs, ok := sb.body["envs"].(map[string]any); ok {
		var names []string
		for k := range envs {
			names = append(names, k)
		}
		v["envs"] = names
	}
	return v
}

// --- sandboxes

func (f *hostedFake) create(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if json.NewDecoder(r.Body).Decode(&body) != nil {
		hostedFail(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	n := len(f.requestsLocked(http.MethodPost, "/sandboxes"))
	failCreate := f.failCreate
	f.mu.Unlock()
	if failCreate != nil && failCreate(w, n) {
		return
	}
	shape, _ := body["shape"].(string)
	if shape == "" {
		hostedFail(w, http.StatusBadRequest, "SHAPE_REQUIRED")
		return
	}
	if q, ok := body["bandwidth_quota_bytes"].(float64); ok && q != 0 {
		hostedFail(w, http.StatusBadRequest, "BANDWIDTH_QUOTA_AT_CREATE")
		return
	}
	if a, ok := body["auto_pause_after_seconds"].(float64); ok && (a < 60 || a > 86400) {
		hostedFail(w, http.StatusBadRequest, "AUTO_PAUSE_OUT_OF_RANGE")
		return
	}
	name, _ := body["name"].(string)
	f.mu.Lock()
	for _, sb := range f.sandboxes {
		if name != "" && sb.name == name {
			f.mu.Unlock()
			hostedFail(w, http.StatusConflict, "NAME_TAKEN")
			return
		}
	}
	sb := f.newSandboxLocked(name, body)
	boot := f.boot
	f.mu.Unlock()
	if boot != nil {
		boot(sb)
	}
	f.mu.Lock()
	if sb.status == "creating" {
		sb.status = "running"
	}
	answer := map[string]any{"id": sb.id, "status": sb.status, "name": sb.name, "ip": "10.0.0.1", "shape": shape,
		"vcpu": 1, "mem_mib": 1024, "disk_mib": 4096, "spawn_ms": 812.5, "bandwidth_quota_bytes": -1}
	answerCreate := f.answerCreate
	f.mu.Unlock()
	if answerCreate != nil && answerCreate(w, n) {
		return
	}
	hostedData(w, answer)
}

func (f *hostedFake) requestsLocked(method, p string) []hostedRequest {
	var out []hostedRequest
	for _, rq := range f.log {
		if rq.Method == method && rq.Path == p {
			out = append(out, rq)
		}
	}
	return out
}

func (f *hostedFake) list(w http.ResponseWriter, r *http.Request) {
	if f.listed != nil {
		f.listed()
	}
	q := r.URL.Query()
	limit, err := strconv.Atoi(q.Get("limit"))
	if q.Get("limit") == "" {
		limit, err = 50, nil
	}
	offset, err2 := strconv.Atoi(orDefault(q.Get("offset"), "0"))
	if err != nil || err2 != nil || limit < 0 || offset < 0 {
		hostedFail(w, http.StatusBadRequest, "INVALID_PAGINATION")
		return
	}
	limit = min(limit, f.pageLimit)
	f.mu.Lock()
	var matching []map[string]any
	for _, sb := range f.sandboxes {
		gone := sb.status == "destroyed" || sb.status == "failed"
		if st := q.Get("status"); st == sb.status || (st == "" && !(gone && f.hideGone)) {
			matching = append(matching, sb.view())
		}
	}
	f.mu.Unlock()
	page := []map[string]any{}
	if offset < len(matching) {
		page = matching[offset:min(offset+limit, len(matching))]
	}
	hostedData(w, map[string]any{"data": page,
		"pagination": map[string]any{"total": len(matching), "limit": limit, "offset": offset, "count": len(page)}})
}

func (f *hostedFake) get(w http.ResponseWriter, r *http.Request) {
	sb := f.sandbox(w, r)
	if sb == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	hostedData(w, sb.view())
	if sb.status == "destroying" {
		sb.status = "destroyed" // the reclaim ends after one read
	}
}

func (f *hostedFake) destroy(w http.ResponseWriter, r *http.Request) {
	sb := f.sandbox(w, r)
	if sb == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb.status != "destroyed" {
		sb.status = "destroying"
	}
	for _, p := range sb.procs {
		p.end(nil, "SIGKILL")
	}
	hostedData(w, map[string]any{"id": sb.id, "status": sb.status})
}

func (f *hostedFake) lifecycle(w http.ResponseWriter, r *http.Request) {
	sb := f.sandbox(w, r)
	if sb == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch verb := r.PathValue("verb"); {
	case verb == "pause" && sb.status == "running":
		sb.status = "paused"
	case verb == "resume" && sb.status == "paused":
		sb.status = "running"
	case verb == "pause" || verb == "resume":
		hostedFail(w, http.StatusConflict, "INVALID_TRANSITION")
		return
	default:
		hostedFail(w, http.StatusNotFound, "ROUTE_NOT_FOUND")
		return
	}
	hostedData(w, sb.view())
}

// --- files and exec

func (f *hostedFake) exec(w http.ResponseWriter, r *http.Request) {
	sb := f.sandbox(w, r)
	if sb == nil {
		return
	}
	var body struct {
		Cmd  string   `json:"cmd"`
		Args []string `json:"args"`
	}
	if json.NewDecoder(r.Body).Decode(&body) != nil {
		hostedFail(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	code := 0
	switch body.Cmd {
	case "mkdir":
		for _, dir := range body.Args {
			for d := dir; d != "/" && !strings.HasPrefix(d, "-"); d = path.Dir(d) {
				sb.dirs[d] = true
			}
		}
	case "rm":
		for _, name := range body.Args {
			delete(sb.files, name)
		}
	default:
		code = 127
	}
	hostedData(w, map[string]any{"result": map[string]any{"stdout": "", "stderr": "", "exit_code": code}, "exec_ms": 3.5})
}

func (f *hostedFake) putFile(w http.ResponseWriter, r *http.Request) {
	sb := f.sandbox(w, r)
	if sb == nil {
		return
	}
	name := r.URL.Query().Get("path")
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	if !path.IsAbs(name) {
		f.mu.Unlock()
		hostedFail(w, http.StatusBadRequest, "RELATIVE_PATH")
		return
	}
	if !sb.dirs[path.Dir(name)] {
		f.mu.Unlock()
		hostedFail(w, http.StatusNotFound, "PARENT_NOT_FOUND")
		return
	}
	sb.files[name] = body
	f.mu.Unlock()
	hostedData(w, map[string]any{"bytes": len(body), "path": name})
}

// --- managed processes

func (f *hostedFake) createProcess(w http.ResponseWriter, r *http.Request) {
	sb := f.sandbox(w, r)
	if sb == nil {
		return
	}
	var body struct {
		Cmd  string   `json:"cmd"`
		Args []string `json:"args"`
		Cwd  string   `json:"cwd"`
	}
	if json.NewDecoder(r.Body).Decode(&body) != nil || len(body.Args) == 0 || len(body.Args) > 2 {
		hostedFail(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	script := body.Args[len(body.Args)-1] // sh -c SCRIPT
	if len(body.Args) == 1 {              // sh FILE
		script = string(sb.files[body.Args[0]])
	}
	f.nextID++
	p := &hostedProc{f: f, id: "proc_" + strconv.Itoa(f.nextID), script: script, changed: make(chan struct{})}
	sb.procs[p.id] = p
	hostedData(w, p.viewLocked())
}

func (f *hostedFake) proc(w http.ResponseWriter, r *http.Request) *hostedProc {
	sb := f.sandbox(w, r)
	if sb == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := sb.procs[r.PathValue("pid")]; p != nil {
		return p
	}
	hostedFail(w, http.StatusNotFound, "PROCESS_NOT_FOUND")
	return nil
}

func (p *hostedProc) viewLocked() map[string]any {
	state := "running"
	if !p.started {
		state = "starting"
	}
	v := map[string]any{"process_id": p.id, "kind": "process", "pid": 7, "state": state,
		"leader_exited": p.ended(), "tree_exited": p.ended(), "created_at": "2026-09-01T12:00:00Z",
		"output": map[string]any{"oldest_seq": min(1, len(p.journal)), "newest_seq": len(p.journal), "bytes": 0}}
	switch {
	case p.signal != "":
		v["state"], v["signal"] = "exited", p.signal
	case p.exit != nil:
		v["state"], v["exit_code"] = "exited", *p.exit
	}
	return v
}

func (p *hostedProc) ended() bool { return p.exit != nil || p.signal != "" }

func (p *hostedProc) write(stream, data string) {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	p.journal = append(p.journal, fmt.Sprintf(`{"type":"data","seq":%d,"stream":%q,"data_base64":%q,"oldest_available_seq":1}`,
		len(p.journal)+1, stream, base64.StdEncoding.EncodeToString([]byte(data))))
	p.changedLocked()
}

func (p *hostedProc) exitWith(code int) {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	p.end(&code, "")
}

// end ends the process; the caller holds the lock.
func (p *hostedProc) end(code *int, signal string) {
	if p.ended() {
		return
	}
	p.exit, p.signal = code, signal
	p.changedLocked()
}

func (p *hostedProc) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// input writes to a process's stdin, where its script waits for its
// token's line: the line opens the gate and runs the program. Once the
// script went past its gate, nothing reads the stdin any more: 409.
func (f *hostedFake) input(w http.ResponseWriter, r *http.Request) {
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
		hostedFail(w, http.StatusBadRequest, "INVALID_BODY")
		return
	}
	f.mu.Lock()
	if p.started || p.ended() {
		f.mu.Unlock()
		hostedFail(w, http.StatusConflict, "STDIN_CLOSED")
		return
	}
	p.stdin = append(p.stdin, data...)
	line, _, complete := strings.Cut(string(p.stdin), "\n")
	open := complete && strings.Contains(p.script, `"$gate" = `+shellQuote(line)+" ]")
	p.started = open
	program := f.program
	f.mu.Unlock()
	if open {
		if program == nil {
			p.write("stdout", "hosted\n")
			p.exitWith(0)
		} else {
			program(p)
		}
	}
	hostedData(w, map[string]any{"input_seq": 1})
}

func (f *hostedFake) connect(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	after, err := strconv.Atoi(orDefault(r.URL.Query().Get("after"), "0"))
	if err != nil || after < 0 {
		hostedFail(w, http.StatusBadRequest, "INVALID_CURSOR")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, `{"type":"heartbeat"}`+"\n")
	w.(http.Flusher).Flush()
	next := after
	for {
		f.mu.Lock()
		var lines []string
		if next < len(p.journal) {
			lines, next = append(lines, p.journal[next:]...), len(p.journal)
		}
		var exit string
		switch {
		case p.signal != "":
			exit = fmt.Sprintf(`{"type":"exit","signal":%q}`, p.signal)
		case p.exit != nil:
			exit = fmt.Sprintf(`{"type":"exit","exit_code":%d}`, *p.exit)
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
		}
	}
}

func (f *hostedFake) wait(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	if r.URL.Query().Get("scope") != "tree" {
		hostedFail(w, http.StatusBadRequest, "SCOPE")
		return
	}
	ms, _ := strconv.Atoi(r.URL.Query().Get("timeout_ms"))
	timeout := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer timeout.Stop()
	for {
		f.mu.Lock()
		ended, changed, view := p.ended(), p.changed, p.viewLocked()
		f.mu.Unlock()
		if ended {
			hostedData(w, view)
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			hostedData(w, view) // the current state: not exited yet
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (f *hostedFake) killProcess(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p.end(nil, "SIGTERM")
	hostedData(w, p.viewLocked())
}

// --- answers

func hostedData(w http.ResponseWriter, data any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
}

// hostedFail answers a JSend failure: fail with data.code below 500,
// error with a code above. The message carries bodySecret, which must
// never reach an error.
func hostedFail(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if status >= 500 {
		fmt.Fprintf(w, `{"status":"error","message":%q,"code":%d}`, bodySecret, status)
		return
	}
	fmt.Fprintf(w, `{"status":"fail","data":{"code":%q,"message":%q}}`, code, bodySecret)
}

// loseAnswer breaks the connection instead of answering.
func loseAnswer(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func newHostedClient(t testing.TB, f *hostedFake, configure ...func(*Config)) *Client {
	cfg := Config{BaseURL: f.srv.URL, APIKey: testKey}
	for _, c := range configure {
		c(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.reconnectDelay = time.Millisecond
	c.pollInterval = time.Millisecond
	c.retryBase = time.Millisecond
	return c
}

// --- the proof: the client's whole lease/execute/sweep path on it

// staticSecrets is a Secrets of fixed values.
type staticSecrets map[string]string

func (s staticSecrets) Secret(_ context.Context, name string) (string, error) {
	v, ok := s[name]
	if !ok {
		return "", fmt.Errorf("secret %q is not set", name)
	}
	return v, nil
}

// runSpec is a lease of a run as the activities ask for it: labelled with
// the run and generation, under an idempotency key derived from them.
func runSpec(run string, generation int) sandbox.LeaseSpec {
	gen := strconv.Itoa(generation)
	return sandbox.LeaseSpec{
		Labels:         map[string]string{"sandboxflow-run": run, "sandboxflow-generation": gen, "sandboxflow-workflow-id": "wf-" + run},
		IdempotencyKey: "sandboxflow-" + run + "-" + gen,
	}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func TestHostedLeaseExecuteAndSweep(t *testing.T) {
	f := newHostedFake(t)
	others := []string{f.addSandbox("someone-else").id, f.addSandbox("").id, f.addSandbox("").id}
	c := newHostedClient(t, f, func(cfg *Config) { cfg.Secrets = staticSecrets{"deploy-token": "secret-value-9d"} })
	spec := runSpec("run-1", 0)
	spec.NamePrefix = "ci"
	spec.Env = map[string]string{"MODE": "test"}
	spec.SecretEnv = map[string]string{"TOKEN": "deploy-token"}
	spec.Egress = []string{"api.example.com:443"}
	spec.DiskMiB = 8192
	spec.AutoPauseAfter = 10 * time.Minute

	lease, err := c.CreateLease(t.Context(), spec)

	require.NoError(t, err)
	assert.Equal(t, sandbox.Lease{ID: "sb_4", Status: sandbox.StatusRunning, Workspace: DefaultWorkspace}, lease)
	creates := f.requests(http.MethodPost, "/sandboxes")
	require.Len(t, creates, 1)
	var body map[string]any
	require.NoError(t, json.Unmarshal(creates[0].Body, &body))
	name, _ := body["name"].(string)
	assert.Regexp(t, dnsLabel, name)
	assert.True(t, strings.HasPrefix(name, "ci--"), name)
	assert.Equal(t, createName("ci", spec.Labels, spec.IdempotencyKey), name, "the name is deterministic")
	assert.Equal(t, map[string]any{"MODE": "test", "TOKEN": "secret-value-9d"}, body["envs"], "the secret is resolved just before the create")
	assert.Equal(t, []any{"api.example.com:443"}, body["egress"])
	assert.Equal(t, 8192.0, body["disk_mib"])
	assert.Equal(t, 600.0, body["auto_pause_after_seconds"])
	for _, rq := range f.requests(http.MethodGet, "") {
		assert.NotContains(t, fmt.Sprint(rq), "secret-value-9d")
	}

	res, err := c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"echo", "hi"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, sandbox.Result{ProcessID: "proc_5", ExitCode: 0, Stdout: "hosted\n"}, res)

	// A held command: its wait is answered with the running process at the
	// timeout, which is not an exit.
	f.program = func(p *hostedProc) { p.write("stdout", "held\n") }
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	held, err := c.Execute(ctx, lease, sandbox.Command{Argv: []string{"sleep", "600"}, Timeout: 50 * time.Millisecond}, nil)
	cancel()
	require.NoError(t, err)
	assert.True(t, held.TimedOut)
	assert.Equal(t, "held\n", held.Stdout)

	next, err := c.CreateLease(t.Context(), runSpec("run-1", 1))
	require.NoError(t, err)
	other, err := c.CreateLease(t.Context(), runSpec("run-2", 0))
	require.NoError(t, err)

	// The release sweep: the run's leases are found by their names.
	leases, err := c.ListLeases(t.Context(), map[string]string{"sandboxflow-run": "run-1"})
	require.NoError(t, err)
	var ids []string
	for _, l := range leases {
		ids = append(ids, l.ID)
		assert.Equal(t, "run-1", l.Labels["sandboxflow-run"])
	}
	assert.Equal(t, []string{lease.ID, next.ID}, ids)
	var offsets []string
	for _, rq := range f.requests(http.MethodGet, "/sandboxes") {
		offsets = append(offsets, rq.Query["offset"][0])
	}
	assert.Equal(t, []string{"0", "2", "4"}, offsets, "every page of 2")
	for _, l := range leases {
		require.NoError(t, c.DestroyLease(t.Context(), l.ID))
	}

	_, err = c.GetLease(t.Context(), lease.ID)
	var gone *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &gone, "a GET right after a destroy reads destroying")
	assert.Equal(t, sandbox.StatusDestroying, gone.Status)
	_, err = c.GetLease(t.Context(), lease.ID)
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, sandbox.StatusDestroyed, gone.Status)
	leases, err = c.ListLeases(t.Context(), map[string]string{"sandboxflow-run": "run-1"})
	require.NoError(t, err)
	for _, l := range leases {
		assert.True(t, l.Status.Terminal(), "%s is %s", l.ID, l.Status)
	}
	assert.Equal(t, append(others, other.ID), f.alive(), "nothing of run-1 is left; nobody else's was touched")
}

// The create's answer is lost after the sandbox was made: the same call
// finds it by its name; so does a repeat of the create (409: the name is
// taken). Nothing is left that the client does not know of.
func TestHostedLostCreateResponse(t *testing.T) {
	f := newHostedFake(t)
	other := f.addSandbox("someone-else").id
	f.answerCreate = func(w http.ResponseWriter, n int) bool {
		if n == 1 {
			loseAnswer(w)
			return true
		}
		return false
	}
	c := newHostedClient(t, f)
	spec := runSpec("run-1", 0)

	lease, err := c.CreateLease(t.Context(), spec)

	require.NoError(t, err, "found by name")
	assert.Equal(t, sandbox.Lease{ID: "sb_2", Status: sandbox.StatusRunning, Workspace: DefaultWorkspace}, lease,
		"the sandbox whose answer was lost")
	// net/http itself may send the POST again on the reused connection (it
	// carries an Idempotency-Key); the hosted service ignores the key, and
	// the taken name (409) leads to the same lookup.
	posts := len(f.requests(http.MethodPost, "/sandboxes"))
	assert.Equal(t, []string{other, lease.ID}, f.alive())

	// The activity's retry, had the first attempt given up before it
	// looked: the name is taken, and finding it is the answer.
	again, err := c.CreateLease(t.Context(), spec)
	require.NoError(t, err)
	assert.Equal(t, lease.ID, again.ID)
	assert.Len(t, f.requests(http.MethodPost, "/sandboxes"), posts+1)
	assert.Equal(t, []string{other, lease.ID}, f.alive(), "no second sandbox")

	leases, err := c.ListLeases(t.Context(), map[string]string{"sandboxflow-run": "run-1"})
	require.NoError(t, err)
	require.Len(t, leases, 1)
	require.NoError(t, c.DestroyLease(t.Context(), leases[0].ID))
	assert.Equal(t, []string{other}, f.alive(), "nothing leaked")
}

// The hosted service holds a create until the sandbox runs; one that
// outlasts CreateTimeout is given up, and the sandbox, still booting, is
// found by its name and waited for.
func TestHostedCreateOutlastsItsBudget(t *testing.T) {
	f := newHostedFake(t)
	booting, lookedUp := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.boot = func(*hostedSandbox) {
		close(booting)
		<-lookedUp // the boot ends only once the client gave up and looks
	}
	f.listed = func() {
		select {
		case <-booting:
			once.Do(func() { close(lookedUp) })
		default:
		}
	}
	c := newHostedClient(t, f, func(cfg *Config) { cfg.CreateTimeout = 50 * time.Millisecond })

	lease, err := c.CreateLease(t.Context(), runSpec("run-1", 0))

	require.NoError(t, err)
	assert.Equal(t, sandbox.StatusRunning, lease.Status)
	assert.Len(t, f.requests(http.MethodPost, "/sandboxes"), 1)
	assert.Equal(t, []string{lease.ID}, f.alive())
}

// A name that the lookup finds destroyed is a gone lease, naming the
// sandbox, so that the caller creates the next one under another key (and
// so another name), as activities.create does.
func TestHostedNameOfAGoneSandbox(t *testing.T) {
	for _, hideGone := range []bool{false, true} {
		t.Run(fmt.Sprintf("gone ones listed: %v", !hideGone), func(t *testing.T) { nameOfAGoneSandbox(t, hideGone) })
	}
}

func nameOfAGoneSandbox(t *testing.T, hideGone bool) {
	f := newHostedFake(t)
	f.hideGone = hideGone
	spec := runSpec("run-1", 0)
	gone := f.addSandbox(createName("", spec.Labels, spec.IdempotencyKey))
	gone.status = "destroyed"
	c := newHostedClient(t, f)

	_, err := c.CreateLease(t.Context(), spec)

	var goneErr *sandbox.LeaseGoneError
	require.ErrorAs(t, err, &goneErr)
	assert.Equal(t, sandbox.LeaseGoneError{LeaseID: gone.id, Status: sandbox.StatusDestroyed}, *goneErr)

	spec.IdempotencyKey += "/" + gone.id
	lease, err := c.CreateLease(t.Context(), spec)
	require.NoError(t, err)
	assert.NotEqual(t, gone.id, lease.ID)
}

func TestHostedFailures(t *testing.T) {
	t.Run("no credit", func(t *testing.T) {
		f := newHostedFake(t)
		f.failCreate = func(w http.ResponseWriter, n int) bool {
			hostedFail(w, http.StatusPaymentRequired, "INSUFFICIENT_CREDIT")
			return true
		}
		c := newHostedClient(t, f)

		_, err := c.CreateLease(t.Context(), runSpec("run-1", 0))

		var payment *sandbox.PaymentRequiredError
		require.ErrorAs(t, err, &payment)
		assert.Equal(t, sandbox.PaymentRequiredError{Operation: "create sandbox", Code: "INSUFFICIENT_CREDIT", RequestID: "req-1"}, *payment)
		assert.Equal(t, "create sandbox: HTTP 402 payment required INSUFFICIENT_CREDIT (request req-1)", err.Error())
		assert.False(t, sandbox.Retryable(err))
		assert.Len(t, f.requests(http.MethodPost, "/sandboxes"), 1)
		assert.Empty(t, f.requests(http.MethodGet, "/sandboxes"), "402 proves nothing was created: no lookup")
		assert.Empty(t, f.alive())
	})
	t.Run("no capacity, then capacity", func(t *testing.T) {
		f := newHostedFake(t)
		f.failCreate = func(w http.ResponseWriter, n int) bool {
			if n > 2 {
				return false
			}
			w.Header().Set("Retry-After", "0")
			hostedFail(w, []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}[n-1], "NO_CAPACITY")
			return true
		}
		c := newHostedClient(t, f, func(cfg *Config) {})
		c.retryBase = time.Hour // only Retry-After lets the repeats happen

		lease, err := c.CreateLease(t.Context(), runSpec("run-1", 0))

		require.NoError(t, err)
		assert.Len(t, f.requests(http.MethodPost, "/sandboxes"), 3, "429 and 503 mean the server did not process the create")
		assert.Equal(t, []string{lease.ID}, f.alive())
	})
	t.Run("unknown sandbox", func(t *testing.T) {
		f := newHostedFake(t)
		c := newHostedClient(t, f)

		_, err := c.GetLease(t.Context(), "sb_404")

		var gone *sandbox.LeaseGoneError
		require.ErrorAs(t, err, &gone)
	})
}

func TestHostedStates(t *testing.T) {
	f := newHostedFake(t)
	c := newHostedClient(t, f)
	for status, gone := range map[string]bool{
		"creating": false, "running": false, "pausing": false, "paused": false, "resuming": false,
		"forking": false, "error": false, "failed": true, "destroying": true, "destroyed": true,
	} {
		sb := f.addSandbox("")
		sb.status = status
		lease, err := c.GetLease(t.Context(), sb.id)
		if gone {
			var goneErr *sandbox.LeaseGoneError
			require.ErrorAs(t, err, &goneErr, status)
			assert.Equal(t, sandbox.LeaseStatus(status), goneErr.Status)
			continue
		}
		require.NoError(t, err, status)
		assert.Equal(t, sandbox.LeaseStatus(status), lease.Status)
	}
}

// A lease this client did not create has no staging directory, and the
// hosted service does not make a file's parents: the upload is refused,
// the directory made, and the upload sent again.
func TestHostedStagingDirectoryOfALeaseCreatedElsewhere(t *testing.T) {
	f := newHostedFake(t)
	sb := f.addSandbox("made-elsewhere")
	f.program = func(p *hostedProc) { p.write("stdout", "ok\n"); p.exitWith(0) }
	c := newHostedClient(t, f)
	lease, err := c.GetLease(t.Context(), sb.id)
	require.NoError(t, err)

	res, err := c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"cat"}, Stdin: []byte("in")}, nil)

	require.NoError(t, err)
	assert.Equal(t, "ok\n", res.Stdout)
	puts := f.requests(http.MethodPut, "/sandboxes/"+sb.id+"/files")
	require.Len(t, puts, 2, "the stdin twice (refused, then sent)")
	assert.Equal(t, puts[0].Query["path"], puts[1].Query["path"])
	execs := f.requests(http.MethodPost, "/sandboxes/"+sb.id+"/exec")
	require.NotEmpty(t, execs)
	assert.Contains(t, string(execs[0].Body), `"mkdir"`)
}
