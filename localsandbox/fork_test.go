package localsandbox

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"golang.org/x/sys/unix"
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
// freezer; resume brings it back. (A second is 5 ms here: 60 of them
// leave a loaded machine time to send the next request after a resume.)
func TestAutoPausePausesAnIdleSandbox(t *testing.T) {
	ts := startServer(t, Options{autoPauseUnit: 5 * time.Millisecond})
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
// the fork paused (and is answered so), bandwidth_quota_bytes is tolerated,
// a bad SSH key refused.
func TestForkTakesTheOfficialBody(t *testing.T) {
	ts := startServer(t, Options{})
	var src officialView
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "envs": map[string]string{"WHO": "source"},
		"auto_pause_after_seconds": 600}, &src)
	ts.mustCall("POST", "/sandboxes/"+src.ID+"/pause", nil, nil)
	waitStatus(t, ts, src.ID, "paused")
	if status := ts.call("POST", "/sandboxes/"+src.ID+"/fork", map[string]any{"ssh_pubkeys": []string{"ssh-ed25519 AAAA"}}, nil); status != http.StatusBadRequest {
		t.Errorf("fork with a bad SSH key: %d, want 400", status)
	}
	var plain, paused officialView
	ts.mustCall("POST", "/sandboxes/"+src.ID+"/fork", map[string]any{"bandwidth_quota_bytes": 0}, &plain)
	ts.mustCall("POST", "/sandboxes/"+src.ID+"/fork", map[string]any{"start_paused": true, "envs": map[string]string{"WHO": "fork"}}, &paused)
	// A fork asked to start paused is answered once it is: before, it
	// answered "forking" and the client had to poll.
	for f, want := range map[*officialView]string{&plain: "forking", &paused: "paused"} {
		if f.Status != want || f.ForkedFrom != src.ID || f.Name == "" || f.Name == src.Name || f.AutoPause != 600 {
			t.Errorf("fork answered %+v, want %s", f, want)
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

// tmpfsRoot mounts a tmpfs of mib MiB for a server's root (the host's
// disk, small enough to fill) and returns the root's path in it; it is
// unmounted after the server has shut down.
func tmpfsRoot(t *testing.T, mib int) string {
	t.Helper()
	testenv.RequireRoot(t, "a disk of its own needs root")
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dm", mib)); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) }) // runs after the server's cleanup
	return filepath.Join(dir, "root")
}

// forkAndWait forks the paused sandbox src and waits for the fork to run
// or fail; it returns the fork's status, or the HTTP status of a refusal.
func (ts *testServer) forkAndWait(src string) (id, status string) {
	ts.t.Helper()
	var fork struct {
		ID string `json:"id"`
	}
	if code := ts.call("POST", "/sandboxes/"+src+"/fork", nil, &fork); code != http.StatusOK {
		return "", strconv.Itoa(code)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) { // polled, as clients do
		if st := ts.status(fork.ID); st != "forking" {
			return fork.ID, st
		}
		if time.Now().After(deadline) {
			ts.t.Fatalf("fork %s still forking", fork.ID)
		}
	}
}

// Forks as a disk-exhaustion vector: each fork copies what its source
// wrote onto the host's disk, in one request. Before, on a 320 MiB host
// disk, a lease that wrote 120 MiB was forked three times, each fork
// "running" and reading its copy back from the page cache, while the host's
// file system was full and the kernel failed to write the forks' data back
// into their images (ext4: "error while async write back metadata"); a
// write of 20 MiB by another lease, within its own 64 MiB disk, then failed
// once it went to the host. Now a fork (as a create) is refused, with a 503
// before anything is copied, unless the host's file system keeps room for
// what is promised to it (what the copies in flight will write, what the
// leases wrote that is not yet on the host) and a reserve (a twentieth of
// it, at most 256 MiB).
func TestForksCannotFillTheHostsDisk(t *testing.T) {
	ts := startServer(t, Options{Root: tmpfsRoot(t, 320)})
	if ts.srv.diskErr != nil {
		testenv.Missing(t, fmt.Sprintf("disks are not bounded here: %v", ts.srv.diskErr))
	}
	other := ts.createWith(map[string]any{"disk_mib": 64}).ID
	src := ts.createWith(map[string]any{"disk_mib": 192}).ID
	if r := ts.exec(src, `head -c 120M /dev/urandom > /workspace/blob`); r.ExitCode != 0 {
		t.Fatalf("writing the source: %+v", r)
	}
	ts.mustCall("POST", "/sandboxes/"+src+"/pause", nil, nil)
	waitStatus(t, ts, src, "paused")
	var outcomes []string
	for range 3 {
		_, st := ts.forkAndWait(src)
		outcomes = append(outcomes, st)
		if st != "running" {
			break
		}
	}
	if !slices.Equal(outcomes, []string{"running", "503"}) {
		t.Errorf("forks of a 120 MiB lease on a 320 MiB host disk: %q, want one running, then 503", outcomes)
	}
	// Written through to the host (the page cache would take it either way).
	if r := ts.exec(other, `dd if=/dev/zero of=/workspace/f bs=1M count=20 oflag=direct conv=fsync status=none && echo ok`); r.Stdout != "ok\n" {
		t.Errorf("another lease writing 20 MiB of its 64: %q %q", r.Stdout, r.Stderr)
	}
}

// With a disk budget, the disks of all sandboxes together (their disk_mib)
// stay within it: a create or fork past it is refused before anything is
// made, and a destroyed sandbox gives its disk back.
func TestDiskBudgetBoundsTheSumOfTheDisks(t *testing.T) {
	ts := startServer(t, Options{DiskBudgetMiB: 300})
	if ts.srv.diskErr != nil {
		testenv.Missing(t, fmt.Sprintf("disks are not bounded here: %v", ts.srv.diskErr))
	}
	a := ts.createWith(map[string]any{"disk_mib": 128}).ID
	b := ts.createWith(map[string]any{"disk_mib": 128}).ID
	if status := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "disk_mib": 64}, nil); status != http.StatusServiceUnavailable {
		t.Errorf("a create past the budget: %d, want 503", status)
	}
	ts.mustCall("POST", "/sandboxes/"+a+"/pause", nil, nil)
	waitStatus(t, ts, a, "paused")
	if _, st := ts.forkAndWait(a); st != "503" {
		t.Errorf("a fork past the budget: %s, want 503", st)
	}
	if entries, _ := os.ReadDir(filepath.Join(ts.root, leasesDir)); len(entries) != 2 {
		t.Errorf("%d lease directories after the refusals, want 2", len(entries))
	}
	ts.mustCall("DELETE", "/sandboxes/"+b, nil, nil)
	if _, st := ts.forkAndWait(a); st != "running" {
		t.Errorf("a fork once a sandbox gave its disk back: %s", st)
	}
}

// A fork's view says plainly that the source's processes were not carried
// ([ext] processes_carried: false; the official view has no field for it),
// and they were not: a server running in the source is not in the fork.
func TestForkSaysItsProcessesWereNotCarried(t *testing.T) {
	ts := startServer(t, Options{})
	src := ts.createLease()
	ts.startProcess(src, `sleep 600`)
	ts.mustCall("POST", "/sandboxes/"+src+"/pause", nil, nil)
	waitStatus(t, ts, src, "paused")
	type view struct {
		ID               string
		ProcessesCarried *bool `json:"processes_carried"`
	}
	var fork, source view
	ts.mustCall("POST", "/sandboxes/"+src+"/fork", map[string]any{"start_paused": true}, &fork)
	ts.mustCall("GET", "/sandboxes/"+src, nil, &source)
	if fork.ProcessesCarried == nil || *fork.ProcessesCarried || source.ProcessesCarried != nil {
		t.Errorf("processes_carried: fork %v, source %v; want false, absent", fork.ProcessesCarried, source.ProcessesCarried)
	}
	ts.mustCall("POST", "/sandboxes/"+fork.ID+"/resume", nil, nil)
	waitStatus(t, ts, fork.ID, "running")
	var procs struct{ Processes []any }
	ts.mustCall("GET", "/sandboxes/"+fork.ID+"/processes", nil, &procs)
	if r := ts.exec(fork.ID, `pgrep -c sleep || true`); len(procs.Processes) != 0 || r.Stdout != "0\n" {
		t.Errorf("the fork holds %d processes, pgrep says %q", len(procs.Processes), r.Stdout)
	}
}
