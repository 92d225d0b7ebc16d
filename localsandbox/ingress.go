package localsandbox

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
)

// Ingress: preview URLs for servers inside a sandbox.
//
//	POST /v1/sandboxes {"shape": "s-1vcpu-1gb", "ingress_enabled": true}
//	  → "ingress_url_template": "http://127.100.0.1:<port>"
//	(in the lease) python3 -m http.server 8000 &
//	curl http://127.100.0.1:8000/    # an address: Node, Go and Python open it too
//
// Two forms. By default each lease has a preview address of its own
// (previewAddr, 127.100.x.y) at which the ports it listens on are
// published (network.Net.Publish): the URL needs no name resolution, and
// each lease and port is its own origin. With Options.IngressDomain
// (sandboxd --ingress-domain), the template is the host-name form: a
// request to the server whose Host is <port>-<sandbox id>.<IngressDomain>
// (any port; "localhost" is served in both forms) is not an API request.
// Either way the server proxies the request, WebSocket upgrades included,
// to 127.0.0.1:<port> inside the lease's network namespace (a server
// listening on 0.0.0.0 or 127.0.0.1 there is reached), never to the self
// API's port. The Host header is passed on as it came; X-Api-Key is never
// passed on.
//
// A preview URL carries no key: whoever can reach the server's listener
// can use it. Preview URLs are therefore served only on connections to a
// loopback address of the server, unless the operator sets
// Options.IngressPublic (sandboxd --ingress-public). A sandbox without
// ingress_enabled answers 403; an unknown or destroyed sandbox 404; a
// paused (or pausing, resuming, failed) one 409; a port nobody listens on
// 502, at once (the connection is refused); an answer whose headers pass
// network.MaxResponseHeaderBytes (64 KiB) 502, naming them.

// ingressState is the server's side of preview URLs: the port of the first
// TCP listener the server serves on, which the host-name form of the
// ingress URL template names (0: unknown, no template), the leases'
// preview addresses (addrs, addrOf), and the preview requests being
// proxied, in all and per lease (lease.ingressInFlight, guarded by mu).
type ingressState struct {
	port atomic.Int64

	mu          sync.Mutex
	addrs       map[netip.Addr]*lease
	addrOf      map[*lease]netip.Addr
	claims      map[netip.Addr]*os.File // host-wide claims of addrs (preview_claim.go)
	claimDir    string                  // previewClaimDir, or a test's
	nextAddr    uint32
	claimWarned bool
	inFlight    int
	lastWarned  time.Time
}

// notePreviewAddr records the port of a listener Serve was given.
func (s *Server) notePreviewAddr(addr net.Addr) {
	if a, ok := addr.(*net.TCPAddr); ok {
		s.ingress.port.CompareAndSwap(0, int64(a.Port))
	}
}

// ingressTemplate is the sandbox's ingress_url_template: its preview
// address's form, or with Options.IngressDomain the host name's ("" when
// the server does not know its port).
func (s *Server) ingressTemplate(l *lease) string {
	if !s.opts.previewByHost {
		return "http://" + s.previewAddr(l).String() + ":<port>"
	}
	port := s.ingress.port.Load()
	if port == 0 {
		return ""
	}
	return "http://<port>-" + l.id + "." + s.opts.IngressDomain + ":" + strconv.FormatInt(port, 10)
}

// setIngress turns l's preview URLs on or off; in the address form it
// publishes the ports l listens on at its preview address.
func (s *Server) setIngress(l *lease, n *network.Net, on bool) error {
	switch {
	case !on:
		n.Unpublish()
	case !s.opts.previewByHost:
		err := n.Publish(s.previewAddr(l), func(port int) http.Handler {
			return s.withBodyDeadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := s.serveIngress(w, r, port, l.id); err != nil {
					writeError(w, err.status, err.msg)
				}
			}))
		})
		if err != nil {
			return fmt.Errorf("publishing the preview address of sandbox %s: %w", l.id, err)
		}
	}
	n.SetIngress(on)
	return nil
}

// publishNow publishes the ports l listens on now at its preview address,
// if its preview URLs are on, before an exec answers: a command that saw
// a port listen (the SDKs' waitForPort) is followed at once by a request
// to its preview URL, which must not find the port unpublished for up to
// network.publishEvery.
func (l *lease) publishNow() {
	if n := l.network(); n != nil {
		n.PublishNow()
	}
}

// Preview addresses are taken from previewNet (127.100.0.0/16: off
// 127.0.0.0/24, where the host's own services are), one per lease for as
// long as it lives, the addresses of destroyed leases taken again.
var previewNet = netip.MustParsePrefix("127.100.0.0/16")

// previewAddr is l's preview address, allocated on first use; the zero
// Addr once l is destroyed and its address released (a destroy sets the
// state before releasePreviewAddr, so a caller that raced it allocates
// nothing that would outlive the lease).
func (s *Server) previewAddr(l *lease) netip.Addr {
	st := &s.ingress
	st.mu.Lock()
	defer st.mu.Unlock()
	if a, ok := st.addrOf[l]; ok {
		return a
	}
	if l.status() == stateDestroyed {
		return netip.Addr{}
	}
	if st.addrs == nil {
		st.addrs, st.addrOf, st.claims = map[netip.Addr]*lease{}, map[*lease]netip.Addr{}, map[netip.Addr]*os.File{}
		if st.claimDir == "" {
			st.claimDir = previewClaimDir()
		}
	}
	base := previewNet.Addr().As4()
	for range 1 << 16 {
		st.nextAddr++
		n := st.nextAddr % (1 << 16)
		if n%256 == 0 || n%256 == 255 {
			continue // no address ending in .0 or .255, which look like networks and broadcasts
		}
		a := netip.AddrFrom4([4]byte{base[0], base[1], byte(n >> 8), byte(n)})
		if owner := st.addrs[a]; owner != nil && owner.status() != stateDestroyed {
			continue
		} else if owner != nil {
			delete(st.addrOf, owner)
		}
		if st.claims[a] == nil {
			claim, err := claimPreviewAddr(st.claimDir, a)
			if errors.Is(err, errPreviewClaimed) {
				continue
			} else if err != nil && !st.claimWarned {
				// Unclaimed, the address may coincide with another
				// server's; the lease's previews still work here.
				st.claimWarned = true
				s.log.Warn("preview addresses are not claimed host-wide", "err", err)
			}
			st.claims[a] = claim
		}
		st.addrs[a], st.addrOf[l] = l, a
		return a
	}
	// 65,024 live leases with ingress, far beyond any server's: the last
	// is shared (the second lease there cannot publish the first's ports;
	// its preview host names still work).
	return netip.AddrFrom4([4]byte{base[0], base[1], 255, 254})
}

// releasePreviewAddr forgets l's preview address when l is destroyed (an
// address whose lease was destroyed otherwise is only taken again when
// the allocation comes round to it).
func (s *Server) releasePreviewAddr(l *lease) {
	st := &s.ingress
	st.mu.Lock()
	defer st.mu.Unlock()
	if a, ok := st.addrOf[l]; ok {
		delete(st.addrOf, l)
		delete(st.addrs, a)
		if c := st.claims[a]; c != nil {
			c.Close()
		}
		delete(st.claims, a)
	}
}

// parsePreviewHost splits a Host of the form <port>-<id>.<domain>[:port].
func parsePreviewHost(host, domain string) (port int, id string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(host, ".") // the same name, fully qualified
	label, found := strings.CutSuffix(strings.ToLower(host), "."+domain)
	if !found {
		return 0, "", false
	}
	p, id, found := strings.Cut(label, "-")
	if !found || len(p) > 5 || !idPattern.MatchString(id) {
		return 0, "", false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != p {
		return 0, "", false
	}
	return port, id, true
}

// withIngress serves preview URLs and passes every other request on.
func (s *Server) withIngress(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		port, id, ok := parsePreviewHost(r.Host, s.opts.IngressDomain)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if err := s.serveIngress(w, r, port, id); err != nil {
			writeError(w, err.status, err.msg)
		}
	})
}

func (s *Server) serveIngress(w http.ResponseWriter, r *http.Request, port int, id string) *apiError {
	select {
	case <-s.done:
		return &apiError{http.StatusServiceUnavailable, "the server is shutting down"}
	default:
	}
	if local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr); !s.opts.IngressPublic && (local == nil || !isLoopback(local)) {
		return &apiError{http.StatusForbidden, "preview URLs are served on loopback only"}
	}
	s.mu.Lock()
	l := s.leases[id]
	s.mu.Unlock()
	if l == nil {
		return notFound("sandbox")
	}
	if !network.Previewable(port) {
		return &apiError{http.StatusForbidden, "port " + strconv.Itoa(port) + " is the sandbox's self API, which no preview reaches"}
	}
	n := l.network()
	if n == nil {
		return &apiError{http.StatusForbidden, "ingress is not enabled for this sandbox"}
	}
	if _, enabled, _ := n.State(); !enabled {
		return &apiError{http.StatusForbidden, "ingress is not enabled for this sandbox"}
	}
	switch state := l.status(); state {
	case stateRunning:
	case stateDestroyed:
		return notFound("sandbox")
	default:
		return conflict("the sandbox is " + state)
	}
	release, err := s.admitIngress(l)
	if err != nil {
		w.Header().Set("Retry-After", "1")
		return err
	}
	defer release()
	n.Proxy(port, func(w http.ResponseWriter, _ *http.Request, err error) {
		if bodyExpired(r) { // the client's body stalled, not the server
			writeError(w, http.StatusRequestTimeout, "the request body did not arrive in time")
			return
		}
		if errors.Is(err, network.ErrResponseHeaderTooLarge) {
			writeError(w, http.StatusBadGateway, "the server on port "+strconv.Itoa(port)+" in the sandbox answered more than "+
				strconv.Itoa(network.MaxResponseHeaderBytes>>10)+" KiB of headers")
			return
		}
		writeError(w, http.StatusBadGateway, "nothing answers on port "+strconv.Itoa(port)+" in the sandbox")
	}).ServeHTTP(w, r)
	return nil
}

// admitIngress counts a preview request to n, for as long as it is proxied
// (a WebSocket for as long as it is open), or refuses it past the caps:
// Options.MaxIngressRequestsPerLease to one lease, MaxIngressRequests in
// all. Every preview request holds a connection of the server with a
// request in flight, which the connection caps never displace, and a
// WebSocket's connection is not counted by them at all once upgraded; a
// server in a lease that never answers, and a page of it opening requests
// to it in the user's browser, would otherwise fill the caps and lock the
// API out.
func (s *Server) admitIngress(l *lease) (release func(), _ *apiError) {
	st := &s.ingress
	st.mu.Lock()
	defer st.mu.Unlock()
	var refused *apiError
	switch {
	case l.ingressInFlight >= s.opts.MaxIngressRequestsPerLease:
		refused = &apiError{http.StatusServiceUnavailable, fmt.Sprintf("too many preview requests to this sandbox (%d in flight); retry later", l.ingressInFlight)}
	case st.inFlight >= s.opts.MaxIngressRequests:
		refused = &apiError{http.StatusServiceUnavailable, fmt.Sprintf("too many preview requests in flight (%d); retry later", st.inFlight)}
	}
	if refused != nil {
		if time.Since(st.lastWarned) >= time.Minute {
			st.lastWarned = time.Now()
			s.log.Warn("preview request cap reached: answering 503", "sandbox", l.id, "in_flight", st.inFlight,
				"max", s.opts.MaxIngressRequests, "of_sandbox", l.ingressInFlight, "max_per_sandbox", s.opts.MaxIngressRequestsPerLease)
		}
		return nil, refused
	}
	l.ingressInFlight++
	st.inFlight++
	return func() {
		st.mu.Lock()
		l.ingressInFlight--
		st.inFlight--
		st.mu.Unlock()
	}, nil
}
