package localsandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

func TestAuthIsRequired(t *testing.T) {
	if _, err := New(Options{Root: t.TempDir()}); err == nil {
		t.Fatal("New without a key or InsecureNoAuth succeeded")
	}
	ts := startServer(t, Options{})
	origin := strings.TrimSuffix(ts.base, "/v1")
	get := func(url, key string) (int, []byte) {
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK && !isFailureEnvelope(resp, body) {
			t.Errorf("GET %s: %d without a failure envelope: %s", url, resp.StatusCode, body)
		}
		return resp.StatusCode, body
	}
	for _, key := range []string{"", "zz-other-key", testKey + "x", testKey[:len(testKey)-1]} {
		for _, path := range []string{"/v1/sandboxes", "/v1/whoami", "/v1/sandboxes/sb-x", "/v1/nowhere", "/healthz/x", "/v1/shapes/"} {
			status, body := get(origin+path, key)
			if status != http.StatusUnauthorized {
				t.Errorf("key %q, %s: %d, want 401", key, path, status)
			}
			if key != "" && strings.Contains(string(body), key) {
				t.Errorf("the 401 echoes the key: %s", body)
			}
		}
		// Health and the catalog are public: what any key (or none) gets.
		for _, path := range []string{"/healthz", "/readyz", "/v1/shapes", "/v1/rootfs"} {
			if status, body := get(origin+path, key); status != http.StatusOK {
				t.Errorf("key %q, public %s: %d %s", key, path, status, body)
			}
		}
	}
	var shapes struct {
		Data       []shapeView
		Pagination struct{ Total, Limit, Offset, Count int }
	}
	ts.mustCall("GET", "/shapes", nil, &shapes)
	if len(shapes.Data) != 11 || shapes.Pagination.Total != 11 || shapes.Pagination.Count != 11 || shapes.Pagination.Limit != 50 ||
		shapes.Data[0] != (shapeView{ID: "s-1vcpu-256mb", VCPU: 1, MemMiB: 256, DefaultDiskMiB: DefaultDiskMiB}) ||
		shapes.Data[1] != (shapeView{ID: "s-0.25vcpu-512mb", VCPU: 1, MemMiB: 512, DefaultDiskMiB: DefaultDiskMiB, CPUQuotaPct: 25}) {
		t.Errorf("shapes %+v", shapes)
	}
	ts.mustCall("GET", "/shapes?limit=2&offset=10", nil, &shapes)
	if len(shapes.Data) != 1 || shapes.Data[0].ID != "s-8vcpu-16gb" || shapes.Pagination.Total != 11 || shapes.Pagination.Count != 1 {
		t.Errorf("the last page of shapes %+v", shapes)
	}
}

func TestNoAuthOnlyOnLoopback(t *testing.T) {
	srv, err := New(Options{InsecureNoAuth: true, Root: filepath.Join(t.TempDir(), "root"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		testenv.Missing(t, fmt.Sprint("cannot listen on a non-loopback address: ", err))
	}
	defer ln.Close()
	if err := srv.Serve(ln); err == nil || !strings.Contains(err.Error(), "without an API key") {
		t.Errorf("Serve on %s without a key: %v", ln.Addr(), err)
	}
}

func TestBadInputIsA4xxAndStartsNothing(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `cat`)
	proc := "/sandboxes/" + lease + "/processes/" + pid
	long := strings.Repeat("a", 201)
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/sandboxes", "{", 400},
		{"POST", "/sandboxes", "[]", 400},
		{"POST", "/sandboxes", `{"shape":5}`, 400},
		{"POST", "/sandboxes", `{"shape":"s-99vcpu"}`, 400},
		{"POST", "/sandboxes", `{"egress":["host:0"]}`, 400},
		{"POST", "/sandboxes", `{"labels":{"a=b":"c"}}`, 400},
		{"POST", "/sandboxes", `{"labels":{"k":1}}`, 400},
		{"POST", "/sandboxes", `{} {}`, 400},
		{"POST", "/sandboxes", `{"labels":{"k":"` + strings.Repeat("v", 2<<20) + `"}}`, 413},
		{"GET", "/sandboxes/bad.id", "", 400},
		{"GET", "/sandboxes/" + long, "", 400},
		{"GET", "/sandboxes/sb-unknown", "", 404},
		{"DELETE", "/sandboxes/sb-unknown", "", 404},
		{"GET", "/sandboxes?label=novalue", "", 400},
		{"GET", "/nowhere", "", 404},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":""}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":"true","args":"x"}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":"true","env":{"A=":"b"}}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":"true","env":{"A":"\u0000"}}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":"true","pty":{"rows":24,"cols":1001}}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"pty":{}}`, 400},
		{"POST", "/sandboxes", `{"envs":{"1A":"b"}}`, 400},
		{"POST", "/sandboxes", `{"name":"has space"}`, 400},
		{"POST", "/sandboxes", `{"region":"us-east-1"}`, 400},
		{"POST", "/sandboxes", `{"ssh_pubkeys":["ssh-ed25519 AAAA"]}`, 400},
		{"POST", "/sandboxes", `{"networks":[{"id":"net-1"}]}`, 400},
		{"POST", "/sandboxes", `{"disks":[{"disk_id":"d","mount_path":"/mnt"}]}`, 400},
		{"POST", "/sandboxes", `{"node_selector":{"zone":"a"}}`, 400},
		{"POST", "/sandboxes", `{"host_id":"h-1"}`, 400},
		{"POST", "/sandboxes", `{"bandwidth_quota_bytes":1}`, 400},
		{"POST", "/sandboxes", `{"rootfs":"ubuntu:24.04"}`, 400},
		{"GET", "/sandboxes?status=bogus", "", 400},
		{"GET", "/sandboxes?limit=-1", "", 400},
		{"GET", "/sandboxes?offset=x", "", 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":"a\u0000b"}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":"true","args":["\u0000"]}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", `{"cmd":"true","stdin":"x"}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes", ``, 400},
		{"POST", "/sandboxes/sb-unknown/processes", `{"cmd":"true"}`, 404},
		{"POST", "/sandboxes/" + lease + "/exec", `{"cmd":""}`, 400},
		{"POST", "/sandboxes/" + lease + "/exec", `{"cmd":"true","env":{"":"x"}}`, 400},
		{"POST", "/sandboxes/" + lease + "/processes/" + pid + "/resize", `{"rows":0,"cols":1}`, 400},
		{"GET", proc + "/connect?after=-1", "", 400},
		{"GET", proc + "/connect?after=abc", "", 400},
		{"GET", proc + "/connect?after=1&after=2", "", 400},
		{"GET", "/sandboxes/" + lease + "/processes/proc-unknown/connect", "", 404},
		{"GET", "/sandboxes/" + lease + "/processes/a%20b/connect", "", 400},
		{"GET", proc + "/wait?timeout_ms=99999999999", "", 400},
		{"GET", proc + "/wait?scope=bogus", "", 400},
		{"DELETE", proc + "?grace_ms=soon", "", 400},
		{"POST", proc + "/input", `{"data_base64":"!!"}`, 400},
		{"POST", proc + "/input", `{"data_base64":"YQ"}`, 400},
		{"POST", proc + "/input", `{}`, 400},
		{"POST", proc + "/input", `{"data_base64":"` + strings.Repeat("AAAA", 100<<10) + `"}`, 413},
		{"POST", proc + "/signal", `{"signal":"SIGBOGUS"}`, 400},
		{"PUT", "/sandboxes/" + lease + "/files", "x", 400},
	} {
		if got := ts.call(tc.method, tc.path, tc.body, nil); got != tc.want {
			t.Errorf("%s %s %.40q: %d, want %d", tc.method, tc.path, tc.body, got, tc.want)
		}
	}
	resp := ts.request("POST", "/sandboxes", strings.NewReader(`{}`), http.Header{"Idempotency-Key": {"has space"}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad Idempotency-Key: %d, want 400", resp.StatusCode)
	}
	if st, _ := ts.srv.Stats(); st.Leases != 1 || st.ProcessesStarted != 1 {
		t.Errorf("stats %+v: bad input started something", st)
	}
	if h := ts.srv.History(); len(h) != 1 {
		t.Errorf("history has %d records, want the one process", len(h))
	}
}

func TestPanicInAHandlerIsA500(t *testing.T) {
	ts := startServer(t, Options{})
	h := ts.srv.withRecover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/x", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"status":"error"`) {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}

func TestIdempotentCreate(t *testing.T) {
	ts := startServer(t, Options{})
	body := `{"shape":"s-1vcpu-1gb","ingress_enabled":false,"labels":{"workflow":"w1"}}`
	create := func(key, body string) (string, int) {
		resp := ts.request("POST", "/sandboxes", strings.NewReader(body), http.Header{"Idempotency-Key": {key}})
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		id := ""
		if i := strings.Index(string(raw), `"id":"`); i >= 0 {
			id = string(raw[i+6:])
			id = id[:strings.IndexByte(id, '"')]
		}
		return id, resp.StatusCode
	}
	ids := make([]string, 10)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() { ids[i], _ = create("key-1", body) })
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("concurrent creates with one key gave %q", ids)
		}
	}
	if id, _ := create("key-2", body); id == ids[0] || id == "" {
		t.Errorf("another key gave %q", id)
	}
	if _, status := create("key-1", `{"shape":"s-2vcpu-2gb"}`); status != http.StatusUnprocessableEntity {
		t.Errorf("key reused for another request: %d, want 422", status)
	}
	if st, _ := ts.srv.Stats(); st.Leases != 2 {
		t.Errorf("%d leases, want 2", st.Leases)
	}
	ts.mustCall("DELETE", "/sandboxes/"+ids[0], nil, nil)
	if id, status := create("key-1", body); id != ids[0] || status != http.StatusOK {
		t.Errorf("after destroy, the key gives %q %d; want the same, destroyed sandbox", id, status)
	}
}

func TestListByLabelAndSandboxData(t *testing.T) {
	ts := startServer(t, Options{})
	make := func(labels map[string]string) string {
		var sb sandboxData
		ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "labels": labels}, &sb)
		return sb.ID
	}
	a := make(map[string]string{"wf": "1", "attempt": "1"})
	b := make(map[string]string{"wf": "1", "attempt": "2"})
	c := make(nil)
	list := func(query string) []string {
		var out struct{ Data []sandboxData }
		ts.mustCall("GET", "/sandboxes"+strings.Replace(query, "?", "?limit=500&", 1), nil, &out)
		var ids []string
		for _, sb := range out.Data {
			if sb.Status != "running" || sb.Workspace != "/workspace" || sb.Labels == nil {
				t.Errorf("listed %+v", sb)
			}
			ids = append(ids, sb.ID)
		}
		return ids
	}
	for query, want := range map[string][]string{
		"?label=wf=1":                  {a, b},
		"?label=wf=1&label=attempt=2":  {b},
		"?label=wf=2":                  nil,
		"?label=wf=1&label=wf=2":       nil,
		"":                             {a, b, c},
		"?label=attempt=1&label=wf=1":  {a},
		"?label=" + "wf%3D1":           {a, b},
		"?label=nothing=&label=wf=1":   nil,
		"?label=attempt=1&label=nop=x": nil,
	} {
		if got := list(query); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: %v, want %v", query, got, want)
		}
	}
	var sb sandboxData
	ts.mustCall("GET", "/sandboxes/"+a, nil, &sb)
	if sb.ID != a || sb.Status != "running" || sb.Workspace != "/workspace" || sb.Isolation != "namespaces" ||
		sb.Labels["attempt"] != "1" || sb.Limits.MemoryEnforced != ts.srv.enforcedLimits().Memory {
		t.Errorf("GET sandbox: %+v", sb)
	}
}

func TestDestroyKillsEverythingAndRemovesTheWorkspace(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	ts.startProcess(lease, `sleep 1000`)
	ts.startProcess(lease, doubleFork)
	ts.putFile(lease, "/workspace/file", "x")
	dir := filepath.Join(ts.root, leasesDir, lease)
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
	if st, _ := ts.srv.Stats(); st.Processes != 0 || st.Leases != 0 {
		t.Errorf("stats after destroy %+v", st)
	}
	assertNoProcesses(t, ts.root)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the lease directory is still there: %v", err)
	}
	// It reads as destroyed (for a while), and a destroy again is what it
	// was; everything else about it is gone.
	var gone struct{ ID, Status string }
	if ts.mustCall("DELETE", "/sandboxes/"+lease, nil, &gone); gone.ID != lease || gone.Status != "destroyed" {
		t.Errorf("second destroy: %+v", gone)
	}
	if ts.mustCall("GET", "/sandboxes/"+lease, nil, &gone); gone.ID != lease || gone.Status != "destroyed" {
		t.Errorf("GET after destroy: %+v", gone)
	}
	for _, path := range []string{"/pause", "/exec", "/processes", "/egress"} {
		if status := ts.call("POST", "/sandboxes/"+lease+path, `{"cmd":"true"}`, nil); status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			t.Errorf("POST %s after destroy: %d, want 404", path, status)
		}
	}
	if h := ts.srv.History(); len(h) != 2 || h[0].LeaseID != lease || h[0].End.IsZero() || h[0].Signal != "SIGKILL" {
		t.Errorf("history after destroy: %+v", h)
	}
}

func TestExecPlainAndStreamed(t *testing.T) {
	ts := startServer(t, Options{HeartbeatInterval: 10 * time.Millisecond})
	lease := ts.createLease()
	r := ts.exec(lease, `echo out; echo err >&2; exit 5`)
	if r.ExitCode != 5 || r.Stdout != "out\n" || r.Stderr != "err\n" {
		t.Errorf("exec: %+v", r)
	}
	r = ts.exec(lease, `kill -KILL $$`)
	if r.ExitCode != 137 || r.Signal != "SIGKILL" {
		t.Errorf("exec killed: %+v", r)
	}
	// A daemon outlives its exec, as on a machine: it belongs to the lease
	// until the lease is destroyed. (Before leases had an init of their
	// own, nothing outlived an exec.)
	ts.exec(lease, `(setsid sleep 1000 &); echo started`)
	if st, _ := ts.srv.Stats(); st.Processes != 1 {
		t.Errorf("%d processes after an exec that left a daemon, want 1", st.Processes)
	}

	// "€" is 3 bytes; printf writes them in two pieces, with a pause in
	// between (while the stream sends heartbeats).
	resp := ts.request("POST", "/sandboxes/"+lease+"/exec?stream=true", strings.NewReader(
		`{"cmd":"/bin/bash","args":["-c","read x; echo \"$x\"; printf '\\342'; sleep 0.1; printf '\\202\\254'; echo oops >&2; exit 3"],"stream":true,"stdin":"from stdin\n"}`), nil)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var text strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if line != `{"hb":true}` {
			text.WriteString(line + "\n")
		}
	}
	want := `{"stdout":"from stdin\n"}` + "\n" + `{"stdout":"€"}` + "\n" + `{"stderr":"oops\n"}` + "\n" + `{"exit_code":3}` + "\n"
	if text.String() != want {
		t.Errorf("stream:\n%s\nwant:\n%s", text.String(), want)
	}
	if !strings.Contains(string(raw), `{"hb":true}`) {
		t.Errorf("no heartbeat while the command paused")
	}
}

func TestShutdownBreaksStreamsAndKillsEverything(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `echo up; sleep 1000`)
	st := ts.connect(lease, pid, 0)
	if ev, _ := st.next(false); ev.Type != "data" {
		t.Fatalf("frame %+v", ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ts.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// The server went away with the process: the stream breaks instead of
	// claiming that the command was killed.
	for {
		ev, ok := st.next(true)
		if !ok {
			break
		}
		if ev.Type == "exit" {
			t.Errorf("the open stream ended with an exit frame %+v after Shutdown", ev)
		}
	}
	assertNoProcesses(t, ts.root)
	if _, err := os.Stat(filepath.Join(ts.root, leasesDir, lease)); !os.IsNotExist(err) {
		t.Errorf("workspace left after Shutdown: %v", err)
	}
	resp, err := http.Get(ts.base + "/shapes")
	if err == nil {
		resp.Body.Close()
		t.Errorf("the server still answers after Shutdown: %d", resp.StatusCode)
	}
}
