package reliability

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// delayRelay is a TCP relay between a worker and the Temporal frontend
// that delays every byte, in both directions, by the current delay (zero:
// none). It never drops or reorders anything.
type delayRelay struct {
	ln    net.Listener
	delay atomic.Int64 // nanoseconds
}

func newDelayRelay(t *testing.T, target string) *delayRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &delayRelay{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			go r.pipe(in, out)
			go r.pipe(out, in)
		}
	}()
	return r
}

func (r *delayRelay) addr() string { return r.ln.Addr().String() }

func (r *delayRelay) setDelay(d time.Duration) { r.delay.Store(int64(d)) }

// pipe copies src to dst, each chunk held until its delay, read at the
// chunk's arrival, has passed.
func (r *delayRelay) pipe(src, dst net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	queue := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for c := range queue {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	defer close(queue)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			queue <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(time.Duration(r.delay.Load()))}
		}
		if err != nil {
			if err != io.EOF {
				src.Close()
			}
			return
		}
	}
}

// The Temporal frontend answers the worker 1.5 s late each way for the
// first 25 s, while the command is created and recorded: the run
// completes, its command ran exactly once, and nothing leaked (issue 28
// item 1).
func TestSlowTemporalFromTheStart(t *testing.T) {
	e := start(t, options{noWorker: true})
	relay := newDelayRelay(t, e.stack.Temporal.FrontendHostPort())
	e.startWorkerVia(relay.addr())
	relay.setDelay(1500 * time.Millisecond)
	lift := time.AfterFunc(25*time.Second, func() { relay.setDelay(0) })
	defer lift.Stop()
	marker := newMarker()

	req := request(command(marker, "echo done"))
	res, err := e.run(req)
	require.NoError(t, err)
	assert.Equal(t, marker+"\ndone\n", res.Stdout)
	records := processes(e.stack.Sandbox, marker)
	assert.Equal(t, 1, ran(records, marker), describe(records))
}
