package createos

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/require"
)

// fakeServer is a CreateOS server for tests. By default it implements the
// protocol's semantics in memory: sandboxes, files, one-shot exec, and
// managed processes whose output journal is streamed as NDJSON. A process
// "runs" when its start gate opens — its token's line is written to its
// stdin, or, for a script of an earlier version (newLegacyProc), its gate
// file is written: the server then calls program, which writes output and
// exits (or not) through the *fakeProc.
//
// Each test scripts what it needs on top with hooks (see on) and checks
// afterwards what the client asked (see requests, routes).
type fakeServer struct {
	t       testing.TB
	srv     *httptest.Server
	mux     *http.ServeMux
	routeOf map[string]string // mux pattern → route name

	mu        sync.Mutex
	log       []fakeRequest
	calls     map[string]int
	hooks     map[string]fakeHook
	sandboxes map[string]*fakeSandbox
	byIdemKey map[string]string
	nextID    int
	closed    chan struct{}

	// Set before the first request.
	program       func(p *fakeProc) // runs when a process's gate opens; nil: exit 0
	creatingPolls int               // GETs for which a new sandbox stays "creating"
	workspace     string            // reported as data.workspace when not empty
}

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
	id, status string
	labels     map[string]string
	forkedFrom string
	egress     []string
	polls      int // GETs left in "creating"
	files      map[string][]byte
	procs      map[string]*fakeProc
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

func newFakeServer(t testing.TB) *fakeServer {
	f := &fakeServer{
		t:         t,
		mux:       http.NewServeMux(),
		routeOf:   map[string]string{},
		calls:     map[string]int{},
		hooks:     map[string]fakeHook{},
		sandboxes: map[string]*fakeSandbox{},
		byIdemKey: map[string]string{},
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
		{"POST /v1/sandboxes/{sb}/pause", "pause", f.transition("paused")},
		{"POST /v1/sandboxes/{sb}/resume", "resume", f.transition("running")},
		{"POST /v1/sandboxes/{sb}/fork", "fork", f.fork},
		{"PUT /v1/sandboxes/{sb}/egress", "setEgress", f.setEgress},
		{"POST /v1/sandboxes/{sb}/exec", "exec", f.exec},
		{"PUT /v1/sandboxes/{sb}/files", "putFile", f.putFile},
		{"POST /v1/sandboxes/{sb}/processes", "createProcess", f.createProcess},
		{"POST /v1/sandboxes/{sb}/processes/{pid}/input", "input", f.input},
		{"GET /v1/sandboxes/{sb}/processes/{pid}/connect", "connect", f.connect},
		{"GET /v1/sandboxes/{sb}/processes/{pid}/wait", "wait", f.wait},
		{"DELETE /v1/sandboxes/{sb}/processes/{pid}", "deleteProcess", f.deleteProcess},
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
	n, hook := f.calls[route], f.hooks[route]
	f.mu.Unlock()
	if r.Header.Get("X-Api-Key") != testKey {
		fail(w, http.StatusUnauthorized)
		return
	}
	if hook != nil && hook(w, r, n) {
		return
	}
	f.mux.ServeHTTP(w, r)
}

// on scripts a route (a name of the table in newFakeServer).
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

// newLease puts a running sandbox in place without a request.
func (f *fakeServer) newLease() sandbox.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.addSandboxLocked("running", nil)
	return sandbox.Lease{ID: sb.id, Status: sandbox.StatusRunning, Workspace: DefaultWorkspace}
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

func (f *fakeServer) addSandboxLocked(status string, labels map[string]string) *fakeSandbox {
	f.nextID++
	sb := &fakeSandbox{id: "sb-" + strconv.Itoa(f.nextID), status: status, labels: labels, polls: f.creatingPolls,
		files: map[string][]byte{}, procs: map[string]*fakeProc{}}
	f.sandboxes[sb.id] = sb
	return sb
}

func (f *fakeServer) addProcLocked(sb *fakeSandbox, started bool) *fakeProc {
	f.nextID++
	p := &fakeProc{f: f, sb: sb, id: "p-" + strconv.Itoa(f.nextID), started: started, changed: make(chan struct{})}
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

// --- default semantics

func (f *fakeServer) createSandbox(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Shape  string            `json:"shape"`
		Labels map[string]string `json:"labels"`
	}
	if json.NewDecoder(r.Body).Decode(&body) != nil || body.Shape == "" {
		fail(w, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	sb := f.sandboxes[f.byIdemKey[key]]
	if key == "" || sb == nil {
		status := "running"
		if f.creatingPolls > 0 {
			status = "creating"
		}
		sb = f.addSandboxLocked(status, body.Labels)
		if key != "" {
			f.byIdemKey[key] = sb.id
		}
	}
	writeData(w, f.sandboxDataLocked(sb))
}

func (f *fakeServer) sandboxDataLocked(sb *fakeSandbox) map[string]any {
	data := map[string]any{"id": sb.id, "status": sb.status, "labels": sb.labels}
	if sb.forkedFrom != "" {
		data["forked_from"] = sb.forkedFrom
	}
	if f.workspace != "" {
		data["workspace"] = f.workspace
	}
	return data
}

func (f *fakeServer) getSandbox(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PathValue("sb")]
	if sb == nil {
		fail(w, http.StatusNotFound)
		return
	}
	if sb.status == "creating" {
		if sb.polls--; sb.polls <= 0 {
			sb.status = "running"
		}
	}
	if sb.status == "forking" {
		sb.status = "running" // after one read
	}
	writeData(w, f.sandboxDataLocked(sb))
}

func (f *fakeServer) listSandboxes(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := []map[string]any{}
	for _, sb := range f.sandboxes {
		matches := true
		for _, pair := range r.URL.Query()["label"] {
			k, v, _ := strings.Cut(pair, "=")
			if sb.labels[k] != v {
				matches = false
			}
		}
		if matches {
			list = append(list, f.sandboxDataLocked(sb))
		}
	}
	writeData(w, map[string]any{"sandboxes": list})
}

func (f *fakeServer) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PathValue("sb")]
	if sb == nil {
		fail(w, http.StatusNotFound)
		return
	}
	for _, p := range sb.procs {
		p.exitLocked(nil, "SIGKILL")
	}
	delete(f.sandboxes, sb.id)
	writeData(w, map[string]any{})
}

func (f *fakeServer) transition(to string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		sb := f.sandboxes[r.PathValue("sb")]
		if sb == nil {
			fail(w, http.StatusNotFound)
			return
		}
		sb.status = to
		writeData(w, map[string]any{})
	}
}

func (f *fakeServer) exec(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Cmd  string   `json:"cmd"`
		Args []string `json:"args"`
	}
	if json.NewDecoder(r.Body).Decode(&body) != nil {
		fail(w, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[r.PathValue("sb")]
	if sb == nil {
		fail(w, http.StatusNotFound)
		return
	}
	code := 0
	switch body.Cmd {
	case "rm": // mkdir needs nothing: directories are not modelled
		for _, name := range body.Args {
			delete(sb.files, name)
		}
	case "test": // test -e FILE
		if _, ok := sb.files[body.Args[len(body.Args)-1]]; !ok {
			code = 1
		}
	}
	writeData(w, map[string]any{"result": map[string]any{"exit_code": code, "stdout": "", "stderr": ""}})
}

func (f *fakeServer) putFile(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	name := r.URL.Query().Get("path")
	f.mu.Lock()
	sb := f.sandboxes[r.PathValue("sb")]
	if sb == nil {
		f.mu.Unlock()
		fail(w, http.StatusNotFound)
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
	writeData(w, map[string]any{})
}

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
	sb := f.sandboxes[r.PathValue("sb")]
	if sb == nil {
		fail(w, http.StatusNotFound)
		return
	}
	p := f.addProcLocked(sb, false)
	if json.NewDecoder(r.Body).Decode(&p.body) != nil {
		fail(w, http.StatusBadRequest)
		return
	}
	writeData(w, map[string]any{"process_id": p.id})
}

// proc finds the process of a request, or answers 404.
func (f *fakeServer) proc(w http.ResponseWriter, r *http.Request) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandboxes[r.PathValue("sb")]; sb != nil {
		if p := sb.procs[r.PathValue("pid")]; p != nil {
			return p
		}
	}
	fail(w, http.StatusNotFound)
	return nil
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
		fail(w, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	if p.started || p.exited() {
		f.mu.Unlock()
		fail(w, http.StatusConflict)
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

func (f *fakeServer) connect(w http.ResponseWriter, r *http.Request) {
	p := f.proc(w, r)
	if p == nil {
		return
	}
	after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	f.mu.Lock()
	evicted := after < p.evictedThrough
	f.mu.Unlock()
	if evicted {
		fail(w, http.StatusGone)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
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
	ms, _ := strconv.Atoi(r.URL.Query().Get("timeout_ms"))
	timeout := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer timeout.Stop()
	for {
		f.mu.Lock()
		exited, changed := p.exited(), p.changed
		data := map[string]any{"output": map[string]any{"newest_seq": len(p.journal)}}
		if p.signal != "" {
			data["signal"] = p.signal
		} else if p.exitCode != nil {
			data["exit_code"] = *p.exitCode
		}
		f.mu.Unlock()
		if exited {
			writeData(w, data)
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			fail(w, http.StatusRequestTimeout)
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
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.URL.Query().Get("grace_ms") == "" {
		fail(w, http.StatusBadRequest)
		return
	}
	p.exitLocked(nil, "SIGTERM")
	writeData(w, map[string]any{"tree_exited": true})
}

// --- answers and frames

// bodySecret is in every failure body: it must never reach an error.
const bodySecret = "body-secret-7e1f"

func fail(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"status":"error","error":%q}`, bodySecret)
}

func writeData(w http.ResponseWriter, data any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
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

// newTestClient returns a Client of f with test-fast reconnects and polls.
func newTestClient(t testing.TB, f *fakeServer, configure ...func(*Config)) *Client {
	cfg := Config{BaseURL: f.srv.URL, APIKey: testKey}
	for _, c := range configure {
		c(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	c.reconnectDelay = time.Millisecond
	c.pollInterval = time.Millisecond
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
