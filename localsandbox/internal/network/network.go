package network

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// A lease's network.
//
// When the server is root it makes each lease's network namespace itself,
// before the lease init starts, and starts the init inside it; the
// namespace is then owned by the host's user namespace, not the lease's,
// so nothing in the lease (its root included) can change its interfaces
// or its firewall. The server brings up its loopback and installs the
// egress table (egress.go). A server that is not root cannot make such a
// namespace: its leases get one of their own (loopback only, as the init
// makes it), no egress and no ingress.
//
// The outward path, with Options.Egress other than off, is slirp4netns
// (Debian's package of the same name), started by the server for each
// lease and attached to its namespace: user-mode networking, a TAP device
// tap0 (10.0.2.100/24, gateway 10.0.2.2; its resolver 10.0.2.3 disabled:
// the lease's resolver is the server's filter, dns.go) whose TCP and UDP
// flows slirp4netns re-creates as ordinary sockets of its own on the
// host. Why slirp4netns rather than a veth pair with NAT: it needs no
// change to the host's network configuration (no forwarding, no NAT
// rules, no addresses), so a lease cannot reach anything the server
// itself could not; it is maintained (rootless Podman's and Docker's
// default) and runs sandboxed (--enable-sandbox --enable-seccomp); it
// exits with the server (its exit descriptor, and a parent-death signal).
// Its price is throughput (a user-space TCP stack; see
// BenchmarkEgressThroughput) and one small process per lease.
//
// The host's loopback is NOT reachable from a lease (slirp4netns
// --disable-host-loopback): otherwise 10.0.2.2 would reach every service
// bound to the host's 127.0.0.1, this server's API among them. Tests and
// developers who want it set Options.EgressHostLoopback; the egress rules
// still apply (a rule "10.0.2.2:8080" then means the host's
// 127.0.0.1:8080).
//
// With egress off no slirp4netns runs: a lease has loopback only.

// Net is a lease's network, as the server holds it.
type Net struct {
	netns *os.File // the lease's network namespace

	slirp     *exec.Cmd
	slirpExit *os.File      // closing it ends slirp4netns
	slirpDone chan struct{} // closed once slirp4netns was reaped

	maxFlows int         // the egress table's cap on the lease's flows
	dns      *leaseDNS   // the lease's resolver (dns.go)
	agent    *leaseAgent // the lease's self API (agent.go)

	mu               sync.Mutex
	egress           Egress
	ingress          bool
	ingressTransport *http.Transport // made on the first preview request
	publisher        *publisher      // the lease's preview address (publish.go)
}

// SlirpOwnFiles are the descriptors slirp4netns may hold beside the
// sockets of its flows (its TAP device, pipes, namespaces, resolver).
const SlirpOwnFiles = 64

// Config is how the server makes its leases' networks.
type Config struct {
	// Slirp4netns is the program of the outward path; empty: none, the
	// lease has its loopback only.
	Slirp4netns string
	// HostLoopback lets the lease reach the host's 127.0.0.1 at 10.0.2.2
	// (for tests only).
	HostLoopback bool
	// MaxFlows caps the outward flows the lease holds at once.
	MaxFlows int
	// Marker is an environment variable (NAME=value) slirp4netns carries,
	// by which a server restarted on the same root finds it.
	Marker string
	// Cgroup is the lease's control group, which slirp4netns joins (nil:
	// none).
	Cgroup interface{ AddProc(pid int) error }
	// DNSUpstream is where the lease's resolver forwards queries when its
	// egress is "*" (DNSUpstream's result).
	DNSUpstream []string
	// Agent serves the lease's self API at AgentAddr inside its
	// namespace (agent.go); nil: the lease has none.
	Agent http.Handler
}

// New makes a lease's network namespace, with loopback up, the egress
// table in place and, with cfg.Slirp4netns, slirp4netns attached (in
// cfg.Cgroup): the lease gets egress (and ingress when asked). Only a
// server running as root can: the namespace must belong to the host's
// user namespace.
func New(cfg Config, egress Egress, ingress bool) (_ *Net, err error) {
	ns, err := newNetns()
	if err != nil {
		return nil, fmt.Errorf("the lease's network namespace: %w", err)
	}
	n := &Net{netns: ns, egress: egress, ingress: ingress, maxFlows: cfg.MaxFlows}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if err := inNetns(ns, leaseinit.LoopbackUp); err != nil {
		return nil, err
	}
	if cfg.Agent != nil {
		// Before the lease init starts: no process of the lease ever
		// sees the port free.
		if n.agent, err = serveAgent(ns, cfg.Agent); err != nil {
			return nil, err
		}
	}
	if cfg.Slirp4netns == "" {
		return n, nil
	}
	// The table first: no packet leaves before the rules are in force.
	if err := applyEgress(int(ns.Fd()), egress, n.maxFlows); err != nil {
		return nil, err
	}
	if n.dns, err = serveDNS(ns, cfg.DNSUpstream, n.egressInForce); err != nil {
		return nil, err
	}
	if err := n.startSlirp(cfg); err != nil {
		return nil, err
	}
	return n, nil
}

// startSlirp attaches slirp4netns to the namespace, in the lease's cgroup,
// and waits until it has configured tap0.
func (n *Net) startSlirp(cfg Config) error {
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	exitR, exitW, err := os.Pipe()
	if err != nil {
		readyW.Close()
		return err
	}
	// Without its resolver (--disable-dns): it would forward any query to
	// the host's, past the egress rules (dns.go).
	args := []string{"--configure", "--mtu=65520", "--enable-sandbox", "--enable-seccomp", "--disable-dns",
		"--ready-fd=3", "--exit-fd=4", "--netns-type=path"}
	if !cfg.HostLoopback {
		args = append(args, "--disable-host-loopback")
	}
	// The namespace by a path of this process: slirp4netns opens it itself
	// (and, given a path, joins no user namespace).
	args = append(args, fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), n.netns.Fd()), "tap0")
	cmd := exec.Command(cfg.Slirp4netns, args...)
	// Marked as the root's, so that leak checks and the sweep find it.
	cmd.Env = []string{cfg.Marker, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.ExtraFiles = []*os.File{readyW, exitR}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 4 << 10}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	readyW.Close()
	exitR.Close()
	if err != nil {
		exitW.Close()
		return fmt.Errorf("starting slirp4netns: %w", err)
	}
	n.slirp, n.slirpExit, n.slirpDone = cmd, exitW, make(chan struct{})
	go func() {
		cmd.Wait()
		close(n.slirpDone)
	}()
	// Its descriptors bounded just above the lease's flows (the egress
	// table caps those), not the server's limit: each flow is a socket of
	// slirp4netns on the host. Nothing of the lease runs yet.
	files := uint64(n.maxFlows + SlirpOwnFiles)
	if err := unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: files, Max: files}, nil); err != nil {
		cmd.Process.Kill()
		<-n.slirpDone
		return fmt.Errorf("limiting slirp4netns's descriptors: %w", err)
	}
	// The lease's traffic costs slirp4netns several times the CPU it costs
	// the lease (a user-space TCP stack): in the lease's cgroup, that CPU
	// and memory count against the lease's shape, not the host's spare
	// cores, and pausing the lease freezes its network too.
	if cfg.Cgroup != nil {
		if err := cfg.Cgroup.AddProc(cmd.Process.Pid); err != nil {
			cmd.Process.Kill()
			<-n.slirpDone
			return fmt.Errorf("slirp4netns into the lease's cgroup: %w", err)
		}
	}
	ready := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := readyR.Read(b[:])
		ready <- err
	}()
	timer := time.NewTimer(leaseinit.StartTimeout)
	defer timer.Stop()
	select {
	case err := <-ready:
		if err == nil {
			return nil
		}
	case <-timer.C:
	}
	cmd.Process.Kill()
	<-n.slirpDone
	return fmt.Errorf("slirp4netns did not get ready: %s", strings.TrimSpace(lastLine(stderr.String()))) // slirp4netns is reaped: nothing writes stderr
}

// SetEgress replaces the egress in force: the next connection follows the
// new rules, established ones keep going.
func (n *Net) SetEgress(set Egress) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.slirp != nil {
		if err := applyEgress(int(n.netns.Fd()), set, n.maxFlows); err != nil {
			return err
		}
	}
	n.egress = set
	return nil
}

// egressInForce is the egress in force, for the lease's resolver.
func (n *Net) egressInForce() Egress {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.egress
}

// State returns the egress in force, whether the lease takes preview
// requests, and whether it has an outward path (slirp4netns).
func (n *Net) State() (egress Egress, ingress, outward bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.egress, n.ingress, n.slirp != nil
}

// SetIngress turns preview requests on or off.
func (n *Net) SetIngress(on bool) {
	n.mu.Lock()
	n.ingress = on
	n.mu.Unlock()
}

// SlirpPID is the pid of the lease's slirp4netns, 0 without one.
func (n *Net) SlirpPID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.slirp == nil {
		return 0
	}
	return n.slirp.Process.Pid
}

// Close ends slirp4netns and releases the namespace (it vanishes with its
// last process). Safe on nil.
func (n *Net) Close() {
	if n == nil {
		return
	}
	n.Unpublish()
	n.mu.Lock()
	slirp, transport := n.slirp, n.ingressTransport
	n.slirp = nil
	n.mu.Unlock()
	if transport != nil {
		transport.CloseIdleConnections()
	}
	n.dns.close()
	n.agent.close()
	if slirp != nil {
		n.slirpExit.Close()
		select {
		case <-n.slirpDone:
		case <-time.After(leaseinit.KillConfirmTimeout):
			slirp.Process.Kill()
			<-n.slirpDone
		}
	}
	n.netns.Close()
}

// Namespace is the lease's network namespace, in which the lease init
// starts (machine.Start) instead of a new one of its own; nil on nil.
func (n *Net) Namespace() *os.File {
	if n == nil {
		return nil
	}
	return n.netns
}

// newNetns makes a network namespace and returns it as an open file.
func newNetns() (*os.File, error) {
	return onThread(func(orig *os.File) (*os.File, error) {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return nil, err
		}
		return os.Open("/proc/thread-self/ns/net")
	})
}

// inNetns runs fn on an OS thread of its own moved into the network
// namespace ns. Sockets fn creates stay in ns.
func inNetns(ns *os.File, fn func() error) error {
	_, err := onThread(func(*os.File) (*os.File, error) {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return nil, fmt.Errorf("entering the lease's network namespace: %w", err)
		}
		return nil, fn()
	})
	return err
}

// onThread runs fn on a locked OS thread and moves the thread back to its
// network namespace afterwards. A thread that cannot go back is never
// used again: its goroutine ends locked, and the runtime ends the thread
// (a lease init started on it then gets its parent-death signal, which is
// tied to the forking thread: the lease ends rather than run unwatched).
func onThread(fn func(orig *os.File) (*os.File, error)) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer orig.Close()
		f, err := fn(orig)
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{f, err}
	}()
	r := <-done
	return r.f, r.err
}

// Counters are the bytes a lease sent out (Tx) and received (Rx) over its
// outward interface.
type Counters struct {
	Rx, Tx int64
}

// ReadCounters reads tap0's counters from /proc/<pid>/net/dev, pid being
// any process in the lease's network namespace.
func ReadCounters(pid int) (Counters, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/dev")
	if err != nil {
		return Counters{}, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) != "tap0" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			return Counters{}, false
		}
		rx, err1 := strconv.ParseInt(f[0], 10, 64)
		tx, err2 := strconv.ParseInt(f[8], 10, 64)
		if err1 != nil || err2 != nil {
			return Counters{}, false
		}
		return Counters{Rx: rx, Tx: tx}, true
	}
	return Counters{}, false
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf *bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
