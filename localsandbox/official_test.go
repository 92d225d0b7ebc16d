package localsandbox

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The official shapes of docs/CREATEOS-API.md, as sandboxd serves them. The
// official TypeScript SDK drives them too (officialsdk_test.go); these
// tests pin what it does not look at.

// officialView is the SandboxView of docs/CREATEOS-API.md §3.2 (and the create
// answer's extra fields).
type officialView struct {
	ID                  string    `json:"id"`
	Status              string    `json:"status"`
	Name                string    `json:"name"`
	IP                  string    `json:"ip"`
	VCPU                int       `json:"vcpu"`
	MemMiB              int       `json:"mem_mib"`
	DiskMiB             int       `json:"disk_mib"`
	CreatedAt           time.Time `json:"created_at"`
	RunningAt           time.Time `json:"running_at"`
	PausedAt            time.Time `json:"paused_at"`
	LastResumedAt       time.Time `json:"last_resumed_at"`
	DestroyedAt         time.Time `json:"destroyed_at"`
	SpawnMS             *float64  `json:"spawn_ms"`
	Shape               string    `json:"shape"`
	Rootfs              string    `json:"rootfs"`
	Egress              []string  `json:"egress"`
	Envs                []string  `json:"envs"`
	ForkedFrom          string    `json:"forked_from"`
	AutoPause           int       `json:"auto_pause_after_seconds"`
	BandwidthQuotaBytes *int64    `json:"bandwidth_quota_bytes"`
}

// rawCall is call that also returns the answer's body.
func (ts *testServer) rawCall(method, path string, body any) (int, string) {
	ts.t.Helper()
	raw, _ := json.Marshal(body)
	resp := ts.request(method, path, strings.NewReader(string(raw)), nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestCreateTakesAndAnswersTheOfficialFields(t *testing.T) {
	ts := startServer(t, Options{})
	var catalog struct{ Default string }
	ts.mustCall("GET", "/rootfs", nil, &catalog)
	const secret = "s3cret-value-not-to-be-shown"
	status, body := ts.rawCall("POST", "/sandboxes", map[string]any{
		"shape": "s-2vcpu-4gb", "name": "my-box", "region": "local", "rootfs": "devbox:1", "disk_mib": 256,
		"envs": map[string]string{"GREETING": "hi", "TOKEN": secret}, "egress": []string{"*"},
		"auto_pause_after_seconds": 600, "ingress_enabled": false,
	})
	if status != http.StatusOK || strings.Contains(body, secret) {
		t.Fatalf("create: %d %s", status, body)
	}
	var created struct{ Data officialView }
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}
	c := created.Data
	if c.Status != "running" || c.Name != "my-box" || c.Shape != "s-2vcpu-4gb" || c.VCPU != 2 || c.MemMiB != 4096 ||
		c.DiskMiB != 256 || c.Rootfs != catalog.Default || c.AutoPause != 600 || c.IP == "" || c.SpawnMS == nil || *c.SpawnMS <= 0 ||
		c.BandwidthQuotaBytes == nil || *c.BandwidthQuotaBytes != -1 || c.Egress == nil {
		t.Errorf("create answered %+v", c)
	}
	status, body = ts.rawCall("GET", "/sandboxes/"+c.ID, nil)
	var got struct{ Data officialView }
	json.Unmarshal([]byte(body), &got)
	v := got.Data
	if status != http.StatusOK || strings.Contains(body, secret) || strings.Contains(body, "bandwidth_quota_bytes") {
		t.Fatalf("GET: %d %s", status, body)
	}
	if v.ID != c.ID || v.Name != "my-box" || !slices.Equal(v.Envs, []string{"GREETING", "TOKEN"}) || v.CreatedAt.IsZero() ||
		v.RunningAt.Before(v.CreatedAt) || !v.PausedAt.IsZero() || v.VCPU != 2 || v.AutoPause != 600 {
		t.Errorf("GET answered %+v", v)
	}
	// The envs are in every command's environment; a command's own env
	// overrides them.
	if r := ts.exec(c.ID, `printf '%s %s' "$GREETING" "$TOKEN"`); r.Stdout != "hi "+secret {
		t.Errorf("exec sees %q", r.Stdout)
	}
	var res struct{ Result execResult }
	ts.mustCall("POST", "/sandboxes/"+c.ID+"/exec", map[string]any{"cmd": "sh", "args": []string{"-c", `echo "$GREETING $ONE"`},
		"env": map[string]string{"GREETING": "hello", "ONE": "1"}}, &res)
	if res.Result.Stdout != "hello 1\n" {
		t.Errorf("exec with env sees %q", res.Result.Stdout)
	}

	// A name is unique among the live sandboxes; once destroyed, it is free.
	if status, body := ts.rawCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "name": "my-box"}); status != http.StatusConflict ||
		!strings.Contains(body, `"code":"NAME_TAKEN"`) {
		t.Errorf("a taken name: %d %s", status, body)
	}
	ts.mustCall("DELETE", "/sandboxes/"+c.ID, nil, nil)
	var again officialView
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "name": "my-box"}, &again)
	// Without one, the server names it.
	var unnamed officialView
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb"}, &unnamed)
	if again.Name != "my-box" || unnamed.Name == "" || unnamed.Name == "my-box" || unnamed.Rootfs != catalog.Default || unnamed.AutoPause != 0 {
		t.Errorf("names: %q, %q", again.Name, unnamed.Name)
	}
	// Official fields this server does not serve are refused by name.
	for field, value := range map[string]any{"networks": []any{map[string]string{"id": "n"}},
		"disks": []any{map[string]string{"disk_id": "d", "mount_path": "/m"}}, "node_selector": map[string]string{"a": "b"}, "host_id": "h"} {
		status, body := ts.rawCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", field: value})
		if status != http.StatusBadRequest || !strings.Contains(body, `"code":"UNSUPPORTED"`) || !strings.Contains(body, field) {
			t.Errorf("%s: %d %s", field, status, body)
		}
	}
	if st, _ := ts.srv.Stats(); st.Leases != 2 {
		t.Errorf("%d leases, want 2: a refused create made one", st.Leases)
	}
}

func TestDestroyedSandboxesReadAsDestroyedForAWhile(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
	var v officialView
	ts.mustCall("GET", "/sandboxes/"+lease, nil, &v)
	if v.Status != "destroyed" || v.DestroyedAt.Before(v.CreatedAt) || v.Name == "" || v.VCPU != 1 {
		t.Errorf("a destroyed sandbox reads %+v", v)
	}
	var list struct{ Data []officialView }
	ts.mustCall("GET", "/sandboxes?status=destroyed", nil, &list)
	if len(list.Data) != 1 || list.Data[0].ID != lease {
		t.Errorf("status=destroyed lists %+v", list.Data)
	}
	ts.mustCall("GET", "/sandboxes", nil, &list)
	if len(list.Data) != 0 {
		t.Errorf("the default list shows %+v", list.Data)
	}

	// The memory of them is bounded, in number and in time.
	var d destroyedLeases
	for i := range maxDestroyed + 10 {
		d.add(sandboxView{ID: fmt.Sprint("sb-", i), DestroyedAt: time.Now()})
	}
	if _, ok := d.get("sb-9"); ok || len(d.all()) != maxDestroyed {
		t.Errorf("%d remembered, sb-9 among them: want the newest %d", len(d.all()), maxDestroyed)
	}
	if v, ok := d.get(fmt.Sprint("sb-", maxDestroyed+9)); !ok || v.ID != fmt.Sprint("sb-", maxDestroyed+9) {
		t.Errorf("the newest is not remembered: %+v", v)
	}
	var old destroyedLeases
	old.add(sandboxView{ID: "sb-old", DestroyedAt: time.Now().Add(-destroyedRetention)})
	old.add(sandboxView{ID: "sb-new", DestroyedAt: time.Now()})
	if _, ok := old.get("sb-old"); ok || len(old.all()) != 1 {
		t.Error("a sandbox destroyed longer ago than the retention is remembered")
	}
}

func TestListsArePaginated(t *testing.T) {
	ts := startServer(t, Options{})
	var ids []string
	for range 3 {
		ids = append(ids, ts.createLease())
	}
	ts.mustCall("POST", "/sandboxes/"+ids[1]+"/pause", nil, nil)
	waitStatus(t, ts, ids[1], "paused")
	type page struct {
		Data       []officialView
		Pagination struct{ Total, Limit, Offset, Count int }
	}
	for query, want := range map[string]struct {
		ids                         []string
		total, limit, offset, count int
	}{
		"":                        {ids, 3, 50, 0, 3},
		"?limit=2":                {ids[:2], 3, 2, 0, 2},
		"?limit=2&offset=2":       {ids[2:], 3, 2, 2, 1},
		"?offset=5":               {nil, 3, 50, 5, 0},
		"?limit=100000":           {ids, 3, 500, 0, 3},
		"?status=paused":          {ids[1:2], 1, 50, 0, 1},
		"?status=running&limit=1": {ids[:1], 2, 1, 0, 1},
	} {
		var p page
		ts.mustCall("GET", "/sandboxes"+query, nil, &p)
		var got []string
		for _, v := range p.Data {
			got = append(got, v.ID)
		}
		if !slices.Equal(got, want.ids) || p.Pagination.Total != want.total || p.Pagination.Limit != want.limit ||
			p.Pagination.Offset != want.offset || p.Pagination.Count != want.count {
			t.Errorf("%q: %v %+v, want %+v", query, got, p.Pagination, want)
		}
	}
	var me struct {
		UserID string `json:"user_id"`
		Stats  struct{ Running, Paused, Other, Total int }
	}
	ts.mustCall("GET", "/whoami", nil, &me)
	if me.UserID == "" || me.Stats.Running != 2 || me.Stats.Paused != 1 || me.Stats.Total != 3 {
		t.Errorf("whoami %+v", me)
	}
}

func TestFailuresAreJSendWithARequestID(t *testing.T) {
	ts := startServer(t, Options{MaxLeases: 1})
	ts.createLease()
	resp := ts.request("POST", "/sandboxes", strings.NewReader(`{}`), nil)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
		!isFailureEnvelope(resp, raw) || !strings.Contains(string(raw), `"code":"TOO_MANY_SANDBOXES"`) {
		t.Errorf("a create over MaxLeases: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), raw)
	}
	seen := map[string]bool{}
	for range 3 {
		resp := ts.request("GET", "/sandboxes/sb-none", nil, http.Header{"X-Request-Id": {"mine"}})
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if id == "" || id == "mine" || seen[id] || !isFailureEnvelope(resp, raw) ||
			string(raw) != `{"status":"fail","data":{"code":"NOT_FOUND","message":"sandbox not found"}}`+"\n" {
			t.Errorf("404: request id %q, %s", id, raw)
		}
		seen[id] = true
	}
}

func TestPatchChangesAutoPause(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	var v officialView
	for _, step := range []struct {
		body   string
		status int
		want   int
	}{
		{`{"auto_pause_after_seconds":120}`, 200, 120},
		{`{"auto_pause_after_seconds":5}`, 400, 120},
		{`{"auto_pause_after_seconds":120,"disable_auto_pause":true}`, 400, 120},
		{`{"disable_auto_pause":false}`, 200, 120},
		{`{"disable_auto_pause":true}`, 200, 0},
		{`{}`, 200, 0},
	} {
		if status := ts.call("PATCH", "/sandboxes/"+lease, step.body, nil); status != step.status {
			t.Errorf("PATCH %s: %d, want %d", step.body, status, step.status)
		}
		v = officialView{}
		if ts.mustCall("GET", "/sandboxes/"+lease, nil, &v); v.AutoPause != step.want {
			t.Errorf("after PATCH %s: auto-pause %d, want %d", step.body, v.AutoPause, step.want)
		}
	}
}

func TestProcessesAnswerManagedProcessViews(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	type managedProcess struct {
		ProcessID    string `json:"process_id"`
		Kind, State  string
		PID          int
		LeaderExited bool      `json:"leader_exited"`
		TreeExited   bool      `json:"tree_exited"`
		CreatedAt    time.Time `json:"created_at"`
		FinishedAt   time.Time `json:"finished_at"`
		ExitCode     *int      `json:"exit_code"`
		Signal       string
		Cmd          string
		Args         []string
		Cwd          string
		Output       struct {
			OldestSeq int64 `json:"oldest_seq"`
			NewestSeq int64 `json:"newest_seq"`
			Bytes     int
		}
	}
	base := "/sandboxes/" + lease + "/processes"
	var p managedProcess
	ts.mustCall("POST", base, map[string]any{"cmd": "sh", "args": []string{"-c", `echo "$A"; exec sleep 1000`}, "cwd": "/tmp",
		"env": map[string]string{"A": "from env"}}, &p)
	if p.ProcessID == "" || p.Kind != "process" || p.State != "running" || p.PID <= 0 || p.CreatedAt.IsZero() ||
		p.Cmd != "sh" || len(p.Args) != 2 || p.Cwd != "/tmp" || p.LeaderExited || p.TreeExited || p.ExitCode != nil {
		t.Errorf("create answered %+v", p)
	}
	st := ts.connect(lease, p.ProcessID, 0)
	if ev, _ := st.next(false); ev.Type != "data" {
		t.Fatalf("frame %+v", ev)
	}
	var list struct{ Processes []managedProcess }
	ts.mustCall("GET", base, nil, &list)
	if len(list.Processes) != 1 || list.Processes[0].ProcessID != p.ProcessID || list.Processes[0].Output.NewestSeq != 1 ||
		list.Processes[0].Output.OldestSeq != 1 || list.Processes[0].Output.Bytes != len("from env\n") {
		t.Errorf("list %+v", list.Processes)
	}
	ts.mustCall("POST", base+"/"+p.ProcessID+"/signal", map[string]string{"signal": "SIGWINCH"}, nil)
	ts.mustCall("DELETE", base+"/"+p.ProcessID+"?grace_ms=0", nil, &p)
	if p.State != "exited" || !p.LeaderExited || !p.TreeExited || p.Signal != "SIGKILL" || p.ExitCode != nil || p.FinishedAt.IsZero() {
		t.Errorf("DELETE answered %+v", p)
	}
	if out := st.drain(1); out.last.Signal != "SIGKILL" {
		t.Errorf("the stream ended with %+v", out.last)
	}
	q := ts.startProcess(lease, "exit 4")
	ts.mustCall("GET", base+"/"+q+"/wait?scope=leader&timeout_ms=10000", nil, &p)
	if p.ProcessID != q || p.ExitCode == nil || *p.ExitCode != 4 || !p.LeaderExited {
		t.Errorf("wait answered %+v", p)
	}
	ts.mustCall("GET", base+"/"+q, nil, &p)
	if p.ProcessID != q || p.State != "exited" {
		t.Errorf("GET answered %+v", p)
	}
}

func TestRootfsListsTheDefaultAndTheDirectory(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"alpine", "host", ".."} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "not-a-dir"), nil, 0o644)
	ts := startServer(t, Options{RootfsDir: dir})
	var rootfs struct {
		Rootfs  []string
		Default string
	}
	ts.mustCall("GET", "/rootfs", nil, &rootfs)
	want, def := []string{"host"}, "host" // process groups run on the host
	if ts.srv.Isolation() == IsolationNamespaces {
		def = ts.srv.images.debian
		want = append(append([]string{def}, debianAliases...), "alpine")
	}
	if !slices.Equal(rootfs.Rootfs, want) || rootfs.Default != def {
		t.Errorf("rootfs %+v, want %v", rootfs, want)
	}
}
