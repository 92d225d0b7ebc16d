package localsandbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// floodSender opens as many connections to 10.0.2.2:<port> as it can, up to
// n, holds them, prints how many connected and why the others did not,
// closes them all, then connects once more: a flow counts until both sides
// closed it, which the far side does in its own time, so that one may be
// refused a few times first.
const floodSender = `
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held, why = [], {}
for _ in range(n):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect(("10.0.2.2", port)); held.append(s)
    except OSError as e:
        why[type(e).__name__] = why.get(type(e).__name__, 0) + 1
        s.close()
print(len(held), sorted(why.items()))
for s in held:
    s.close()
for _ in range(200):
    try:
        socket.create_connection(("10.0.2.2", port), timeout=10).close(); print("after: connected"); break
    except ConnectionRefusedError:
        time.sleep(0.05)
else:
    print("after: refused")
`

// sinkServer accepts connections on the host's loopback and holds them
// until they close; it returns its port.
func sinkServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				io.Copy(io.Discard, c)
				c.Close()
			})
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// A lease opening connections outward as fast as it can. Each is a socket
// of its slirp4netns on the host, whose descriptor limit was the server's
// own (20,000 here; often far more under a service manager): before the
// cap, a lease held 10,767 connections after two minutes (slirp4netns 10,778
// descriptors, and slower with every one, as libslirp polls them all) and
// would have gone on to the limit, each lease as much; the server and the
// other leases kept working, the host's descriptors did not stay bounded.
// Now the lease's own egress table refuses a new connection past
// MaxEgressConnections (conntrack's count of the lease's flows, in the
// kernel, at once with a reset), and slirp4netns's descriptors are capped
// just above it.
func TestEgressConnectionFloodIsCapped(t *testing.T) {
	needNetwork(t)
	const capped, flood = 100, 300
	ts := startServer(t, Options{Egress: EgressAny, EgressHostLoopback: true, MaxEgressConnections: capped})
	port := sinkServer(t)
	sb := ts.createWith(nil)
	other := ts.createWith(nil)
	if status := ts.putFile(sb.ID, "/workspace/flood.py", floodSender); status != http.StatusOK {
		t.Fatalf("upload: %d", status)
	}
	r := ts.exec(sb.ID, fmt.Sprintf("python3 /workspace/flood.py %d %d", port, flood))
	if want := fmt.Sprintf("%d [('ConnectionRefusedError', %d)]\nafter: connected\n", capped, flood-capped); r.Stdout != want {
		t.Errorf("the flood: %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}
	if got := ts.fetch(other.ID, "10.0.2.2", hostServer(t, "still here")); got != "still here" {
		t.Errorf("another lease during the flood: %q", got)
	}
	ts.srv.mu.Lock()
	slirp := ts.srv.leases[sb.ID].net.slirp.Process.Pid
	ts.srv.mu.Unlock()
	if n := openFilesLimit(t, slirp); n > capped+slirpOwnFiles {
		t.Errorf("slirp4netns may open %d descriptors, want at most %d", n, capped+slirpOwnFiles)
	}
}

// openFilesLimit reads the soft RLIMIT_NOFILE of pid.
func openFilesLimit(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(strings.TrimPrefix(line, "Max open files")); len(f) >= 2 && strings.HasPrefix(line, "Max open files") {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("limits: %q", line)
			}
			return n
		}
	}
	t.Fatal("no open files limit")
	return 0
}

// A lease's traffic costs its slirp4netns, on the host, several times the
// CPU it costs the lease: before, slirp4netns ran in the server's cgroup,
// so a 1-vCPU lease sending 512 MiB used 0.17 s of CPU inside its quota and
// 1.04 s outside it, and a lease sending without pause had most of a core
// beyond its shape. Now slirp4netns runs in the lease's cgroup: its CPU,
// memory and tasks count against the lease's shape (and a pause freezes it).
func TestEgressPathCountsAgainstTheLeasesShape(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAny})
	lm := ts.srv.limiter
	if !lm.enforces("cpu") {
		t.Skip("the server has no cpu cgroup")
	}
	sb := ts.createWith(nil)
	ts.srv.mu.Lock()
	slirp := strconv.Itoa(ts.srv.leases[sb.ID].net.slirp.Process.Pid)
	ts.srv.mu.Unlock()
	var dirs []string
	if lm.version == cgroupV2 {
		dirs = []string{filepath.Join(cgroupRoot, lm.parent, sb.ID)}
	}
	for _, c := range lm.v1 {
		dirs = append(dirs, filepath.Join(cgroupRoot, c, lm.parent, sb.ID))
	}
	for _, dir := range dirs {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(strings.Fields(string(procs)), slirp) {
			t.Errorf("slirp4netns (%s) is not in the lease's group %s: %q", slirp, dir, procs)
		}
	}
	// Paused (frozen with its network), then destroyed: nothing is left.
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/pause", nil, nil)
	waitStatus(t, ts, sb.ID, "paused")
	ts.mustCall("DELETE", "/sandboxes/"+sb.ID, nil, nil)
	for _, dir := range dirs {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the lease's group %s is left: %v", dir, err)
		}
	}
}
