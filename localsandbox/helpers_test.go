package localsandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const testKey = "test-key-0123456789"

// testServer is a real server on a loopback port, shut down (and checked
// for leaks) when the test ends.
type testServer struct {
	t    testing.TB
	srv  *Server
	base string // http://127.0.0.1:port/v1
	root string
}

// startServer starts a server with opts (an API key, a fresh root and a
// quiet test logger unless set). At cleanup it shuts the server down and
// fails the test if any process of its root is still alive or a workspace
// is left.
func startServer(t testing.TB, opts Options) *testServer {
	t.Helper()
	if opts.APIKey == "" && !opts.InsecureNoAuth {
		opts.APIKey = testKey
	}
	if opts.Root == "" {
		opts.Root = filepath.Join(t.TempDir(), "root")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ts := &testServer{t: t, srv: srv, base: "http://" + ln.Addr().String() + "/v1", root: opts.Root}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
		assertNoProcesses(t, opts.Root)
		if entries, _ := os.ReadDir(filepath.Join(opts.Root, leasesDir)); len(entries) > 0 {
			t.Errorf("%d lease directories left after Shutdown", len(entries))
		}
	})
	return ts
}

// assertNoProcesses fails the test if any process of root is alive.
func assertNoProcesses(t testing.TB, root string) {
	t.Helper()
	pids, err := SandboxProcesses(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) > 0 {
		t.Errorf("processes left behind: %v", pids)
	}
}

// request sends a request with the test key and returns the response.
func (ts *testServer) request(method, path string, body io.Reader, header http.Header) *http.Response {
	ts.t.Helper()
	req, err := http.NewRequest(method, ts.base+path, body)
	if err != nil {
		ts.t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", testKey)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// call sends body (JSON-encoded unless it is a string, sent as is) and
// decodes the data of a success envelope into out. It returns the status.
func (ts *testServer) call(method, path string, body any, out any) int {
	ts.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			ts.t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	resp := ts.request(method, path, r, nil)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("X-Request-Id") == "" {
		ts.t.Errorf("%s %s: %d without an X-Request-Id", method, path, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		if !isFailureEnvelope(resp, raw) {
			ts.t.Errorf("%s %s: %d without a JSend failure envelope: %q", method, path, resp.StatusCode, raw)
		}
		return resp.StatusCode
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &env); err != nil || env.Status != "success" || len(env.Data) == 0 || env.Data[0] != '{' {
		ts.t.Fatalf("%s %s: bad envelope %q", method, path, raw)
	}
	if out != nil {
		if err := json.Unmarshal(env.Data, out); err != nil {
			ts.t.Fatalf("%s %s: decoding %s: %v", method, path, env.Data, err)
		}
	}
	return resp.StatusCode
}

// isFailureEnvelope reports whether a failure answered the JSend envelope
// of its status: a 4xx {"status":"fail","data":{"code","message"}}, a 5xx
// {"status":"error","message","code":<status>}, as JSON.
func isFailureEnvelope(resp *http.Response, raw []byte) bool {
	var env struct {
		Status  string
		Message string
		Code    int
		Data    struct{ Code, Message string }
	}
	if resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(raw, &env) != nil {
		return false
	}
	if resp.StatusCode >= 500 {
		return env.Status == "error" && env.Message != "" && env.Code == resp.StatusCode
	}
	return env.Status == "fail" && env.Data.Code != "" && env.Data.Message != ""
}

// mustCall is call that fails the test unless the status is 200.
func (ts *testServer) mustCall(method, path string, body any, out any) {
	ts.t.Helper()
	if status := ts.call(method, path, body, out); status != http.StatusOK {
		ts.t.Fatalf("%s %s: HTTP %d", method, path, status)
	}
}

type sandboxData struct {
	ID        string            `json:"id"`
	Status    string            `json:"status"`
	Rootfs    string            `json:"rootfs"`
	Labels    map[string]string `json:"labels"`
	Workspace string            `json:"workspace"`
	Isolation string            `json:"isolation"`
	Limits    struct {
		MemoryEnforced bool `json:"memory_enforced"`
	} `json:"limits"`
}

// createLease creates a sandbox and returns its id.
func (ts *testServer) createLease() string {
	ts.t.Helper()
	var sb sandboxData
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "ingress_enabled": false}, &sb)
	if sb.Status != "running" {
		ts.t.Fatalf("new sandbox is %q", sb.Status)
	}
	return sb.ID
}

// startProcess starts `bash -c script` in the lease and returns its id.
func (ts *testServer) startProcess(lease, script string) string {
	ts.t.Helper()
	var out struct {
		ProcessID string `json:"process_id"`
	}
	ts.mustCall("POST", "/sandboxes/"+lease+"/processes", map[string]any{"cmd": "/bin/bash", "args": []string{"-c", script}}, &out)
	return out.ProcessID
}

// exec runs `bash -c script` as a one-shot exec.
func (ts *testServer) exec(lease, script string) execResult {
	ts.t.Helper()
	var out struct{ Result execResult }
	ts.mustCall("POST", "/sandboxes/"+lease+"/exec", map[string]any{"cmd": "/bin/bash", "args": []string{"-c", script}}, &out)
	return out.Result
}

type execResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Signal   string `json:"signal"`
}

// event is a frame of a connect stream.
type event struct {
	Type       string `json:"type"`
	Seq        int64  `json:"seq"`
	Stream     string `json:"stream"`
	DataBase64 string `json:"data_base64"`
	ExitCode   *int   `json:"exit_code"`
	Signal     string `json:"signal"`
	Error      string `json:"error"`
}

// stream is an open connect stream.
type stream_ struct {
	t    testing.TB
	resp *http.Response
	sc   *bufio.Scanner
}

// connect opens the output stream of a process after seq after; it fails
// the test unless the answer is 200.
func (ts *testServer) connect(lease, pid string, after int64) *stream_ {
	ts.t.Helper()
	resp := ts.request("GET", fmt.Sprintf("/sandboxes/%s/processes/%s/connect?after=%d", lease, pid, after), nil, nil)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		ts.t.Fatalf("connect: HTTP %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		ts.t.Errorf("connect Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 2<<20)
	st := &stream_{t: ts.t, resp: resp, sc: sc}
	ts.t.Cleanup(func() { resp.Body.Close() })
	return st
}

// next returns the next frame, skipping heartbeats unless keepHB; ok is
// false at the end of the stream.
func (st *stream_) next(keepHB bool) (event, bool) {
	st.t.Helper()
	for st.sc.Scan() {
		var ev event
		if err := json.Unmarshal(st.sc.Bytes(), &ev); err != nil {
			st.t.Fatalf("bad frame %q: %v", st.sc.Bytes(), err)
		}
		if ev.Type == "heartbeat" && !keepHB {
			continue
		}
		return ev, true
	}
	return event{}, false
}

// output is what a stream carried until its end.
type output struct {
	stdout, stderr bytes.Buffer
	order          []string // "stdout:..." / "stderr:..." per frame
	last           event    // the final exit or error frame
	newestSeq      int64
}

// drain reads a stream to its end, checking sequence numbers.
func (st *stream_) drain(after int64) output {
	st.t.Helper()
	var out output
	cursor := after
	for {
		ev, ok := st.next(false)
		if !ok {
			st.t.Fatalf("stream ended without an exit or error frame")
		}
		switch ev.Type {
		case "data":
			if ev.Seq != cursor+1 {
				st.t.Fatalf("seq %d after %d", ev.Seq, cursor)
			}
			cursor = ev.Seq
			data, err := base64.StdEncoding.Strict().DecodeString(ev.DataBase64)
			if err != nil {
				st.t.Fatalf("bad base64: %v", err)
			}
			if ev.Stream == "stdout" {
				out.stdout.Write(data)
			} else if ev.Stream == "stderr" {
				out.stderr.Write(data)
			} else {
				st.t.Fatalf("stream %q", ev.Stream)
			}
			out.order = append(out.order, ev.Stream+":"+string(data))
		case "exit", "error":
			out.last = ev
			out.newestSeq = cursor
			if _, more := st.next(true); more {
				st.t.Fatalf("frames after the %s frame", ev.Type)
			}
			return out
		default:
			st.t.Fatalf("unexpected frame %+v", ev)
		}
	}
}

// run starts script as a managed process and follows it to its end.
func (ts *testServer) run(lease, script string) output {
	ts.t.Helper()
	pid := ts.startProcess(lease, script)
	if status := ts.call("POST", "/sandboxes/"+lease+"/processes/"+pid+"/stdin/close", nil, nil); status != http.StatusOK {
		ts.t.Errorf("stdin/close: %d", status)
	}
	return ts.connect(lease, pid, 0).drain(0)
}

// waitTree waits for the process tree with wait?scope=tree; at the timeout
// the answer is the process as it is (tree_exited false).
func (ts *testServer) waitTree(lease, pid string, timeout time.Duration) (waitData, int) {
	ts.t.Helper()
	var w waitData
	status := ts.call("GET", fmt.Sprintf("/sandboxes/%s/processes/%s/wait?scope=tree&timeout_ms=%d", lease, pid, timeout.Milliseconds()), nil, &w)
	return w, status
}

type waitData struct {
	ExitCode *int   `json:"exit_code"`
	Signal   string `json:"signal"`
	Output   struct {
		NewestSeq int64 `json:"newest_seq"`
	} `json:"output"`
	State        string `json:"state"`
	LeaderExited bool   `json:"leader_exited"`
	TreeExited   bool   `json:"tree_exited"`
}

// putFile uploads content to path in the lease and returns the status.
func (ts *testServer) putFile(lease, path, content string) int {
	ts.t.Helper()
	resp := ts.request("PUT", "/sandboxes/"+lease+"/files?path="+url.QueryEscape(path), strings.NewReader(content), nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// getFile downloads path from the lease.
func (ts *testServer) getFile(lease, path string) (string, int) {
	ts.t.Helper()
	resp := ts.request("GET", "/sandboxes/"+lease+"/files?path="+url.QueryEscape(path), nil, nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// gated prefixes script with a wait for /workspace/gate (removed when
// passed), as the protocol's clients do: a command that starts only once
// its reader is attached.
func gated(script string) string {
	return `until [ -e /workspace/gate ]; do sleep 0.005; done; rm /workspace/gate; ` + script
}

// openGate lets a gated command start.
func (ts *testServer) openGate(lease string) {
	ts.t.Helper()
	if status := ts.putFile(lease, "/workspace/gate", ""); status != http.StatusOK {
		ts.t.Fatalf("gate upload: %d", status)
	}
}

// leaseIDs returns the host uid and gid of the lease's root.
func (ts *testServer) leaseIDs(lease string) (uid, gid int) {
	ts.t.Helper()
	ts.srv.mu.Lock()
	defer ts.srv.mu.Unlock()
	l := ts.srv.leases[lease]
	if l == nil {
		ts.t.Fatalf("no lease %s", lease)
	}
	return l.uid, l.gid
}

// leaseInit returns the host pid of the lease's init.
func (ts *testServer) leaseInit(lease string) int {
	ts.t.Helper()
	ts.srv.mu.Lock()
	l := ts.srv.leases[lease]
	ts.srv.mu.Unlock()
	if l == nil || l.machine == nil {
		ts.t.Fatalf("lease %s has no init", lease)
	}
	return l.machine.Pid()
}

// freezerState reads the lease's cgroup v1 freezer state ("" without one).
func (ts *testServer) freezerState(lease string) string {
	for _, dir := range ts.srv.limiter.Dirs(lease) {
		if b, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

// status returns the sandbox's status.
func (ts *testServer) status(lease string) string {
	ts.t.Helper()
	var sb sandboxData
	ts.mustCall("GET", "/sandboxes/"+lease, nil, &sb)
	return sb.Status
}

// limitedBuffer keeps the first max bytes written to it, for concurrent
// writers (a server's log, a child's stderr).
type limitedBuffer struct {
	mu  sync.Mutex
	buf *bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
