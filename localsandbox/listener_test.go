package localsandbox

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// limiterRig is a connLimiter on loopback with its Accept loop running.
type limiterRig struct {
	t        *testing.T
	lim      *connLimiter
	accepted chan net.Conn
}

func newLimiterRig(t *testing.T, max, maxPerAddress int) *limiterRig {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rig := &limiterRig{t: t, lim: newConnLimiter(ln, max, maxPerAddress, slog.New(slog.DiscardHandler)), accepted: make(chan net.Conn, 16)}
	go func() {
		for {
			c, err := rig.lim.Accept()
			if err != nil {
				close(rig.accepted)
				return
			}
			rig.accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for c := range rig.accepted {
			c.Close()
		}
	})
	return rig
}

// dial connects from the loopback address ip.
func (rig *limiterRig) dial(ip byte) net.Conn {
	rig.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, ip)}}
	c, err := d.Dial("tcp", rig.lim.Addr().String())
	if err != nil {
		rig.t.Fatal(err)
	}
	rig.t.Cleanup(func() { c.Close() })
	return c
}

// admitted is the next connection the limiter let through.
func (rig *limiterRig) admitted() net.Conn {
	rig.t.Helper()
	select {
	case c := <-rig.accepted:
		return c
	case <-time.After(hangGuard):
		rig.t.Fatal("no connection was admitted")
		return nil
	}
}

// closedByServer reports whether the server closed the client's c.
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(hangGuard))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded) // EOF, or a reset
}

// TestConnLimiterRefusesWhenAllBusy: with every connection in a request, a
// new one is closed at once rather than left waiting; once one is idle, a
// new one displaces it.
func TestConnLimiterRefusesWhenAllBusy(t *testing.T) {
	rig := newLimiterRig(t, 2, 2)
	a := rig.dial(2)
	serverA := rig.admitted()
	rig.dial(3)
	serverB := rig.admitted()
	rig.lim.connState(serverA, http.StateActive)
	rig.lim.connState(serverB, http.StateActive)

	if refused := rig.dial(4); !closedByServer(t, refused) {
		t.Fatal("a connection over the cap was kept")
	}
	rig.lim.connState(serverA, http.StateIdle)
	rig.dial(5)
	rig.admitted()
	if !closedByServer(t, a) {
		t.Fatal("the idle connection was not displaced")
	}
	rig.lim.mu.Lock()
	open := rig.lim.open
	rig.lim.mu.Unlock()
	if open != 2 {
		t.Errorf("the limiter counts %d connections, want 2", open)
	}
}

// TestConnLimiterPerAddress: an address at its cap displaces its own
// oldest idle connection, not another address's.
func TestConnLimiterPerAddress(t *testing.T) {
	rig := newLimiterRig(t, 10, 2)
	other := rig.dial(9)
	rig.admitted()
	first := rig.dial(2)
	rig.admitted()
	rig.dial(2)
	rig.admitted()
	rig.dial(2)
	rig.admitted()
	if !closedByServer(t, first) {
		t.Fatal("the address's oldest idle connection was not displaced")
	}
	// Displacing closes before Accept returns: a closed connection would
	// read EOF now.
	other.SetReadDeadline(time.Now())
	if _, err := other.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("another address's connection was displaced: %v", err)
	}
	rig.lim.mu.Lock()
	n := rig.lim.perAddr["127.0.0.2"]
	rig.lim.mu.Unlock()
	if n != 2 {
		t.Errorf("127.0.0.2 holds %d connections, want 2", n)
	}
}
