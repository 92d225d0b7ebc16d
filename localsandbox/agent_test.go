package localsandbox

import (
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

// selfSignal is what the SDKs' selfPause and selfDelete send (TS
// dist/self.js: fetch POST http://127.0.0.1:1029/self/<action>?reason=…,
// success exactly 202), in python: the lease image has no node. It prints
// the status, or the error's name; argv: path [method [body]].
const selfSignal = `
import sys, urllib.request, urllib.error
path = sys.argv[1]
method = sys.argv[2] if len(sys.argv) > 2 else "POST"
body = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request("http://127.0.0.1:1029" + path, data=body, method=method,
    headers={"X-Sandbox-Id": sys.argv[4]} if len(sys.argv) > 4 else {})
try:
    print(urllib.request.urlopen(req, timeout=10).status, flush=True)
except urllib.error.HTTPError as e:
    print(e.code, flush=True)
except OSError as e:
    print(type(e).__name__, flush=True)
`

// selfServer starts a root server whose leases have network namespaces
// of its own (and so an agent), without any egress.
func selfServer(t *testing.T) *testServer {
	t.Helper()
	testenv.RequireRoot(t, "a lease's self API lives in a network namespace the server makes")
	return startServer(t, Options{})
}

// putSelfSignal puts the client into the lease.
func (ts *testServer) putSelfSignal(lease string) {
	ts.t.Helper()
	if status := ts.putFile(lease, "/workspace/self.py", selfSignal); status != http.StatusOK {
		ts.t.Fatalf("putting the self client: %d", status)
	}
}

// assertNothingLeft fails the test if the server holds a lease or a
// process, or a process of its root is alive (localsandboxtest's
// CheckNothingLeaked, which this package cannot import).
func assertNothingLeft(t *testing.T, ts *testServer) {
	t.Helper()
	stats, err := ts.srv.Stats()
	if err != nil || stats.Leases != 0 || stats.Processes != 0 {
		t.Errorf("the server still holds %+v (%v)", stats, err)
	}
	assertNoProcesses(t, ts.root)
}

// Before: connection refused (nothing listened on 127.0.0.1:1029).
func TestSelfDeleteFromInside(t *testing.T) {
	ts := selfServer(t)
	sb := ts.createLease()
	ts.putSelfSignal(sb)
	// The caller is killed with its lease; the server forgets nothing.
	ts.startProcess(sb, "python3 /workspace/self.py '/self/delete?reason=ci-run-done'")
	waitStatus(t, ts, sb, "destroyed") // remembered as destroyed, as after DELETE
	if status := ts.call("DELETE", "/sandboxes/"+sb, nil, nil); status != http.StatusOK {
		t.Errorf("DELETE after the lease's own: %d, want 200 (remembered as destroyed)", status)
	}
	assertNothingLeft(t, ts)
}

// Before: connection refused.
func TestSelfPauseFromInside(t *testing.T) {
	ts := selfServer(t)
	sb := ts.createLease()
	ts.putSelfSignal(sb)
	// The 202 is in the caller's socket before the freeze: the caller
	// reads it once resumed, and goes on.
	pid := ts.startProcess(sb, "python3 /workspace/self.py '/self/pause?reason="+strings.Repeat("r", 300)+"' && echo resumed")
	waitStatus(t, ts, sb, "paused")
	if ts.srv.limiter != nil && ts.srv.limiter.Enforces("freezer") {
		if st := ts.freezerState(sb); st != "FROZEN" {
			t.Errorf("the lease's freezer: %q, want FROZEN", st)
		}
	}
	ts.mustCall("POST", "/sandboxes/"+sb+"/resume", nil, nil)
	waitStatus(t, ts, sb, "running")
	w, status := ts.waitTree(sb, pid, 10*time.Second)
	if status != http.StatusOK || w.ExitCode == nil || *w.ExitCode != 0 {
		t.Fatalf("the caller: %d %+v", status, w)
	}
	if out := ts.connect(sb, pid, 0).drain(0); out.stdout.String() != "202\nresumed\n" {
		t.Errorf("the caller wrote %q, want its 202 and then resumed", out.stdout.String())
	}
	ts.mustCall("DELETE", "/sandboxes/"+sb, nil, nil)
	assertNothingLeft(t, ts)
}

// A lease's agent acts on that lease only, whatever the request names.
func TestSelfActsOnItsOwnLeaseOnly(t *testing.T) {
	ts := selfServer(t)
	a, b := ts.createLease(), ts.createLease()
	ts.putSelfSignal(a)
	ts.startProcess(a, "python3 /workspace/self.py '/self/pause?id="+b+"&sandbox_id="+b+"' POST '' "+b)
	waitStatus(t, ts, a, "paused")
	if st := ts.status(b); st != "running" {
		t.Errorf("the other lease is %s", st)
	}
	ts.mustCall("DELETE", "/sandboxes/"+a, nil, nil)
	ts.mustCall("DELETE", "/sandboxes/"+b, nil, nil)
	assertNothingLeft(t, ts)
}

// The lease's root can neither take the agent's port nor bind another
// below 1024: the namespace is the host's, not the lease's.
func TestSelfPortCannotBeTakenOver(t *testing.T) {
	ts := selfServer(t)
	sb := ts.createLease()
	const bind = `
import os, socket
print("uid", os.getuid())
for port, reuse in ((1029, True), (80, False)):
    s = socket.socket()
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind(("127.0.0.1", port)); print(port, "bound")
    except OSError as e:
        print(port, type(e).__name__)
`
	if status := ts.putFile(sb, "/workspace/bind.py", bind); status != http.StatusOK {
		t.Fatalf("putting the script: %d", status)
	}
	got := ts.exec(sb, "python3 /workspace/bind.py").Stdout
	if want := "uid 0\n1029 OSError\n80 PermissionError\n"; got != want {
		t.Errorf("binding in the lease as its root:\n%s\nwant\n%s", got, want)
	}
	ts.mustCall("DELETE", "/sandboxes/"+sb, nil, nil)
}

// Anything but a bodiless POST to /self/pause or /self/delete is refused
// and changes nothing.
func TestSelfRefusesOtherRequests(t *testing.T) {
	ts := selfServer(t)
	sb := ts.createLease()
	ts.putSelfSignal(sb)
	for _, c := range []struct{ args, want string }{
		{"/self/pause GET", "405"},
		{"/self/delete PUT", "405"},
		{"/self/pause POST body", "413"},
		{"/self/stop", "404"},
		{"/self/pause/x", "404"},
		{"/v1/sandboxes", "404"},
	} {
		if got := strings.TrimSpace(ts.exec(sb, "python3 /workspace/self.py "+c.args).Stdout); got != c.want {
			t.Errorf("%s: %q, want %s", c.args, got, c.want)
		}
	}
	if st := ts.status(sb); st != "running" {
		t.Errorf("the lease is %s", st)
	}
	ts.mustCall("DELETE", "/sandboxes/"+sb, nil, nil)
}

// The official TS SDK's selfPause and selfDelete, run by the host's node
// in the lease's network namespace (the lease image has no node): the
// SDK's own wire, answered 202.
func TestOfficialSDKSelfSignal(t *testing.T) {
	node, npm := lookTool(t, "node"), lookTool(t, "npm")
	nsenter := lookTool(t, "nsenter")
	ts := selfServer(t)
	dir := t.TempDir()
	installSDK(t, npm, dir)
	call := func(lease, fn string) {
		t.Helper()
		script := `import("@nodeops-createos/sandbox").then(m => m.` + fn + `("from the sdk")).then(() => console.log("ok"), e => console.log(String(e)))`
		cmd := exec.Command(nsenter, "--net=/proc/"+strconv.Itoa(ts.leaseInit(lease))+"/ns/net", node, "-e", script)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil || string(out) != "ok\n" {
			t.Errorf("%s: %q %v", fn, out, err)
		}
	}
	a, b := ts.createLease(), ts.createLease()
	call(a, "selfPause")
	waitStatus(t, ts, a, "paused")
	call(b, "selfDelete")
	waitStatus(t, ts, b, "destroyed")
	ts.mustCall("DELETE", "/sandboxes/"+a, nil, nil)
	assertNothingLeft(t, ts)
}

// The self API is the lease's own: no preview URL (which carries no key)
// reaches it, in either form.
func TestSelfIsNoPreview(t *testing.T) {
	ts := selfServer(t)
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	req, _ := http.NewRequest("POST", "http://"+ts.addr()+"/self/delete", nil)
	req.Host = previewHost(sb.ID, 1029, ts.addr())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("the preview host of port 1029: %d, want 403", resp.StatusCode)
	}
	// The address form: port 1029 is never published (the next port a
	// server listens on is, so the publisher has looked).
	ts.startProcess(sb.ID, "exec python3 -m http.server 1030 --bind 127.0.0.1")
	ts.waitListening(sb.ID, 1030)
	waitPublished(t, previewAddrURL(t, sb.IngressURLTemplate, 1030))
	if status, body := openPreview(t, previewAddrURL(t, sb.IngressURLTemplate, 1029)+"/self/pause"); status != 0 {
		t.Errorf("the preview address's port 1029: %d %q, want no listener", status, body)
	}
	if st := ts.status(sb.ID); st != "running" {
		t.Errorf("the lease is %s", st)
	}
	ts.mustCall("DELETE", "/sandboxes/"+sb.ID, nil, nil)
}
