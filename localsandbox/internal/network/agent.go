package network

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/netutil"
)

// A lease's self API (CreateOS's in-guest agent): code running inside a
// lease pauses or deletes its own lease with a POST to
// http://127.0.0.1:1029/self/{pause,delete}, without a key.
//
// The listener is made by the server inside the lease's namespace, as the
// resolver's sockets are (dns.go), before the lease init starts, and is
// served by the server's goroutines until the lease's network closes. The
// listener is the binding: whatever arrives on it concerns this lease and
// no other, so no id in a request is read. The lease cannot take the port
// over: it is bound before any of the lease's processes run and held
// until the network closes, and the lease cannot share it (SO_REUSEPORT
// needs the same owner). (1029 is above 1024: CAP_NET_BIND_SERVICE, which
// guards the resolver's port, dns.go, plays no part here.)
//
// A lease cannot use its agent to load the server: at most
// agentConns connections are open at once (the next wait in the
// listener's backlog), a request's headers must arrive within
// agentTimeout and fit in agentMaxHeader bytes, and the handler the
// server gives sees one request at a time (AgentHandler's concern).

// AgentAddr is where a lease's self API listens, inside its namespace.
var AgentAddr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 1029)

// Previewable reports whether a preview request may reach port inside a
// lease: any but the self API's, which would otherwise let whoever can
// open a preview URL (no key) pause or delete the lease.
func Previewable(port int) bool { return port != int(AgentAddr.Port()) }

// The agent's limits, per lease.
const (
	agentConns     = 4
	agentTimeout   = 5 * time.Second
	agentMaxHeader = 4 << 10
)

// leaseAgent is the self API's listener of one lease and its server.
type leaseAgent struct {
	srv  *http.Server
	done sync.WaitGroup
}

// serveAgent opens the agent's listener in the namespace ns (at
// AgentAddr) and serves h on it until close.
func serveAgent(ns *os.File, h http.Handler) (*leaseAgent, error) {
	var ln net.Listener
	err := inNetns(ns, func() (err error) {
		ln, err = net.Listen("tcp", AgentAddr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("the lease's self API: %w", err)
	}
	a := &leaseAgent{srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: agentTimeout,
		ReadTimeout:       agentTimeout,
		WriteTimeout:      agentTimeout,
		IdleTimeout:       agentTimeout,
		MaxHeaderBytes:    agentMaxHeader,
		ErrorLog:          log.New(io.Discard, "", 0), // a lease's bad requests are its own
	}}
	a.done.Add(1)
	go func() {
		defer a.done.Done()
		if err := a.srv.Serve(netutil.LimitListener(ln, agentConns)); !errors.Is(err, http.ErrServerClosed) {
			// The listener failed on its own: the lease has no agent
			// from now on, as without a namespace.
			ln.Close()
		}
	}()
	return a, nil
}

// close closes the listener and its connections; it does not wait for a
// handler that is running (the lease's own delete closes its agent).
// Safe on nil.
func (a *leaseAgent) close() {
	if a == nil {
		return
	}
	a.srv.Close()
	a.done.Wait()
}
