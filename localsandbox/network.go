package localsandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
	"golang.org/x/sys/unix"
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
// tap0 (10.0.2.100/24, gateway 10.0.2.2, resolver 10.0.2.3) whose TCP and
// UDP flows slirp4netns re-creates as ordinary sockets of its own on the
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

// leaseNet is a lease's network, as the server holds it.
type leaseNet struct {
	netns *os.File // the lease's network namespace

	slirp     *exec.Cmd
	slirpExit *os.File      // closing it ends slirp4netns
	slirpDone chan struct{} // closed once slirp4netns was reaped

	maxFlows int // the egress table's cap on the lease's flows

	mu               sync.Mutex
	egress           egressSet
	ingress          bool
	ingressTransport *http.Transport // made on the first preview request

	// ingressInFlight counts the lease's preview requests being proxied;
	// guarded by Server.ingress.mu (ingress.go).
	ingressInFlight int
}

// slirpOwnFiles are the descriptors slirp4netns may hold beside the sockets
// of its flows (its TAP device, pipes, namespaces, resolver).
const slirpOwnFiles = 64

// netSpec is what a create asks of the network.
type netSpec struct {
	egress  egressSet
	ingress bool
	// dropped counts the distinct rules asked for that the server's policy
	// left out of egress.
	dropped int
}

// networkDefaults checks the network options (called by withDefaults).
func (o *Options) networkDefaults() error {
	switch o.Egress {
	case "":
		o.Egress = EgressOff
	case EgressOff, EgressAllowlist, EgressAny:
	default:
		return fmt.Errorf("localsandbox: unknown egress policy %q (off, allowlist or any)", o.Egress)
	}
	if o.IngressDomain == "" {
		o.IngressDomain = "localhost"
	}
	if o.MaxIngressRequests < 0 || o.MaxIngressRequestsPerLease < 0 || o.MaxEgressConnections < 0 {
		return errors.New("localsandbox: network limits must not be negative")
	}
	if o.MaxEgressConnections == 0 {
		o.MaxEgressConnections = DefaultMaxEgressConnections
	}
	if o.MaxIngressRequests == 0 {
		o.MaxIngressRequests = max(1, o.MaxConnectionsPerAddress/2)
	}
	if o.MaxIngressRequestsPerLease == 0 {
		o.MaxIngressRequestsPerLease = min(DefaultMaxIngressRequestsPerLease, o.MaxIngressRequests)
	}
	o.IngressDomain = strings.ToLower(strings.TrimSuffix(o.IngressDomain, "."))
	if !validHostName(o.IngressDomain) {
		return fmt.Errorf("localsandbox: ingress domain %q is not a host name", o.IngressDomain)
	}
	if o.Egress == EgressOff {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("localsandbox: egress %s needs a server running as root (it makes the leases' network namespaces)", o.Egress)
	}
	if o.Slirp4netns == "" {
		p, err := exec.LookPath("slirp4netns")
		if err != nil {
			return fmt.Errorf("localsandbox: egress %s needs slirp4netns (apt-get install slirp4netns): %w", o.Egress, err)
		}
		o.Slirp4netns = p
	}
	return nil
}

// networkAvailable reports whether this server makes its leases' network
// namespaces (and so can give them egress and ingress).
func (s *Server) networkAvailable() bool {
	return s.isolation == IsolationNamespaces && os.Geteuid() == 0
}

// netSpec checks the network fields of a create.
func (s *Server) netSpec(ctx context.Context, egress []string, ingress bool) (netSpec, error) {
	if ingress && !s.networkAvailable() {
		return netSpec{}, badRequest("ingress needs namespace isolation and a server running as root")
	}
	set, err := compileEgress(ctx, s.opts.Egress, egress)
	if err != nil {
		return netSpec{}, err
	}
	spec := netSpec{egress: set, ingress: ingress}
	if !set.all {
		asked := map[string]bool{}
		for _, r := range egress {
			asked[r] = true
		}
		spec.dropped = len(asked) - len(set.rules)
	}
	return spec, nil
}

// newLeaseNet makes the network namespace of a lease (nil when the server
// cannot: the init then makes its own), with loopback up, the egress
// table in place and, unless egress is off, slirp4netns attached and in
// the lease's cgroup cg (when it has one).
func (s *Server) newLeaseNet(l *lease, spec netSpec, cg machine.Cgroup) (_ *leaseNet, err error) {
	if spec.dropped > 0 {
		// The view says what is in force; the operator learns here why a
		// lease has less than it asked. Counts only: a rule names a host.
		s.log.Warn("egress rules dropped by the server's policy", "sandbox", l.id, "policy", s.opts.Egress,
			"dropped", spec.dropped, "in_force", len(spec.egress.rules))
	}
	if !s.networkAvailable() {
		return nil, nil
	}
	ns, err := newNetns()
	if err != nil {
		return nil, fmt.Errorf("the lease's network namespace: %w", err)
	}
	n := &leaseNet{netns: ns, egress: spec.egress, ingress: spec.ingress, maxFlows: s.opts.MaxEgressConnections}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	if err := inNetns(ns, leaseinit.LoopbackUp); err != nil {
		return nil, err
	}
	if s.opts.Egress == EgressOff {
		return n, nil
	}
	// The table first: no packet leaves before the rules are in force.
	if err := applyEgress(int(ns.Fd()), spec.egress, n.maxFlows); err != nil {
		return nil, err
	}
	if err := n.startSlirp(s, cg); err != nil {
		return nil, err
	}
	if err := s.writeResolvConf(l); err != nil {
		return nil, err
	}
	return n, nil
}

// resolvConf sends the lease's name lookups to slirp4netns's resolver,
// the only one its egress table admits (the host's may be on the host's
// loopback, which the lease cannot reach).
const resolvConf = "# written by sandboxd: the user-mode network's resolver (slirp4netns)\nnameserver 10.0.2.3\n"

// writeResolvConf puts /etc/resolv.conf into the upper layer of l's root
// that holds /etc, over the lower layer's.
func (s *Server) writeResolvConf(l *lease) error {
	if err := s.machineSpec(l).WriteRootFile("/etc/resolv.conf", []byte(resolvConf)); err != nil {
		return fmt.Errorf("the lease's resolv.conf: %w", err)
	}
	return nil
}

// startSlirp attaches slirp4netns to the namespace, in the lease's cgroup
// cg, and waits until it has configured tap0.
func (n *leaseNet) startSlirp(s *Server, cg machine.Cgroup) error {
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
	args := []string{"--configure", "--mtu=65520", "--enable-sandbox", "--enable-seccomp",
		"--ready-fd=3", "--exit-fd=4", "--netns-type=path"}
	if !s.opts.EgressHostLoopback {
		args = append(args, "--disable-host-loopback")
	}
	// The namespace by a path of this process: slirp4netns opens it itself
	// (and, given a path, joins no user namespace).
	args = append(args, fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), n.netns.Fd()), "tap0")
	cmd := exec.Command(s.opts.Slirp4netns, args...)
	// Marked as the root's, so that leak checks and the sweep find it.
	cmd.Env = []string{rootMarkerEnv + "=" + s.opts.Root, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
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
	files := uint64(n.maxFlows + slirpOwnFiles)
	if err := unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: files, Max: files}, nil); err != nil {
		cmd.Process.Kill()
		<-n.slirpDone
		return fmt.Errorf("limiting slirp4netns's descriptors: %w", err)
	}
	// The lease's traffic costs slirp4netns several times the CPU it costs
	// the lease (a user-space TCP stack): in the lease's cgroup, that CPU
	// and memory count against the lease's shape, not the host's spare
	// cores, and pausing the lease freezes its network too.
	if cg != nil {
		if err := cg.AddProc(cmd.Process.Pid); err != nil {
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

// setEgress replaces the egress in force.
func (n *leaseNet) setEgress(set egressSet) error {
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

// close ends slirp4netns and releases the namespace (it vanishes with its
// last process). Safe on nil.
func (n *leaseNet) close() {
	if n == nil {
		return
	}
	n.mu.Lock()
	slirp, transport := n.slirp, n.ingressTransport
	n.slirp = nil
	n.mu.Unlock()
	if transport != nil {
		transport.CloseIdleConnections()
	}
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

// start starts cmd (the lease init, cloned with CLONE_NEWNET) in the
// lease's namespace instead of a new one of its own; without a leaseNet
// it just starts cmd.
func (n *leaseNet) start(cmd *exec.Cmd) error {
	if n == nil {
		return cmd.Start()
	}
	cmd.SysProcAttr.Cloneflags &^= syscall.CLONE_NEWNET
	// A child is forked by the calling thread and inherits its namespaces.
	return inNetns(n.netns, cmd.Start)
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

// netCounters are the bytes a lease sent out (tx) and received (rx) over
// its outward interface.
type netCounters struct {
	rx, tx int64
}

// readNetCounters reads tap0's counters from /proc/<pid>/net/dev, pid
// being any process in the lease's network namespace.
func readNetCounters(pid int) (netCounters, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/dev")
	if err != nil {
		return netCounters{}, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) != "tap0" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			return netCounters{}, false
		}
		rx, err1 := strconv.ParseInt(f[0], 10, 64)
		tx, err2 := strconv.ParseInt(f[8], 10, 64)
		if err1 != nil || err2 != nil {
			return netCounters{}, false
		}
		return netCounters{rx: rx, tx: tx}, true
	}
	return netCounters{}, false
}

// networkView is the [ext] network part of a sandbox view.
type networkView struct {
	// EgressPolicy is the operator's cap (off, allowlist, any).
	EgressPolicy EgressPolicy `json:"egress_policy"`
	// Path is the outward path: "slirp4netns", "host" (process-group
	// isolation: no network isolation at all) or "none".
	Path string `json:"path"`
	// BytesOut and BytesIn count what crossed the outward interface.
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
}

// network returns the lease's network, or nil. A fork is viewed (and its
// egress set) while it starts, so the field is read under the lease's lock.
func (l *lease) network() *leaseNet {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.net
}

// networkView describes l's network; egress is the list in force.
func (s *Server) networkView(l *lease) (egress []string, ingress bool, v *networkView) {
	v = &networkView{EgressPolicy: s.opts.Egress, Path: "none"}
	n := l.network()
	switch {
	case l.isolation != IsolationNamespaces:
		v.Path = "host"
		return []string{egressAll}, false, v
	case n == nil:
		return []string{}, false, v
	}
	n.mu.Lock()
	egress, ingress = n.egress.list(), n.ingress
	slirp := n.slirp != nil
	n.mu.Unlock()
	if slirp {
		v.Path = "slirp4netns"
		if m, _ := l.parts(); m != nil {
			if c, ok := readNetCounters(m.Pid()); ok {
				v.BytesIn, v.BytesOut = c.rx, c.tx
			}
		}
	}
	return egress, ingress, v
}

// addNetworkView fills the network fields of l's view.
func (s *Server) addNetworkView(l *lease, v *sandboxView) {
	egress, ingress, network := s.networkView(l)
	v.Egress, v.IngressEnabled, v.Network = &egress, ingress, network
	if ingress {
		v.IngressURLTemplate = s.ingressTemplate(l.id)
	}
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
