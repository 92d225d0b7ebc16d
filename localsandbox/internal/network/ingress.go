package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
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

// MaxResponseHeaderBytes caps the headers of a response from a server in
// a lease (each 1xx response's too, at most five of those a request, as
// net/http counts them). Without it net/http's default of 10 MiB applied
// to each response, held in the server's memory while it is parsed: a
// server in a lease answering 9 MiB of headers to 48 preview requests at
// once, which a page it serves in the user's browser can open, took the
// server from 39 to 663 MiB. Bodies are never held: the proxy streams
// them through a buffer of 32 KiB (FlushInterval -1 flushes at once).
const MaxResponseHeaderBytes = 64 << 10

// ErrResponseHeaderTooLarge is a response from the server in the lease
// whose headers pass MaxResponseHeaderBytes: the request fails, as a 502.
var ErrResponseHeaderTooLarge = fmt.Errorf("the server in the sandbox answered more than %d bytes of headers", MaxResponseHeaderBytes)

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
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			failed(w, r, proxyError(err))
		},
	}
}

// proxyError names the failure of a proxied request that net/http leaves
// unnamed: headers past the cap are only an error's text there (its
// message since Go 1.0; TestIngressResponseFloodIsBounded would catch a
// change).
func proxyError(err error) error {
	if err != nil && strings.Contains(err.Error(), "server response headers exceeded") {
		return errors.Join(ErrResponseHeaderTooLarge, err)
	}
	return err
}

// transport is the lease's HTTP transport: its connections are sockets of
// the lease's network namespace.
func (n *Net) transport() *http.Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ingressTransport == nil {
		n.ingressTransport = &http.Transport{
			DialContext:            n.dial,
			MaxIdleConns:           MaxIdlePerLease,
			MaxIdleConnsPerHost:    4,
			IdleConnTimeout:        30 * time.Second,
			MaxResponseHeaderBytes: MaxResponseHeaderBytes,
			ResponseHeaderTimeout:  0, // a server inside may think as long as it likes
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
