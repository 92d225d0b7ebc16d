package network

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/netutil"
)

// Preview addresses: the preview URL form that needs no name resolution.
//
// A preview host name <port>-<id>.localhost resolves in browsers and curl,
// which map *.localhost to loopback themselves, but not in Node, Go or
// Python on a machine whose resolver has no such rule: the lookup fails
// (ENOTFOUND) and leaks to the configured resolver. So each lease gets a
// loopback address of its own, 127.x.y.z (the whole of 127/8 is the
// host's loopback on Linux, nothing to configure), and every TCP port a
// server listens on inside the lease (on a wildcard or loopback address)
// is published at the same port of that address by a listener of the
// server, which proxies it into the lease. The URL http://127.x.y.z:8000/
// is an address: nothing to resolve, anywhere; the SDKs' substitution of
// "<port>" in http://127.x.y.z:<port> gives it; and its origin is the
// lease's and the port's own, as a preview host name's is (cookies and
// storage are not shared between leases, nor between ports).
//
// The lease's listening ports are read from the namespace's
// /proc/net/tcp and tcp6 every publishEvery: a port is published at most
// that long after the server in the lease listens, and unpublished as long
// after it stops. A port the host already holds on every address (a
// wildcard listener of the host's) cannot be published; the lease's
// preview host name still reaches it.

// publishEvery is how often a lease's listening ports are read.
const publishEvery = 200 * time.Millisecond

// MaxPublishedPorts caps the ports of a lease published at once, the
// lowest first: each is a listener of the server, and a lease listening on
// thousands of ports must not take the server's descriptors.
const MaxPublishedPorts = 64

// publishConns caps the connections one published port holds (the next
// wait in its backlog); the requests themselves are capped by the
// server's handler.
const publishConns = 64

// Publish serves the lease's listening ports at addr, each with the
// handler serve gives for it, until Unpublish or Close. Publishing again
// is a no-op.
func (n *Net) Publish(addr netip.Addr, serve func(port int) http.Handler) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.publisher != nil {
		return
	}
	p := &publisher{ns: n.netns, addr: addr, serve: serve, stop: make(chan struct{}), done: make(chan struct{}),
		ports: map[int]*http.Server{}}
	n.publisher = p
	go p.run()
}

// Unpublish closes the published ports and their connections.
func (n *Net) Unpublish() {
	n.mu.Lock()
	p := n.publisher
	n.publisher = nil
	n.mu.Unlock()
	p.close()
}

// publisher publishes one lease's listening ports at its address.
type publisher struct {
	ns    *os.File
	addr  netip.Addr
	serve func(port int) http.Handler
	stop  chan struct{}
	done  chan struct{}
	ports map[int]*http.Server // nil: the host holds the port, not published
}

func (p *publisher) run() {
	defer close(p.done)
	t := time.NewTicker(publishEvery)
	defer t.Stop()
	for {
		p.sync()
		select {
		case <-p.stop:
			for _, srv := range p.ports {
				if srv != nil {
					srv.Close()
				}
			}
			return
		case <-t.C:
		}
	}
}

// sync publishes the ports the lease listens on now and unpublishes the
// others.
func (p *publisher) sync() {
	listening, err := listeningPorts(p.ns)
	if err != nil {
		return // the namespace is going: Close comes
	}
	for port, srv := range p.ports {
		if !listening[port] {
			if srv != nil {
				srv.Close()
			}
			delete(p.ports, port)
		}
	}
	for _, port := range slices.Sorted(maps.Keys(listening)) {
		if len(p.ports) >= MaxPublishedPorts {
			break
		}
		if _, ok := p.ports[port]; ok || !Previewable(port) {
			continue
		}
		ln, err := net.Listen("tcp", netip.AddrPortFrom(p.addr, uint16(port)).String())
		if err != nil {
			p.ports[port] = nil // not retried until the lease's server goes
			continue
		}
		srv := &http.Server{
			Handler:           p.serve(port),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       time.Minute,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          log.New(io.Discard, "", 0),
		}
		p.ports[port] = srv
		go srv.Serve(netutil.LimitListener(ln, publishConns))
	}
}

// close stops publishing and waits until every published listener is
// closed. Safe on nil.
func (p *publisher) close() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
}

// listeningPorts reads the TCP ports listened on in the namespace ns on a
// wildcard or loopback address, which a preview request reaches
// (127.0.0.1:<port> inside).
func listeningPorts(ns *os.File) (map[int]bool, error) {
	ports := map[int]bool{}
	err := inNetns(ns, func() error {
		for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
			b, err := os.ReadFile(f)
			if errors.Is(err, os.ErrNotExist) {
				continue // no IPv6
			}
			if err != nil {
				return err
			}
			parseListening(b, ports)
		}
		return nil
	})
	return ports, err
}

// parseListening adds the ports of the listening sockets of a
// /proc/net/tcp{,6} table bound to a wildcard or an IPv4 loopback
// address to ports.
func parseListening(table []byte, ports map[int]bool) {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // the header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "0A" { // TCP_LISTEN
			continue
		}
		host, port, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil || p == 0 {
			continue
		}
		// The address as the kernel prints it: 4-byte words in host
		// order. A wildcard is all zeros; 127.0.0.1 is 0100007F, and as an
		// IPv4-mapped IPv6 address 0000000000000000FFFF00000100007F.
		wildcard := strings.Trim(host, "0") == ""
		loopback := host == "0100007F" || host == "0000000000000000FFFF00000100007F"
		if wildcard || loopback {
			ports[int(p)] = true
		}
	}
}
