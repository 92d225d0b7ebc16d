package localsandbox

import (
	"container/list"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Timeouts of Serve's connections: how long a request's header may take to
// arrive (also the first one, on a new connection), and how long a
// connection may wait for its next request.
const (
	headerTimeout = 10 * time.Second
	idleTimeout   = time.Minute
)

// connLimiter is the listener Serve answers on: it holds at most max
// connections, and at most maxPerAddress from one IP address. A connection
// over a cap displaces the connection that has waited longest for a request
// (of its own address when that cap is the one reached), so idle
// connections, however many, never keep a client with a request out; when
// every connection has a request in flight, the new one is closed at once.
//
// Refusing rather than waiting is deliberate: netutil.LimitListener stops
// calling Accept at its cap, which leaves new connections in the kernel's
// backlog, where a client's request waits, unanswered and without an
// error, until some connection ends, and an idle one ends only at
// headerTimeout or idleTimeout. Here a client either gets in at once or
// sees its connection closed and can retry.
type connLimiter struct {
	net.Listener
	max, maxPerAddress int
	log                *slog.Logger

	mu      sync.Mutex
	open    int
	perAddr map[string]int
	// idle holds the connections without a request in flight, longest
	// waiting first.
	idle       list.List
	lastWarned time.Time
}

func newConnLimiter(l net.Listener, max, maxPerAddress int, log *slog.Logger) *connLimiter {
	return &connLimiter{Listener: l, max: max, maxPerAddress: maxPerAddress, log: log, perAddr: make(map[string]int)}
}

// limitedConn is a connection counted by its connLimiter.
type limitedConn struct {
	net.Conn
	lim  *connLimiter
	addr string // the client's IP address; "" off TCP, where only max applies
	// Guarded by lim.mu.
	idle     *list.Element
	released bool
}

func (c *limitedConn) Close() error {
	c.lim.mu.Lock()
	c.lim.releaseLocked(c)
	c.lim.mu.Unlock()
	return c.Conn.Close()
}

// Accept returns the next connection within the caps, closing the
// connections it displaces or refuses.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		admitted, displaced := l.admit(c)
		if displaced != nil {
			displaced.Conn.Close()
		}
		if admitted != nil {
			return admitted, nil
		}
		c.Close()
	}
}

func (l *connLimiter) admit(c net.Conn) (admitted, displaced *limitedConn) {
	addr := ""
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		addr = a.IP.String()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	addrFull := addr != "" && l.perAddr[addr] >= l.maxPerAddress
	if addrFull || l.open >= l.max {
		for e := l.idle.Front(); e != nil; e = e.Next() {
			if lc := e.Value.(*limitedConn); !addrFull || lc.addr == addr {
				displaced = lc
				break
			}
		}
		l.warnLocked(addr, displaced != nil)
		if displaced == nil {
			return nil, nil
		}
		l.releaseLocked(displaced)
	}
	lc := &limitedConn{Conn: c, lim: l, addr: addr}
	l.open++
	if addr != "" {
		l.perAddr[addr]++
	}
	lc.idle = l.idle.PushBack(lc) // until its first request arrives
	return lc, displaced
}

// warnLocked logs, at most once a minute, that a cap was reached.
func (l *connLimiter) warnLocked(addr string, displacing bool) {
	if time.Since(l.lastWarned) < time.Minute {
		return
	}
	l.lastWarned = time.Now()
	what := "refusing new connections: every connection has a request in flight"
	if displacing {
		what = "closing idle connections to admit new ones"
	}
	l.log.Warn("connection cap reached: "+what, "open", l.open, "max", l.max,
		"client", addr, "from_client", l.perAddr[addr], "max_per_address", l.maxPerAddress)
}

func (l *connLimiter) releaseLocked(c *limitedConn) {
	if c.released {
		return
	}
	c.released = true
	l.open--
	if c.addr != "" {
		if l.perAddr[c.addr]--; l.perAddr[c.addr] == 0 {
			delete(l.perAddr, c.addr)
		}
	}
	if c.idle != nil {
		l.idle.Remove(c.idle)
		c.idle = nil
	}
}

// connState is the http.Server's ConnState hook: it tells the limiter which
// connections have a request in flight.
func (l *connLimiter) connState(c net.Conn, state http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released {
		return
	}
	switch state {
	case http.StateIdle:
		if lc.idle == nil {
			lc.idle = l.idle.PushBack(lc)
		}
	case http.StateActive:
		if lc.idle != nil {
			l.idle.Remove(lc.idle)
			lc.idle = nil
		}
	case http.StateHijacked, http.StateClosed:
		l.releaseLocked(lc)
	}
}
