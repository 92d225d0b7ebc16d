package stack

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// A fleet on one machine: the stack's Temporal server and any number of
// sandbox hosts (AddHost), each with a local sandbox server of its own
// (its own root and port) and a worker in host mode. Start the stack with
// NoSandbox and NoWorker, then add the hosts:
//
//	s, _ := stack.Start(ctx, stack.Options{NoSandbox: true, NoWorker: true})
//	a, _ := s.AddHost(ctx, stack.HostOptions{Name: "a", Sandbox: localsandbox.Options{Root: dirA}})
//	…
//	a.Kill()         // the host is gone: no cleanup, nothing answers
//	a.Return(ctx)    // it comes back, and sweeps what no workflow holds
//
// The host's worker reaches Temporal and the host's sandbox server through
// links of its own, relays on loopback that Kill cuts: from then on the
// host neither polls nor answers, as a machine that died or lost its
// network, while its sandbox server keeps what it held, as a machine's
// disk does.

// HostOptions configure a host of a fleet.
type HostOptions struct {
	// Name is the host's name (workerapp.Config.Host).
	Name string
	// Sandbox configures the host's sandbox server. Root is required:
	// every host has its own. Its API key is a fresh random one.
	Sandbox localsandbox.Options
	// Worker configures the host's worker; its Host, sandbox URL and key
	// are the host's.
	Worker workerapp.Config
	// FaultProxy puts a faultproxy.Proxy (seeded with FaultProxySeed)
	// between the host's worker and its sandbox server: Host.Proxy.
	FaultProxy     bool
	FaultProxySeed uint64
}

// Host is a sandbox host of a fleet on this machine.
type Host struct {
	Name string
	// Sandbox is the host's sandbox server; SandboxURL and SandboxAPIKey
	// reach it directly, not through the host's link.
	Sandbox       *localsandbox.Server
	SandboxURL    string
	SandboxAPIKey string
	// Proxy is the fault proxy in front of the sandbox server, with
	// HostOptions.FaultProxy; the worker reaches the server through it.
	Proxy *faultproxy.Proxy

	s    *Stack
	opts HostOptions

	mu     sync.Mutex
	worker *workerapp.Host // nil while the host is killed
	client client.Client
	// links the worker goes through, to Temporal and to the sandbox server
	links []*link
	// dead are the workers (and clients) of earlier lives, cut off; they
	// are stopped with the stack.
	dead []func()
}

// AddHost starts a host of the fleet: its sandbox server, and its worker
// in host mode on the stack's Temporal server.
func (s *Stack) AddHost(ctx context.Context, opts HostOptions) (*Host, error) {
	if opts.Sandbox.Root == "" {
		return nil, errors.New("stack: a host needs a sandbox root of its own")
	}
	h := &Host{Name: opts.Name, s: s, opts: opts, SandboxAPIKey: rand.Text()}
	sOpts := opts.Sandbox
	sOpts.APIKey, sOpts.InsecureNoAuth = h.SandboxAPIKey, false
	if sOpts.Logger == nil {
		sOpts.Logger = s.logger.With("host", opts.Name)
	}
	srv, err := localsandbox.New(sOpts)
	if err != nil {
		return nil, fmt.Errorf("host %s: sandbox server: %w", opts.Name, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Shutdown(ctx)
		return nil, fmt.Errorf("host %s: %w", opts.Name, err)
	}
	h.Sandbox, h.SandboxURL = srv, "http://"+ln.Addr().String()
	go srv.Serve(ln)
	if opts.FaultProxy {
		if h.Proxy, err = faultproxy.New(h.SandboxURL, opts.FaultProxySeed); err != nil {
			srv.Shutdown(ctx)
			return nil, fmt.Errorf("host %s: %w", opts.Name, err)
		}
	}
	s.hostsMu.Lock()
	s.hosts = append(s.hosts, h)
	s.hostsMu.Unlock()
	if err := h.Return(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// Provider returns a client of the host's sandbox server, not through the
// host's link.
func (h *Host) Provider(cfg createos.Config) (*createos.Client, error) {
	cfg.BaseURL, cfg.APIKey = h.SandboxURL, h.SandboxAPIKey
	return createos.New(cfg)
}

// Worker is the host's worker, nil while the host is killed.
func (h *Host) Worker() *workerapp.Host {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.worker
}

// Kill kills the host abruptly: its links are cut, so its worker neither
// polls, heartbeats nor reports again, and reaches its sandbox server no
// more; nothing is cleaned up. The sandbox server keeps its leases and
// their processes, which go on running.
func (h *Host) Kill() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.worker == nil {
		return
	}
	for _, l := range h.links {
		l.cut()
	}
	w, c := h.worker, h.client
	h.dead = append(h.dead, func() {
		w.Stop()
		c.Close()
	})
	h.worker, h.client, h.links = nil, nil, nil
}

// Return brings a killed host back: a new worker of the same name on the
// same sandbox server, through new links. It sweeps, as it starts, the
// leases no workflow holds.
func (h *Host) Return(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.worker != nil {
		return fmt.Errorf("host %s is running", h.Name)
	}
	toTemporal, err := newLink(h.s.Temporal.FrontendHostPort())
	if err != nil {
		return err
	}
	sandboxURL := h.SandboxURL
	if h.Proxy != nil {
		sandboxURL = h.Proxy.URL()
	}
	toSandbox, err := newLink(strings.TrimPrefix(sandboxURL, "http://"))
	if err != nil {
		toTemporal.cut()
		return err
	}
	opts := h.s.ClientOptions()
	opts.HostPort = toTemporal.addr()
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		toTemporal.cut()
		toSandbox.cut()
		return fmt.Errorf("host %s: connect to Temporal: %w", h.Name, err)
	}
	cfg := h.opts.Worker
	cfg.Host = h.Name
	cfg.Sandbox.BaseURL, cfg.Sandbox.APIKey = "http://"+toSandbox.addr(), h.SandboxAPIKey
	if cfg.Logger == nil {
		cfg.Logger = h.s.logger
	}
	w, err := workerapp.NewHost(c, cfg)
	if err == nil {
		err = w.Start()
	}
	if err != nil {
		c.Close()
		toTemporal.cut()
		toSandbox.cut()
		return fmt.Errorf("host %s: %w", h.Name, err)
	}
	h.worker, h.client, h.links = w, c, []*link{toTemporal, toSandbox}
	return nil
}

// stop stops the host's worker, those of its earlier lives, and its
// sandbox server.
func (h *Host) stop() error {
	h.mu.Lock()
	if h.worker != nil {
		h.worker.Stop()
		h.client.Close()
		for _, l := range h.links {
			l.cut()
		}
		h.worker = nil
	}
	dead := h.dead
	h.dead = nil
	h.mu.Unlock()
	for _, stop := range dead {
		stop()
	}
	if h.Proxy != nil {
		h.Proxy.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return h.Sandbox.Shutdown(ctx)
}

// Hosts returns the hosts added to the stack.
func (s *Stack) Hosts() []*Host {
	s.hostsMu.Lock()
	defer s.hostsMu.Unlock()
	return append([]*Host(nil), s.hosts...)
}

// link relays TCP connections on loopback to target until cut.
type link struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]bool
	isCut bool
}

func newLink(target string) (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("link to %s: %w", target, err)
	}
	l := &link{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go l.serve()
	return l, nil
}

func (l *link) addr() string { return l.ln.Addr().String() }

func (l *link) serve() {
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.relay(in)
	}
}

func (l *link) relay(in net.Conn) {
	out, err := net.Dial("tcp", l.target)
	if err != nil {
		in.Close()
		return
	}
	if !l.track(in, out) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	in.Close()
	out.Close()
	<-done
	l.mu.Lock()
	delete(l.conns, in)
	delete(l.conns, out)
	l.mu.Unlock()
}

// track records a relayed pair, or closes it if the link is cut.
func (l *link) track(conns ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isCut {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		l.conns[c] = true
	}
	return true
}

// cut closes the link and every connection through it.
func (l *link) cut() {
	l.ln.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.isCut = true
	for c := range l.conns {
		c.Close()
	}
}
