package localsandbox

import (
	"encoding/json"
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

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
)

// floodSender opens as many flows to 10.0.2.2 as it can, up to n: TCP
// connections to <port> ("tcp"), or UDP datagrams to n ports from
// <port> on ("udp"). It holds them and prints, as JSON, how many went out
// and why the others did not. For TCP it then closes them all and
// connects once more: a connection counts until both sides closed it,
// which the far side does in its own time, so that one may be refused a
// few times first.
const floodSender = `
import json, socket, sys, time
proto, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held, why = [], {}
for i in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(10)
    try:
        if proto == "tcp":
            s.connect(("10.0.2.2", port))
        else:
            s.sendto(b"x", ("10.0.2.2", port + i))
        held.append(s)
    except OSError as e:
        why[type(e).__name__] = why.get(type(e).__name__, 0) + 1
        s.close()
after = ""
if proto == "tcp":
    for s in held:
        s.close()
    for _ in range(200):
        try:
            socket.create_connection(("10.0.2.2", port), timeout=10).close(); after = "connected"; break
        except ConnectionRefusedError:
            time.sleep(0.05)
print(json.dumps({"out": len(held), "why": why, "after": after}))
`

// floodResult is what floodSender printed.
type floodResult struct {
	Out   int            `json:"out"`
	Why   map[string]int `json:"why"`
	After string         `json:"after"`
}

// flood runs floodSender in lease.
func (ts *testServer) flood(lease, proto string, port, n int) floodResult {
	ts.t.Helper()
	r := ts.exec(lease, fmt.Sprintf("python3 /workspace/flood.py %s %d %d", proto, port, n))
	var res floodResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		ts.t.Fatalf("the flood: %q %q", r.Stdout, r.Stderr)
	}
	return res
}

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
	sb, udp, other := ts.createWith(nil), ts.createWith(nil), ts.createWith(nil)
	for _, lease := range []string{sb.ID, udp.ID} {
		if status := ts.putFile(lease, "/workspace/flood.py", floodSender); status != http.StatusOK {
			t.Fatalf("upload: %d", status)
		}
	}
	refused := func(proto string, res floodResult, why string) {
		t.Helper()
		if res.Out != capped || res.Why[why] != flood-capped || len(res.Why) != 1 {
			t.Errorf("%s flood: %+v, want %d out and the rest refused (%s)", proto, res, capped, why)
		}
	}
	res := ts.flood(sb.ID, "tcp", port, flood)
	refused("TCP", res, "ConnectionRefusedError")
	if res.After != "connected" {
		t.Errorf("a connection once the flood's closed: %q", res.After)
	}
	// UDP flows count alike (each is a socket of slirp4netns too); the
	// kernel refuses their datagrams at once.
	refused("UDP", ts.flood(udp.ID, "udp", 20000, flood), "PermissionError")
	if got := ts.fetch(other.ID, "10.0.2.2", hostServer(t, "still here")); got != "still here" {
		t.Errorf("another lease during the flood: %q", got)
	}
	ts.srv.mu.Lock()
	slirp := ts.srv.leases[sb.ID].net.SlirpPID()
	ts.srv.mu.Unlock()
	if n := openFilesLimit(t, slirp); n > capped+network.SlirpOwnFiles {
		t.Errorf("slirp4netns may open %d descriptors, want at most %d", n, capped+network.SlirpOwnFiles)
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
	if !lm.Enforces("cpu") {
		testenv.Missing(t, "the server has no cpu cgroup")
	}
	sb := ts.createWith(nil)
	ts.srv.mu.Lock()
	slirp := strconv.Itoa(ts.srv.leases[sb.ID].net.SlirpPID())
	ts.srv.mu.Unlock()
	dirs := lm.Dirs(sb.ID)
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
