package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/netutil"
	"golang.org/x/sys/unix"
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
// The lease's listening ports are asked of the namespace's kernel
// (sock_diag) every publishEvery: a port is published at most
// that long after the server in the lease listens, and unpublished as long
// after it stops; and at once when asked (Net.PublishNow): the server asks
// before it answers an exec, so that a port the lease listened on when a
// command ended is reachable when its answer arrives (the SDKs' waitForPort
// is such an exec, and their examples fetch the preview URL right after).
// A port the host already holds on every address (a wildcard listener of
// the host's) cannot be published; the lease's preview host name still
// reaches it.

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
func (n *Net) Publish(addr netip.Addr, serve func(port int) http.Handler) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.publisher != nil {
		return nil
	}
	diag, err := newListenDiag(n.netns)
	if err != nil {
		return err
	}
	p := &publisher{diag: diag, addr: addr, serve: serve, stop: make(chan struct{}), done: make(chan struct{}),
		ports: map[int]*http.Server{}}
	n.publisher = p
	go p.run()
	return nil
}

// PublishNow publishes the ports the lease listens on now (and
// unpublishes the others) before it returns, without waiting for the next
// look; a no-op unless the lease is published.
func (n *Net) PublishNow() {
	n.mu.Lock()
	p := n.publisher
	n.mu.Unlock()
	if p != nil {
		p.sync()
	}
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
	diag  *listenDiag
	addr  netip.Addr
	serve func(port int) http.Handler
	stop  chan struct{}
	done  chan struct{}

	mu     sync.Mutex           // one sync at a time (run's and PublishNow's), and not after close
	closed bool                 // the listeners are closed: sync publishes nothing more
	ports  map[int]*http.Server // nil: the host holds the port, not published
}

func (p *publisher) run() {
	defer close(p.done)
	defer p.diag.close()
	t := time.NewTicker(publishEvery)
	defer t.Stop()
	for {
		p.sync()
		select {
		case <-p.stop:
			p.mu.Lock()
			p.closed = true
			for _, srv := range p.ports {
				if srv != nil {
					srv.Close()
				}
			}
			p.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// sync publishes the ports the lease listens on now and unpublishes the
// others.
func (p *publisher) sync() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	listening, err := p.diag.ports()
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

// listenDiag asks a namespace's kernel which TCP sockets listen there,
// over a NETLINK_SOCK_DIAG socket made inside it once (a netlink socket
// answers for the namespace it was made in): no thread enters the
// namespace at each look, which costs (setns twice a look took a third of
// a core for 20 leases).
type listenDiag struct {
	fd  int
	buf []byte
}

func newListenDiag(ns *os.File) (*listenDiag, error) {
	fd := -1
	err := inNetns(ns, func() (err error) {
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("the lease's listening ports: %w", err)
	}
	return &listenDiag{fd: fd, buf: make([]byte, 32<<10)}, nil
}

func (d *listenDiag) close() { unix.Close(d.fd) }

// ports returns the TCP ports listened on on a wildcard or on 127.0.0.1
// (IPv4, or IPv4-mapped), which a preview request reaches
// (127.0.0.1:<port> inside the lease).
func (d *listenDiag) ports() (map[int]bool, error) {
	ports := map[int]bool{}
	for _, family := range []byte{unix.AF_INET, unix.AF_INET6} {
		// struct nlmsghdr, then struct inet_diag_req_v2: family,
		// protocol, extensions, pad, states, and a zero socket id (48
		// bytes): every listening socket.
		req := make([]byte, 16+56)
		binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
		binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
		binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		req[16], req[17] = family, unix.IPPROTO_TCP
		binary.NativeEndian.PutUint32(req[20:], 1<<tcpListen)
		if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return nil, err
		}
		if err := d.read(ports); err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// tcpListen is TCP_LISTEN of the kernel's TCP states.
const tcpListen = 10

// read reads the answers of one dump into ports.
func (d *listenDiag) read(ports map[int]bool) error {
	for {
		n, _, err := unix.Recvfrom(d.fd, d.buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(d.buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				return errors.New("sock_diag refused the dump")
			}
			addListening(m.Data, ports)
		}
	}
}

// addListening adds the port of one struct inet_diag_msg (family, state,
// timer, retrans, then the socket id: source port, destination port,
// source address of 16 bytes, …) to ports if its address is a wildcard
// or 127.0.0.1.
func addListening(msg []byte, ports map[int]bool) {
	if len(msg) < 24 || msg[1] != tcpListen {
		return
	}
	port := int(binary.BigEndian.Uint16(msg[4:6]))
	var addr netip.Addr
	switch msg[0] {
	case unix.AF_INET:
		addr = netip.AddrFrom4([4]byte(msg[8:12]))
	case unix.AF_INET6:
		addr = netip.AddrFrom16([16]byte(msg[8:24])).Unmap()
	default:
		return
	}
	if port != 0 && (addr.IsUnspecified() || addr == netip.AddrFrom4([4]byte{127, 0, 0, 1})) {
		ports[port] = true
	}
}
