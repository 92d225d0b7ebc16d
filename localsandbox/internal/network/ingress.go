package network

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"
)

// Ingress: the plumbing of preview URLs. The server (localsandbox's
// ingress.go) decides which requests are preview requests, which leases
// take them and how many at once; a Net proxies them, WebSocket upgrades
// included, to 127.0.0.1:<port> inside the lease's network namespace (a
// server listening on 0.0.0.0 or 127.0.0.1 there is reached). The Host
// header is passed on as it came; X-Api-Key is never passed on.

// ingressDialTimeout bounds a connect to a port in the lease.
const ingressDialTimeout = 5 * time.Second

// MaxIdlePerLease bounds the connections into a lease kept open for its
// next preview requests (four a port at most): without it, a client
// asking each port in turn made the server hold one per port.
const MaxIdlePerLease = 16

// Proxy returns the reverse proxy of a request to 127.0.0.1:port in the
// lease. When the request cannot be proxied (nothing listens on the port,
// the client's body stalls), failed answers it.
func (n *Net) Proxy(port int, failed func(w http.ResponseWriter, r *http.Request, err error)) http.Handler {
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del("X-Api-Key")
			pr.SetXForwarded()
		},
		Transport:     n.transport(),
		FlushInterval: -1, // event streams and the like pass at once
		ErrorHandler:  failed,
	}
}

// transport is the lease's HTTP transport: its connections are sockets of
// the lease's network namespace.
func (n *Net) transport() *http.Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ingressTransport == nil {
		n.ingressTransport = &http.Transport{
			DialContext:           n.dial,
			MaxIdleConns:          MaxIdlePerLease,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: 0, // a server inside may think as long as it likes
		}
	}
	return n.ingressTransport
}

// dial connects to addr from inside the lease's network namespace.
func (n *Net) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(n.netns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: ingressDialTimeout}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}
