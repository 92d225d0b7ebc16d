package localsandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"golang.org/x/sys/unix"
)

// buildTemplate posts a template and follows its log to the final event;
// it returns the template's id, the log's lines and the final status.
func (ts *testServer) buildTemplate(name, dockerfile string) (id string, lines []string, status string) {
	ts.t.Helper()
	var v templateView
	ts.mustCall("POST", "/templates", map[string]any{"name": name, "dockerfile": dockerfile}, &v)
	if v.Status != templatePending || v.ID == "" || v.Name != name || v.CreatedAt.IsZero() {
		ts.t.Fatalf("a new template: %+v", v)
	}
	lines, status = ts.followTemplate(v.ID)
	return v.ID, lines, status
}

// followTemplate reads the NDJSON follow stream of a template's log.
func (ts *testServer) followTemplate(id string) (lines []string, status string) {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.base+"/templates/"+id+"/logs?follow=true", nil)
	req.Header.Set("X-Api-Key", testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		ts.t.Fatalf("follow: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var e struct {
			TS     time.Time `json:"ts"`
			Line   *string   `json:"line"`
			Final  bool      `json:"final"`
			Status string    `json:"status"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			ts.t.Fatalf("follow: %q: %v", sc.Bytes(), err)
		}
		if e.Final {
			if sc.Scan() {
				ts.t.Errorf("follow: %q after the final event", sc.Bytes())
			}
			return lines, e.Status
		}
		if e.Line == nil || e.TS.IsZero() {
			ts.t.Errorf("follow: an event without line or ts: %q", sc.Bytes())
			continue
		}
		lines = append(lines, *e.Line)
	}
	ts.t.Fatalf("follow: the stream of %s ended without a final event (%v); lines: %q", id, sc.Err(), lines)
	return nil, ""
}

// createOn creates a sandbox on rootfs and returns its id, or the HTTP
// status of a refusal.
func (ts *testServer) createOn(rootfs string) (string, int) {
	ts.t.Helper()
	var sb sandboxData
	code := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": rootfs}, &sb)
	return sb.ID, code
}

func hasLine(lines []string, sub string) bool {
	return slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, sub) })
}

// A template built, followed to ready, listed, used by leases that do not
// see each other's writes, built on, deleted while a lease runs on it, and
// kept by a restarted server.
func TestTemplateBuiltUsedDeletedAndKeptOverARestart(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	root := filepath.Join(t.TempDir(), "root")
	ts := startServer(t, Options{Root: root})

	dockerfile := `FROM devbox:1
ARG WHO=the-build
ENV GREETING="hi from"
WORKDIR /opt/app
RUN echo "$GREETING $WHO" > /opt/marker && \
    pwd > where && echo built-ok
USER nobody
RUN id -un
USER root
`
	id, lines, status := ts.buildTemplate("marker", dockerfile)
	if status != templateReady {
		t.Fatalf("build: %s; log: %q", status, lines)
	}
	if !hasLine(lines, "built-ok") || !hasLine(lines, "Step 2/3 (line 5)") || !slices.Contains(lines, "nobody") {
		t.Errorf("the log lacks a step or its output: %q", lines)
	}

	var v templateView
	ts.mustCall("GET", "/templates/marker?include=dockerfile", nil, &v)
	if v.ID != id || v.Status != templateReady || v.Dockerfile != dockerfile || v.BuiltAt.IsZero() || v.Size <= 0 {
		t.Errorf("GET by name: %+v", v)
	}
	v = templateView{}
	ts.mustCall("GET", "/templates/"+id, nil, &v)
	if v.Dockerfile != "" {
		t.Errorf("the dockerfile without include: %q", v.Dockerfile)
	}
	var list struct {
		Data       []templateView `json:"data"`
		Pagination struct{ Total int }
	}
	ts.mustCall("GET", "/templates", nil, &list)
	if list.Pagination.Total != 1 || len(list.Data) != 1 || list.Data[0].ID != id {
		t.Errorf("list: %+v", list)
	}
	var cat struct{ Rootfs []string }
	ts.mustCall("GET", "/rootfs", nil, &cat)
	if !slices.Contains(cat.Rootfs, "marker") {
		t.Errorf("GET /v1/rootfs lacks the template: %v", cat.Rootfs)
	}
	resp := ts.request("GET", "/templates/"+id+"/logs", nil, nil)
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || !strings.Contains(string(text), "built-ok\n") {
		t.Errorf("plain log: %s %q", resp.Header.Get("Content-Type"), text)
	}

	// Two leases on it, by name and by id: each sees the build's files,
	// neither the other's writes.
	a, code := ts.createOn("marker")
	b, code2 := ts.createOn(id)
	if code != http.StatusOK || code2 != http.StatusOK {
		t.Fatalf("creates on the template: %d %d", code, code2)
	}
	for _, l := range []string{a, b} {
		if r := ts.exec(l, "cat /opt/marker /opt/app/where; stat -c %U /opt/marker"); r.Stdout != "hi from the-build\n/opt/app\nroot\n" {
			t.Errorf("lease %s on the template: %+v", l, r)
		}
	}
	if r := ts.exec(a, "echo a-wrote >> /opt/marker && touch /opt/app/only-a"); r.ExitCode != 0 {
		t.Fatalf("writing in a: %+v", r)
	}
	if r := ts.exec(b, "cat /opt/marker; ls /opt/app"); r.Stdout != "hi from the-build\nwhere\n" {
		t.Errorf("b sees a's writes: %+v", r)
	}

	// A fork of a lease on it has the template's layers and the lease's
	// writes over them.
	ts.mustCall("POST", "/sandboxes/"+a+"/pause", nil, nil)
	waitStatus(t, ts, a, "paused")
	if f, st := ts.forkAndWait(a); st != "running" {
		t.Errorf("forking a lease on the template: %s", st)
	} else if r := ts.exec(f, "cat /opt/marker"); r.Stdout != "hi from the-build\na-wrote\n" {
		t.Errorf("the fork of a lease on the template: %+v", r)
	}

	// A template built on it.
	child, lines, status := ts.buildTemplate("child", "FROM marker\nRUN cat /opt/marker > /opt/child\n")
	if status != templateReady {
		t.Fatalf("child build: %s; log: %q", status, lines)
	}
	c, code := ts.createOn("child")
	if code != http.StatusOK {
		t.Fatalf("create on child: %d", code)
	}
	if r := ts.exec(c, "cat /opt/child /opt/marker"); r.Stdout != "hi from the-build\nhi from the-build\n" {
		t.Errorf("a lease on the child: %+v", r)
	}

	// Deleted: gone from the catalog, 404 to later creates, while a lease
	// on it runs on.
	if code := ts.call("DELETE", "/templates/marker", nil, nil); code != http.StatusConflict {
		t.Errorf("deleting a template another is built on: %d, want 409", code)
	}
	var ok struct {
		OK bool `json:"ok"`
	}
	ts.mustCall("DELETE", "/templates/child", nil, &ok)
	if !ok.OK {
		t.Errorf("delete answered %+v", ok)
	}
	if code := ts.call("GET", "/templates/"+child, nil, nil); code != http.StatusNotFound {
		t.Errorf("GET a deleted template: %d", code)
	}
	if _, code := ts.createOn("child"); code != http.StatusNotFound {
		t.Errorf("create on a deleted template: %d, want 404", code)
	}
	if r := ts.exec(c, "cat /opt/child"); r.Stdout != "hi from the-build\n" {
		t.Errorf("a lease on a deleted template: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(root, templatesDir, deletedDir+child)); err != nil {
		t.Errorf("the layer of a deleted template in use is gone: %v", err)
	}

	// Restarted on the same root: the ready template stays, the deleted
	// one's layer is removed now that no lease runs on it.
	if err := ts.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts = startServer(t, Options{Root: root})
	ts.mustCall("GET", "/templates/marker", nil, &v)
	if v.ID != id || v.Status != templateReady {
		t.Errorf("after a restart: %+v", v)
	}
	if code := ts.call("GET", "/templates/child", nil, nil); code != http.StatusNotFound {
		t.Errorf("the deleted template after a restart: %d", code)
	}
	d, code := ts.createOn("marker")
	if code != http.StatusOK {
		t.Fatalf("create after a restart: %d", code)
	}
	if r := ts.exec(d, "cat /opt/marker"); r.Stdout != "hi from the-build\n" {
		t.Errorf("a lease after a restart: %+v", r)
	}
	ts.mustCall("DELETE", "/sandboxes/"+d, nil, nil)
	ts.mustCall("DELETE", "/templates/"+id, nil, nil)
	if entries, _ := os.ReadDir(filepath.Join(root, templatesDir)); len(entries) != 0 {
		t.Errorf("template directories left: %v", entries)
	}
}

// The final ENV and WORKDIR of a template's Dockerfile hold in every lease
// started from it — through exec and a managed process, beneath the
// create's envs and a command's own env and cwd — in its forks, in the
// templates built FROM it and in a snapshot of a lease on it (not the
// create's envs: those are the lease's, and may be secrets), and after a
// restart of the server.
func TestTemplateEnvAndWorkdirHoldInItsLeases(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	root := filepath.Join(t.TempDir(), "root")
	ts := startServer(t, Options{Root: root})
	if _, lines, status := ts.buildTemplate("tooled", `FROM devbox:1
ENV FOO=from-template BAR=bar-template
ENV PATH=/opt/tool/bin:$PATH
WORKDIR /app
RUN mkdir -p /opt/tool/bin && printf '#!/bin/sh\necho tool-ran\n' > /opt/tool/bin/mytool && chmod +x /opt/tool/bin/mytool
`); status != templateReady {
		t.Fatalf("build: %s; log %q", status, lines)
	}
	const probe = `echo "$FOO $BAR"; pwd; mytool`
	var a sandboxData
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": "tooled", "envs": map[string]string{"BAR": "from-create"}}, &a)
	const want = "from-template from-create\n/app\ntool-ran\n"
	if r := ts.exec(a.ID, probe); r.Stdout != want {
		t.Errorf("exec in a lease on the template: %+v, want %q", r, want)
	}
	if out := ts.run(a.ID, probe); out.stdout.String() != want {
		t.Errorf("a managed process in a lease on the template: %q (%q), want %q", out.stdout.String(), out.stderr.String(), want)
	}
	var own struct{ Result execResult }
	ts.mustCall("POST", "/sandboxes/"+a.ID+"/exec", map[string]any{"cmd": "/bin/sh", "args": []string{"-c", probe},
		"env": map[string]string{"FOO": "own"}, "cwd": "/tmp"}, &own)
	if own.Result.Stdout != "own from-create\n/tmp\ntool-ran\n" {
		t.Errorf("a command's own env and cwd: %+v", own.Result)
	}

	// A fork keeps them.
	ts.mustCall("POST", "/sandboxes/"+a.ID+"/pause", nil, nil)
	waitStatus(t, ts, a.ID, "paused")
	if f, st := ts.forkAndWait(a.ID); st != "running" {
		t.Errorf("fork: %s", st)
	} else if r := ts.exec(f, probe); r.Stdout != want {
		t.Errorf("a fork of a lease on the template: %+v", r)
	}

	// A template FROM it inherits them, in its build and its leases.
	childDockerfile := "FROM tooled\nENV BAZ=$FOO-child\nRUN pwd; mytool\n"
	_, lines, status := ts.buildTemplate("child", childDockerfile)
	if status != templateReady || !slices.Contains(lines, "/app") || !slices.Contains(lines, "tool-ran") {
		t.Fatalf("child build: %s; log %q", status, lines)
	}
	const childProbe = `echo "$FOO $BAZ $SECRET"; pwd; mytool`
	const childWant = "from-template from-template-child \n/app\ntool-ran\n"
	var c sandboxData
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": "child", "envs": map[string]string{"SECRET": "create-only"}}, &c)
	if r := ts.exec(c.ID, childProbe); r.Stdout != "from-template from-template-child create-only\n/app\ntool-ran\n" {
		t.Errorf("a lease on the child: %+v", r)
	}

	// A snapshot of that lease carries its template's, not its envs.
	var snap templateView
	ts.mustCall("POST", "/templates", map[string]any{"name": "snap", "from_sandbox": c.ID}, &snap)
	s, code := ts.createOn("snap")
	if code != http.StatusOK {
		t.Fatalf("create on the snapshot: %d", code)
	}
	if r := ts.exec(s, childProbe); r.Stdout != childWant {
		t.Errorf("a lease on the snapshot: %+v, want %q", r, childWant)
	}
	if data, err := os.ReadFile(filepath.Join(root, templatesDir, snap.ID, "meta.json")); err != nil || strings.Contains(string(data), "create-only") {
		t.Errorf("the snapshot's meta.json holds the create's envs (%v): %s", err, data)
	}

	// Restarted on the same root: they still hold.
	if err := ts.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts = startServer(t, Options{Root: root})
	for rootfs, want := range map[string]string{"tooled": "from-template bar-template\n/app\ntool-ran\n", "child": childWant, "snap": childWant} {
		l, code := ts.createOn(rootfs)
		if code != http.StatusOK {
			t.Fatalf("create on %s after a restart: %d", rootfs, code)
		}
		probe := probe
		if rootfs != "tooled" {
			probe = childProbe
		}
		if out := ts.run(l, probe); out.stdout.String() != want {
			t.Errorf("a lease on %s after a restart: %q (%q), want %q", rootfs, out.stdout.String(), out.stderr.String(), want)
		}
	}
}

// sandboxd refuses exactly the template names that the library's
// sandbox.CheckTemplateName refuses, and that rule covers what the server
// reserves: the host image's rootfs and the form of its template ids.
func TestTemplateNamesAreTheLibrarysRule(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	ts := startServer(t, Options{})
	if sandbox.CheckTemplateName("name", hostImage) == nil {
		t.Errorf("the library allows the host image's rootfs %q as a name", hostImage)
	}
	const notBuilt = "FROM devbox:1\nCOPY . /app\n" // fails before any step: nothing is built
	for _, name := range []string{"a", "Z9", "a_b-c", strings.Repeat("x", 63), strings.Repeat("x", 64),
		"", "-a", "_a", "a:b", "a.b", "a/b", "a b", "é", "host", "tpl-x", "tpl-", "tpl", "Host", "sf-0123456789abcdef"} {
		libOK := sandbox.CheckTemplateName("name", name) == nil
		var v templateView
		code := ts.call("POST", "/templates", map[string]any{"name": name, "dockerfile": notBuilt}, &v)
		if serverOK := code == http.StatusOK; serverOK != libOK || !libOK && code != http.StatusBadRequest {
			t.Errorf("name %q: the server answers %d, the library's rule says ok=%v", name, code, libOK)
		}
		if code == http.StatusOK {
			if sandbox.CheckTemplateName("name", v.ID) == nil {
				t.Errorf("the server's template id %q is a name the library allows", v.ID)
			}
			ts.followTemplate(v.ID)
		}
	}
}

// A build stops at the first failing step, or before any for what the
// subset does not have, and says which line; nothing of it is left.
func TestTemplateBuildFailsNamingTheStep(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	ts := startServer(t, Options{})
	for _, c := range []struct {
		name, dockerfile, want, never string
	}{
		{"copy", "FROM devbox:1\nRUN echo never\nCOPY . /app\n", "line 3: COPY is not supported", "never"},
		{"exit", "FROM devbox:1\nRUN echo first\nRUN echo oops >&2; exit 3\nRUN echo never\n", "line 3: RUN echo oops >&2; exit 3: exited with code 3", "never"},
		{"from", "FROM nothing:here\nRUN true\n", `FROM nothing:here: unknown rootfs "nothing:here"`, "Step"},
		{"user", "FROM devbox:1\nUSER nobody\nRUN echo never\n", "line 2: USER nobody: a template cannot end as another user than root", "never"},
	} {
		id, lines, status := ts.buildTemplate(c.name, c.dockerfile)
		if status != templateFailed || !hasLine(lines, c.want) || hasLine(lines, c.never) {
			t.Errorf("%s: %s, want failed with %q and without %q; log %q", c.name, status, c.want, c.never, lines)
		}
		if c.name == "exit" && !slices.Contains(lines, "oops") {
			t.Errorf("the failing step's output is not in the log: %q", lines)
		}
		if _, code := ts.createOn(c.name); code != http.StatusConflict {
			t.Errorf("%s: create on a failed template: %d, want 409", c.name, code)
		}
		if _, err := os.Stat(filepath.Join(ts.root, templatesDir, id, layerDir)); !os.IsNotExist(err) {
			t.Errorf("%s: a failed build left its layer (%v)", c.name, err)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(ts.root, leasesDir)); len(entries) != 0 {
		t.Errorf("build sandboxes left: %d", len(entries))
	}
	// Bad requests fail before anything is made.
	for _, body := range []map[string]any{
		{"name": "", "dockerfile": "FROM devbox:1\n"},
		{"name": "a:b", "dockerfile": "FROM devbox:1\n"},
		{"name": "fine", "dockerfile": " \n"},
		{"name": "host", "dockerfile": "FROM devbox:1\n"},
	} {
		if code := ts.call("POST", "/templates", body, nil); code != http.StatusBadRequest {
			t.Errorf("POST %v: %d, want 400", body, code)
		}
	}
	if code := ts.call("POST", "/templates", map[string]any{"name": "copy", "dockerfile": "FROM devbox:1\n"}, nil); code != http.StatusConflict {
		t.Errorf("a taken name: %d, want 409", code)
	}
	var list struct{ Pagination struct{ Total int } }
	ts.mustCall("GET", "/templates", nil, &list)
	if list.Pagination.Total != 4 {
		t.Errorf("%d templates, want the 4 failed ones", list.Pagination.Total)
	}
}

// A build that plants symlinks to host files, and files of every id of its
// range, cannot steer the server keeping, re-owning or removing its layer:
// the copy keeps the links as links (a lease on the template does not read
// the host file through them), the id shift re-owns no host file, and the
// delete removes no host file.
func TestTemplateBuildSymlinksDoNotReachTheHost(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	ts := startServer(t, Options{})
	hostDir, secret := plantSecretOfTheFirstLeaseRoot(t, ts)
	if err := os.Chmod(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	id, lines, status := ts.buildTemplate("links", "FROM devbox:1\n"+
		"RUN ln -s "+secret+" /opt/file-link && ln -s "+hostDir+" /opt/dir-link && mkdir -p /opt/d && ln -s "+hostDir+" /opt/d/x && chown -h 1000:1000 /opt/file-link\n")
	if status != templateReady {
		t.Fatalf("build: %s; log %q", status, lines)
	}
	layer := filepath.Join(ts.root, templatesDir, id, layerDir)
	if fi, err := os.Lstat(filepath.Join(layer, "opt/file-link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the layer's link is not a link: %v %v", fi, err)
	}
	l, code := ts.createOn("links")
	if code != http.StatusOK {
		t.Fatalf("create: %d", code)
	}
	if r := ts.exec(l, "cat /opt/file-link /opt/dir-link/secret 2>&1; readlink /opt/file-link"); strings.Contains(r.Stdout, "host secret") || !strings.Contains(r.Stdout, secret) {
		t.Errorf("a lease on the template: %+v", r)
	}
	ts.mustCall("DELETE", "/sandboxes/"+l, nil, nil)
	ts.mustCall("DELETE", "/templates/"+id, nil, nil)
	assertSecretUntouched(t, ts, secret)
}

// A build that a shutdown stops fails, its build sandbox gone, and so does
// one that a crash left building: a restarted server says so, and keeps
// neither's layer.
func TestTemplateBuildStoppedByAShutdownFails(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	root := filepath.Join(t.TempDir(), "root")
	ts := startServer(t, Options{Root: root})
	var v templateView
	ts.mustCall("POST", "/templates", map[string]any{"name": "slow", "dockerfile": "FROM devbox:1\nRUN echo started; sleep 600\n"}, &v)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) { // polled, as clients do
		resp := ts.request("GET", "/templates/slow/logs", nil, nil)
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(text), "started\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the build did not start its step: %q", text)
		}
	}
	if err := ts.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertNoProcesses(t, root)
	if entries, _ := os.ReadDir(filepath.Join(root, leasesDir)); len(entries) != 0 {
		t.Errorf("the build sandbox was left: %v", entries)
	}
	// And one that a crash left building.
	meta := filepath.Join(root, templatesDir, v.ID, "meta.json")
	data, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meta, []byte(strings.Replace(string(data), `"status":"failed"`, `"status":"building"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}

	ts = startServer(t, Options{Root: root})
	lines, status := ts.followTemplate(v.ID)
	if status != templateFailed || !hasLine(lines, "build failed: the build was stopped: the server shut down") || !hasLine(lines, "the build was interrupted by a restart of the server") {
		t.Errorf("after a restart: %s; log %q", status, lines)
	}
	if _, err := os.Stat(filepath.Join(root, templatesDir, v.ID, layerDir)); !os.IsNotExist(err) {
		t.Errorf("an unfinished build's layer is kept (%v)", err)
	}
}

// A build's log keeps at most maxTemplateOutputBytes of its steps' output,
// and says that it dropped the rest.
func TestTemplateBuildLogIsBounded(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	ts := startServer(t, Options{})
	_, lines, status := ts.buildTemplate("loud", "FROM devbox:1\nRUN head -c 6000000 /dev/zero | tr '\\0' x | fold -w 1000; echo last-line\n")
	if status != templateReady {
		t.Fatalf("build: %s", status)
	}
	kept := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "xxxx") {
			kept += len(l)
		}
	}
	if kept > maxTemplateOutputBytes || kept < maxTemplateOutputBytes-1000 || !hasLine(lines, "the rest of the build's output is not kept") || slices.Contains(lines, "last-line") {
		t.Errorf("kept %d bytes of 6000000 output (cap %d); cut line: %v", kept, maxTemplateOutputBytes, hasLine(lines, "not kept"))
	}
}

// A template made from a live sandbox [ext] keeps what the sandbox wrote
// over its image and in /workspace; a new lease from it sees both, the
// source keeps running, and what it writes after is not the template's.
// Links the sandbox planted to host files are copied as links: neither
// the copy nor the re-owning follows them, and the new lease reads nothing
// of the host through them.
func TestTemplateFromASandbox(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	ts := startServer(t, Options{})
	_, secret := plantSecretOfTheFirstLeaseRoot(t, ts)
	src, code := ts.createOn("devbox:1")
	if code != http.StatusOK {
		t.Fatalf("create: %d", code)
	}
	if r := ts.exec(src, "echo x > /opt/x && echo y > /workspace/y && ln -s "+secret+" /opt/link && ln -s "+secret+" /workspace/link && echo tmp > /tmp/t"); r.ExitCode != 0 {
		t.Fatalf("writing: %+v", r)
	}
	var bad map[string]any
	if code := ts.call("POST", "/templates", map[string]any{"name": "snap", "from_sandbox": src, "dockerfile": "FROM devbox:1\n"}, &bad); code != http.StatusBadRequest {
		t.Errorf("from_sandbox with a dockerfile: %d", code)
	}
	if code := ts.call("POST", "/templates", map[string]any{"name": "snap", "from_sandbox": "sb-nope"}, &bad); code != http.StatusNotFound {
		t.Errorf("from_sandbox of no sandbox: %d", code)
	}
	var srcView sandboxData
	ts.mustCall("GET", "/sandboxes/"+src, nil, &srcView)
	var v templateView
	ts.mustCall("POST", "/templates", map[string]any{"name": "snap", "from_sandbox": src}, &v)
	if v.Status != templateReady || v.FromSandbox != src || v.Base != srcView.Rootfs || v.ID == "" {
		t.Fatalf("the snapshot: %+v", v)
	}
	var sb sandboxData
	ts.mustCall("GET", "/sandboxes/"+src, nil, &sb)
	if sb.Status != stateRunning {
		t.Errorf("the source after the snapshot is %s, want running", sb.Status)
	}
	if r := ts.exec(src, "echo later > /opt/later && echo later > /workspace/later && cat /opt/x /workspace/y"); r.ExitCode != 0 || r.Stdout != "x\ny\n" {
		t.Errorf("the source after the snapshot: %+v", r)
	}
	l, code := ts.createOn("snap")
	if code != http.StatusOK {
		t.Fatalf("create on the snapshot: %d", code)
	}
	if r := ts.exec(l, "cat /opt/x /workspace/y; ls /opt/later /workspace/later /tmp/t 2>&1; cat /opt/link /workspace/link 2>&1; readlink /opt/link /workspace/link"); r.Stdout == "" ||
		!strings.HasPrefix(r.Stdout, "x\ny\n") || strings.Contains(r.Stdout, "host secret") ||
		strings.Count(r.Stdout, "No such file") < 3 || strings.Count(r.Stdout, secret) < 2 {
		t.Errorf("a lease on the snapshot: %+v", r)
	}
	if r := ts.exec(l, "stat -c %u:%g /workspace/y /opt/x"); r.Stdout != "0:0\n0:0\n" {
		t.Errorf("owners in a lease on the snapshot: %+v", r)
	}
	ts.mustCall("DELETE", "/sandboxes/"+l, nil, nil)
	ts.mustCall("DELETE", "/sandboxes/"+src, nil, nil)
	ts.mustCall("DELETE", "/templates/"+v.ID, nil, nil)
	assertSecretUntouched(t, ts, secret)
}

// The project's client keeps a lease as a template idempotently by name: a
// repeat (a retry whose answer was lost) gets the same template; the name
// taken by another lease's snapshot is invalid input, and a lease that is
// gone is a *sandbox.LeaseGoneError.
func TestClientSnapshotLeaseIsIdempotentByName(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	ts := startServer(t, Options{})
	c := newClient(t, ts)
	ctx := context.Background()
	a, code := ts.createOn("devbox:1")
	b, code2 := ts.createOn("devbox:1")
	if code != http.StatusOK || code2 != http.StatusOK {
		t.Fatalf("create: %d %d", code, code2)
	}
	first, err := c.SnapshotLease(ctx, a, "kept")
	if err != nil || first.Name != "kept" || !strings.HasPrefix(first.ID, "tpl-") {
		t.Fatalf("snapshot: %+v, %v", first, err)
	}
	if again, err := c.SnapshotLease(ctx, a, "kept"); err != nil || again != first {
		t.Errorf("a repeat: %+v, %v; want %+v", again, err, first)
	}
	var invalid *sandbox.InvalidInputError
	if _, err := c.SnapshotLease(ctx, b, "kept"); !errors.As(err, &invalid) || invalid.Field != "name" {
		t.Errorf("the name of another lease's snapshot: %v", err)
	}
	ts.mustCall("DELETE", "/sandboxes/"+b, nil, nil)
	var gone *sandbox.LeaseGoneError
	if _, err := c.SnapshotLease(ctx, b, "other"); !errors.As(err, &gone) {
		t.Errorf("a gone lease: %v", err)
	}
	ts.mustCall("DELETE", "/sandboxes/"+a, nil, nil)
}

// A snapshot of a sandbox on a snapshot is built on it: a lease on the
// second sees the files of both, /workspace as the second sandbox left it;
// the first cannot be deleted while the second is built on it.
func TestTemplateFromASandboxOnATemplate(t *testing.T) {
	testenv.RequireRoot(t, "templates are images: namespace isolation needs a root server")
	ts := startServer(t, Options{})
	src, code := ts.createOn("devbox:1")
	if code != http.StatusOK {
		t.Fatalf("create: %d", code)
	}
	ts.exec(src, "echo x > /opt/x && echo y > /workspace/y")
	var first, second templateView
	ts.mustCall("POST", "/templates", map[string]any{"name": "first", "from_sandbox": src}, &first)
	on, code := ts.createOn("first")
	if code != http.StatusOK {
		t.Fatalf("create on the first: %d", code)
	}
	ts.exec(on, "echo z > /opt/z && echo z > /workspace/z && rm /workspace/y")
	ts.mustCall("POST", "/templates", map[string]any{"name": "second", "from_sandbox": on}, &second)
	if second.Base != first.ID || second.Status != templateReady {
		t.Errorf("the second snapshot: %+v", second)
	}
	l, code := ts.createOn("second")
	if code != http.StatusOK {
		t.Fatalf("create on the second: %d", code)
	}
	if r := ts.exec(l, "cat /opt/x /opt/z; ls /workspace"); r.Stdout != "x\nz\nz\n" {
		t.Errorf("a lease on the second snapshot: %+v", r)
	}
	if code := ts.call("DELETE", "/templates/"+first.ID, nil, nil); code != http.StatusConflict {
		t.Errorf("deleting the first while the second is built on it: %d", code)
	}
}

// plantSecretOfTheFirstLeaseRoot makes a host directory holding a secret
// file (0600), both owned by the root of the first id range, which the
// first sandbox of ts takes: a host-side re-owning that followed a link the
// sandbox planted to them would give them to host root, and a copy that
// followed it would put the secret in a layer.
func plantSecretOfTheFirstLeaseRoot(t *testing.T, ts *testServer) (dir, secret string) {
	t.Helper()
	dir = t.TempDir()
	secret = filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := ts.srv.opts.HostIDBase
	for _, p := range []string{dir, secret} {
		if err := os.Lchown(p, base, base); err != nil {
			t.Fatal(err)
		}
	}
	return dir, secret
}

// assertSecretUntouched checks that the file plantSecretOfTheFirstLeaseRoot
// planted is still there, with its owner, mode and content.
func assertSecretUntouched(t *testing.T, ts *testServer, secret string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(secret, &st); err != nil {
		t.Fatalf("the host file is gone: %v", err)
	}
	if int(st.Uid) != ts.srv.opts.HostIDBase || st.Mode&0o777 != 0o600 {
		t.Errorf("the host file was re-owned or re-moded: uid %d mode %o", st.Uid, st.Mode&0o777)
	}
	if data, _ := os.ReadFile(secret); string(data) != "host secret\n" {
		t.Errorf("the host file was changed: %q", data)
	}
}
