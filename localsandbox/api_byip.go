package localsandbox

import (
	"net/http"
	"net/netip"
)

// Lookup by IP (docs/CREATEOS-API.md §3.2).
//
//	GET /v1/sandboxes/by-ip/{ip} → the view GET /v1/sandboxes/{id} gives
//
// A sandbox's ip is an address that identifies it: under namespace
// isolation its preview address (previewAddr, 127.100.x.y, its own for as
// long as it lives; its ports are published there when ingress is on).
// The address a sandbox has inside its own network namespace (10.0.2.100
// on its outward path) is every sandbox's, so it identifies none. Under
// process-group isolation every sandbox's ip is the host's 127.0.0.1: a
// lookup of it is 409 while any sandbox lives, never one picked
// arbitrarily. An address no live sandbox has is 404; a malformed one 400.

// hostLoopback is the ip of every sandbox under process-group isolation.
var hostLoopback = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// leaseIP is l's ip: its own address (see above), or the host's loopback.
// A destroyed lease is given no new address (previewAddr).
func (s *Server) leaseIP(l *lease) netip.Addr {
	if l.isolation != IsolationNamespaces {
		return hostLoopback
	}
	return s.previewAddr(l)
}

func (s *Server) getSandboxByIP(w http.ResponseWriter, r *http.Request) error {
	a, err := netip.ParseAddr(r.PathValue("ip"))
	if err != nil || a.Zone() != "" {
		return badRequest("ip: not an IP address: %s", r.PathValue("ip"))
	}
	a = a.Unmap()
	s.mu.Lock()
	live := len(s.leases)
	s.mu.Unlock()
	if a == hostLoopback && s.isolation != IsolationNamespaces && live > 0 {
		return conflict("127.0.0.1 is the ip of every sandbox of this server (process-group isolation: no network of their own), so it identifies none; look the sandbox up by id")
	}
	st := &s.ingress
	st.mu.Lock()
	l := st.addrs[a]
	st.mu.Unlock()
	if l == nil || l.status() == stateDestroyed {
		return notFound("sandbox")
	}
	return writeData(w, s.view(l, true))
}
