package stack

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/sandboxflow/sandboxflow/codec"
)

// codecServer is the stack's codec server: codec.NewHTTPHandler on a
// loopback port, for the Web UI to decode what it shows.
//
// Its port is bound before the Temporal server starts, since the UI's
// configuration names it; it serves once the UI's origin is known, since
// its CORS rules name that.
type codecServer struct {
	ln     net.Listener
	srv    *http.Server
	served chan error
}

// listenCodec binds a free loopback port for the codec server.
func listenCodec() (*codecServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("codec server: %w", err)
	}
	return &codecServer{ln: ln, served: make(chan error, 1)}, nil
}

// URL is the codec server's base URL: the UI posts to URL/decode.
func (c *codecServer) URL() string { return "http://" + c.ln.Addr().String() }

// serve starts serving keys to the browsers of uiURL (none when "").
func (c *codecServer) serve(keys *codec.Keys, uiURL string) {
	c.srv = &http.Server{Handler: codec.NewHTTPHandler(keys, uiOrigins(uiURL)...), ReadHeaderTimeout: 10 * time.Second}
	go func() { c.served <- c.srv.Serve(c.ln) }()
}

// close stops serving (or releases the port, if it never served).
func (c *codecServer) close() error {
	if c.srv == nil {
		return c.ln.Close()
	}
	err := c.srv.Close()
	if served := <-c.served; !errors.Is(served, http.ErrServerClosed) {
		err = errors.Join(err, served)
	}
	if err != nil {
		return fmt.Errorf("codec server: %w", err)
	}
	return nil
}

// uiOrigins are the origins a browser may show the Web UI at uiURL from:
// the URL itself and, for a loopback or unspecified address, the other
// spellings of this machine that reach the same port (an operator opens
// localhost:8233 as often as 127.0.0.1:8233).
func uiOrigins(uiURL string) []string {
	u, err := url.Parse(uiURL)
	if uiURL == "" || err != nil {
		return nil
	}
	origins := []string{u.Scheme + "://" + u.Host}
	ip := net.ParseIP(u.Hostname())
	if ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		for _, host := range []string{"127.0.0.1", "localhost", "[::1]"} {
			if o := u.Scheme + "://" + host + ":" + u.Port(); o != origins[0] {
				origins = append(origins, o)
			}
		}
	}
	return origins
}
