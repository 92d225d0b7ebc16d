package localsandbox

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

// resize asks for a disk of mib and returns the status and the body.
func (ts *testServer) resizeDisk(lease string, mib int) (int, string) {
	ts.t.Helper()
	return ts.rawCall("POST", "/sandboxes/"+lease+"/resize", map[string]int{"disk_mib": mib})
}

// diskMiB is the sandbox's disk_mib as GET shows it.
func (ts *testServer) diskMiB(lease string) int {
	ts.t.Helper()
	var v struct {
		DiskMiB int `json:"disk_mib"`
	}
	ts.mustCall("GET", "/sandboxes/"+lease, nil, &v)
	return v.DiskMiB
}

// A full disk grows online: a lease that filled its 64 MiB disk writes 32
// MiB more after a resize to 128, and df inside says 128; a paused lease's
// disk grows too. Before anything changes, a size not larger is 400, an
// unknown sandbox 404, a growth past the disk budget 503, each with the
// disk as it was. On a server that cannot grow a mounted disk, resize is
// 400 UNSUPPORTED naming why, and the growth half cannot run.
func TestResizeGrowsTheDiskOnline(t *testing.T) {
	ts := startServer(t, Options{DiskBudgetMiB: 200})
	if ts.srv.diskErr != nil {
		testenv.Missing(t, fmt.Sprintf("disks are not bounded here: %v", ts.srv.diskErr))
	}
	lease := ts.createWith(map[string]any{"disk_mib": 64}).ID
	for _, c := range []struct {
		body   any
		status int
	}{
		{map[string]int{"disk_mib": 64}, http.StatusBadRequest},
		{map[string]int{"disk_mib": 32}, http.StatusBadRequest},
		{map[string]int{"disk_mib": maxDiskMiB + 1}, http.StatusBadRequest},
		{`{"disk_mib": "big"}`, http.StatusBadRequest},
		{nil, http.StatusBadRequest},
	} {
		if status, body := ts.rawCall("POST", "/sandboxes/"+lease+"/resize", c.body); status != c.status {
			t.Errorf("resize %v: %d %s, want %d", c.body, status, body, c.status)
		}
	}
	if status, _ := ts.resizeDisk("sb-nosuchsandbox", 128); status != http.StatusNotFound {
		t.Errorf("resize of an unknown sandbox: %d, want 404", status)
	}
	if ts.srv.resizeErr != nil {
		status, body := ts.resizeDisk(lease, 128)
		if status != http.StatusBadRequest || !strings.Contains(body, `"code":"UNSUPPORTED"`) || !strings.Contains(body, jsonEscape(ts.srv.resizeErr.Error())) {
			t.Errorf("resize where disks cannot grow: %d %s, want 400 UNSUPPORTED naming why", status, body)
		}
		if got := ts.diskMiB(lease); got != 64 {
			t.Errorf("disk_mib after an unsupported resize: %d", got)
		}
		// Not testenv.Missing: the server answers as it must without the
		// capability; what it cannot do here is grow.
		t.Skipf("disks cannot grow here: %v", ts.srv.resizeErr)
	}

	if r := ts.exec(lease, `head -c 100M /dev/zero > /workspace/fill`); r.ExitCode == 0 || !strings.Contains(r.Stderr, "No space left") {
		t.Fatalf("filling a 64 MiB disk: %+v, want ENOSPC", r)
	}
	if status, body := ts.resizeDisk(lease, 256); status != http.StatusServiceUnavailable {
		t.Errorf("a resize past the disk budget: %d %s, want 503", status, body)
	}
	if got := ts.diskMiB(lease); got != 64 {
		t.Errorf("disk_mib after a refused resize: %d", got)
	}
	var grown resizeView
	if status := ts.call("POST", "/sandboxes/"+lease+"/resize", map[string]int{"disk_mib": 128}, &grown); status != http.StatusOK || grown != (resizeView{ID: lease, DiskMiB: 128}) {
		t.Fatalf("resize to 128: %d %+v", status, grown)
	}
	if r := ts.exec(lease, `rm /workspace/fill && head -c 32M /dev/zero > /workspace/fill && sync && head -c 32M /dev/zero > /workspace/more && sync && echo ok`); r.Stdout != "ok\n" {
		t.Errorf("writing 64 MiB after the resize: %+v", r)
	}
	if r := ts.exec(lease, `df -m --output=size /workspace | tail -1`); func() bool {
		n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
		return err != nil || n < 120 || n > 128
	}() {
		t.Errorf("df in the lease after the resize: %q, want about 128 MiB", r.Stdout)
	}
	if got := ts.diskMiB(lease); got != 128 {
		t.Errorf("disk_mib after the resize: %d", got)
	}

	ts.mustCall("POST", "/sandboxes/"+lease+"/pause", nil, nil)
	waitStatus(t, ts, lease, "paused")
	if status, body := ts.resizeDisk(lease, 192); status != http.StatusOK {
		t.Errorf("resize of a paused sandbox: %d %s", status, body)
	}
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
	if status, _ := ts.resizeDisk(lease, 200); status != http.StatusNotFound {
		t.Errorf("resize of a destroyed sandbox: %d, want 404", status)
	}
	// The budget was given back: a new sandbox takes all of it.
	ts.createWith(map[string]any{"disk_mib": 200})
	if m, _ := filepath.Glob(filepath.Join(ts.root, disksDir, "sb-*")); len(m) != 1 {
		t.Errorf("disk images after the destroy: %q, want the new sandbox's only", m)
	}
}

// A server that does not bound disks (process-group isolation) answers
// resize 400 UNSUPPORTED naming why, once the request is valid.
func TestResizeIsUnsupportedWithoutDisks(t *testing.T) {
	dir, err := os.MkdirTemp("", "sandboxd-resize-") // searchable by the commands' uid, as t.TempDir is not
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ts := startServer(t, Options{Isolation: IsolationProcessGroup, Root: filepath.Join(dir, "root")})
	lease := ts.createLease()
	if status, _ := ts.resizeDisk(lease, 1); status != http.StatusBadRequest {
		t.Errorf("a resize not larger: %d, want 400", status)
	}
	status, body := ts.resizeDisk(lease, maxDiskMiB)
	if status != http.StatusBadRequest || !strings.Contains(body, `"code":"UNSUPPORTED"`) || !strings.Contains(body, "does not bound disks") {
		t.Errorf("resize without disks: %d %s", status, body)
	}
}
