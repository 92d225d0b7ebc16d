package localsandbox

import (
	"net/http"
	"os"
	"testing"
	"time"
)

// The done-when of fork: write a file, pause, fork, change it in the fork,
// resume the source, read both. (Before there was a fork route: 404.)
func TestForkCopiesTheFilesNotTheProcesses(t *testing.T) {
	ts := startServer(t, Options{})
	src := ts.createLease()
	r := ts.exec(src, `set -e
		echo original > /workspace/f; echo original > /etc/forked; echo t > /tmp/t
		rm /etc/hostname
		useradd -M forky 2>/dev/null || true
		sh -c 'exec sleep 1000' >/dev/null 2>&1 &`)
	if r.ExitCode != 0 {
		t.Fatalf("setting up the source: %+v", r)
	}
	if status := ts.call("POST", "/sandboxes/"+src+"/fork", nil, nil); status != http.StatusConflict {
		t.Errorf("fork of a running sandbox: %d, want 409", status)
	}
	ts.mustCall("POST", "/sandboxes/"+src+"/pause", nil, nil)
	waitStatus(t, ts, src, "paused")
	var fork struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		ForkedFrom string `json:"forked_from"`
	}
	ts.mustCall("POST", "/sandboxes/"+src+"/fork", map[string]any{"labels": map[string]string{"role": "fork"}}, &fork)
	if fork.Status != "forking" || fork.ForkedFrom != src || fork.ID == "" || fork.ID == src {
		t.Fatalf("fork answered %+v", fork)
	}
	waitStatus(t, ts, fork.ID, "running")

	r = ts.exec(fork.ID, `cat /workspace/f /etc/forked /tmp/t; [ -e /etc/hostname ] && echo "whiteout lost"
		grep -c '^forky:' /etc/passwd; ps -eo args= | grep -c '^sleep 1000'
		echo changed > /workspace/f; echo changed > /etc/forked`)
	users := "1"
	if os.Geteuid() != 0 {
		users = "0" // a server that is not root maps no ids for users
	}
	if r.Stdout != "original\noriginal\nt\n"+users+"\n0\n" {
		t.Errorf("in the fork: %q (stderr %q), want the source's files and none of its processes", r.Stdout, r.Stderr)
	}
	ts.mustCall("POST", "/sandboxes/"+src+"/resume", nil, nil)
	waitStatus(t, ts, src, "running")
	if r := ts.exec(src, `cat /workspace/f /etc/forked; ps -eo args= | grep -c '^sleep 1000'`); r.Stdout != "original\noriginal\n1\n" {
		t.Errorf("the source after the fork changed its copy: %q", r.Stdout)
	}
	if r := ts.exec(fork.ID, `cat /workspace/f /etc/forked`); r.Stdout != "changed\nchanged\n" {
		t.Errorf("the fork: %q", r.Stdout)
	}
	var list struct{ Data []sandboxData }
	ts.mustCall("GET", "/sandboxes?label=role=fork", nil, &list)
	if len(list.Data) != 1 || list.Data[0].ID != fork.ID {
		t.Errorf("the fork's labels: %+v", list.Data)
	}
	if status := ts.call("POST", "/sandboxes/sb-none/fork", nil, nil); status != http.StatusNotFound {
		t.Errorf("fork of an unknown sandbox: %d", status)
	}
}

// A fork destroyed while it is being made, and its source destroyed
// meanwhile, leave nothing behind (startServer checks).
func TestForkDestroyedWhileForking(t *testing.T) {
	ts := startServer(t, Options{})
	src := ts.createLease()
	ts.exec(src, `head -c 10000000 /dev/urandom > /workspace/big`)
	ts.mustCall("POST", "/sandboxes/"+src+"/pause", nil, nil)
	waitStatus(t, ts, src, "paused")
	var fork struct {
		ID string `json:"id"`
	}
	ts.mustCall("POST", "/sandboxes/"+src+"/fork", nil, &fork)
	if status := ts.call("POST", "/sandboxes/"+src+"/resume", nil, nil); status != http.StatusConflict && status != http.StatusOK {
		t.Errorf("resume while being forked: %d", status)
	}
	ts.mustCall("DELETE", "/sandboxes/"+fork.ID, nil, nil)
	ts.mustCall("DELETE", "/sandboxes/"+src, nil, nil)
}

// An idle sandbox with auto_pause_after_seconds pauses itself, by the
// freezer; resume brings it back. (Seconds are milliseconds here.)
func TestAutoPausePausesAnIdleSandbox(t *testing.T) {
	ts := startServer(t, Options{autoPauseUnit: time.Millisecond})
	var sb sandboxData
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "auto_pause_after_seconds": 60}, &sb)
	lease := sb.ID
	// Busy while an exec runs, however long: it is not paused under it.
	if r := ts.exec(lease, `sleep 0.3; echo awake`); r.Stdout != "awake\n" {
		t.Errorf("exec: %+v", r)
	}
	waitStatus(t, ts, lease, "paused")
	if status := ts.call("POST", "/sandboxes/"+lease+"/exec", map[string]any{"cmd": "true"}, nil); status != http.StatusConflict {
		t.Errorf("exec in an auto-paused sandbox: %d, want 409", status)
	}
	ts.mustCall("POST", "/sandboxes/"+lease+"/resume", nil, nil)
	waitStatus(t, ts, lease, "running")
	if r := ts.exec(lease, `echo back`); r.Stdout != "back\n" {
		t.Errorf("after resume: %+v", r)
	}
	waitStatus(t, ts, lease, "paused") // and idle again
	for _, bad := range []int{1, 59, 86401} {
		if status := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "auto_pause_after_seconds": bad}, nil); status != http.StatusBadRequest {
			t.Errorf("auto_pause_after_seconds %d: %d, want 400", bad, status)
		}
	}
	// Without it, a sandbox never pauses itself.
	other := ts.createLease()
	ts.exec(other, `sleep 0.2`)
	if st := ts.status(other); st != "running" {
		t.Errorf("a sandbox without auto-pause is %q", st)
	}
}

// The official fork body: envs replace the source's, start_paused leaves
// the fork paused, bandwidth_quota_bytes is tolerated, ssh_pubkeys refused.
func TestForkTakesTheOfficialBody(t *testing.T) {
	ts := startServer(t, Options{})
	var src officialView
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "envs": map[string]string{"WHO": "source"},
		"auto_pause_after_seconds": 600}, &src)
	ts.mustCall("POST", "/sandboxes/"+src.ID+"/pause", nil, nil)
	waitStatus(t, ts, src.ID, "paused")
	if status := ts.call("POST", "/sandboxes/"+src.ID+"/fork", map[string]any{"ssh_pubkeys": []string{"ssh-ed25519 AAAA"}}, nil); status != http.StatusBadRequest {
		t.Errorf("fork with ssh_pubkeys: %d, want 400", status)
	}
	var plain, paused officialView
	ts.mustCall("POST", "/sandboxes/"+src.ID+"/fork", map[string]any{"bandwidth_quota_bytes": 0}, &plain)
	ts.mustCall("POST", "/sandboxes/"+src.ID+"/fork", map[string]any{"start_paused": true, "envs": map[string]string{"WHO": "fork"}}, &paused)
	for _, f := range []officialView{plain, paused} {
		if f.Status != "forking" || f.ForkedFrom != src.ID || f.Name == "" || f.Name == src.Name || f.AutoPause != 600 {
			t.Errorf("fork answered %+v", f)
		}
	}
	waitStatus(t, ts, plain.ID, "running")
	waitStatus(t, ts, paused.ID, "paused")
	if r := ts.exec(plain.ID, `echo $WHO`); r.Stdout != "source\n" {
		t.Errorf("the fork inherits the envs: %+v", r)
	}
	ts.mustCall("POST", "/sandboxes/"+paused.ID+"/resume", nil, nil)
	waitStatus(t, ts, paused.ID, "running")
	if r := ts.exec(paused.ID, `echo $WHO`); r.Stdout != "fork\n" {
		t.Errorf("the fork's own envs: %+v", r)
	}
}
