package localsandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"golang.org/x/sys/unix"
)

// A lease init is cloned by the server's spawner (a small process, the
// init program), not by the server: a clone into a new user namespace
// copies the page tables of the process that clones, so cloned by the
// server a create cost more the more memory the server's process held —
// in the devserver, which holds the Temporal server too, 14 ms became
// 25 ms after the bench's first parts (docs/PERFORMANCE.md, 2026-12-07).
// Killed, the spawner takes its leases' inits with it (their parent-death
// signal): those leases are destroyed cleanly, the next create starts
// another spawner, and Shutdown leaves none behind.
func TestLeaseInitsAreClonedByTheSpawner(t *testing.T) {
	ts := startServer(t, Options{})
	if ts.srv.isolation != IsolationNamespaces {
		testenv.Missing(t, "namespace isolation: process-group mode has no lease init") // a non-root server without user namespaces
	}
	first, second := ts.createLease(), ts.createLease()
	spawner := parentPid(t, ts.leaseInit(first))
	if spawner == os.Getpid() {
		t.Fatal("the server cloned the lease init itself")
	}
	if p := parentPid(t, ts.leaseInit(second)); p != spawner {
		t.Errorf("the leases' inits have different parents: %d and %d", spawner, p)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", spawner))
	if want := leaseinit.Arg0 + "\x00-\x00" + leaseinit.SpawnerArg + "\x00"; string(cmdline) != want {
		t.Fatalf("the inits' parent is %q, want the spawner %q", cmdline, want)
	}
	if parentPid(t, spawner) != os.Getpid() {
		t.Errorf("the spawner is not the server's child")
	}
	if r := ts.exec(first, "echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("an exec in a lease the spawner started: %+v", r)
	}

	// The spawner dies: its inits die with it.
	initPid := ts.leaseInit(first)
	if err := syscall.Kill(spawner, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitExit(t, initPid)
	for _, lease := range []string{first, second} {
		ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
	}
	third := ts.createLease()
	if r := ts.exec(third, "echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("an exec in a lease created after the spawner died: %+v", r)
	}
	respawned := parentPid(t, ts.leaseInit(third))
	ts.mustCall("DELETE", "/sandboxes/"+third, nil, nil)
	if st, _ := ts.srv.Stats(); st.Leases != 0 || st.Processes != 0 {
		t.Errorf("after the destroys: %+v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ts.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", respawned)); !os.IsNotExist(err) {
		t.Errorf("the spawner %d is still there after Shutdown", respawned)
	}
}

// parentPid is pid's parent, from /proc/PID/stat.
func parentPid(t *testing.T, pid int) int {
	t.Helper()
	ppid, err := readParentPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// readParentPid reads pid's parent from /proc/PID/stat.
func readParentPid(pid int) (int, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, stat)
	}
	return strconv.Atoi(f[1])
}

// awaitExit waits until pid has exited (its pidfd polls readable).
func awaitExit(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10_000)
	if err != nil || n != 1 {
		t.Fatalf("process %d did not exit within 10 s (%v)", pid, err)
	}
}

// A lease holds no socket of the server's or of its spawner's: the init is
// cloned with its own control socket at descriptor 3, over the spawner's
// socket to the server, and nothing else of either is inherited — so no
// process of a lease, the init or one a command left running, can send
// the spawner a request or the server a reply.
func TestALeaseHoldsNoSocketOfTheServersOrTheSpawners(t *testing.T) {
	ts := startServer(t, Options{})
	if ts.srv.isolation != IsolationNamespaces {
		testenv.Missing(t, "namespace isolation: process-group mode has no lease init")
	}
	lease := ts.createLease()
	if r := ts.exec(lease, "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo started"); r.Stdout != "started\n" {
		t.Fatalf("exec: %+v", r)
	}
	init := ts.leaseInit(lease)
	spawner := parentPid(t, init)
	theirs := map[string]bool{}
	for _, pid := range []int{os.Getpid(), spawner} {
		for _, s := range sockets(t, pid) {
			theirs[s] = true
		}
	}
	if len(theirs) == 0 {
		t.Fatal("found no socket of the server's or the spawner's to compare with")
	}
	held := 0
	for _, pid := range append([]int{init}, descendants(t, init)...) {
		for _, s := range sockets(t, pid) {
			held++
			if theirs[s] {
				t.Errorf("process %d of the lease holds %s, which the server or its spawner holds", pid, s)
			}
		}
	}
	if held == 0 {
		t.Error("the lease's processes hold no socket at all: the init's control socket is missing, the check saw nothing")
	}
}

// sockets lists the socket descriptors pid holds ("socket:[inode]").
func sockets(t *testing.T, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if link, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(link, "socket:") {
			out = append(out, link)
		}
	}
	return out
}

// descendants lists pid's descendants, from every process's parent.
func descendants(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := readParentPid(p); err == nil { // else gone meanwhile
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}
