package createos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// maxFrame is the longest NDJSON line accepted, newline excluded.
const maxFrame = 1 << 20

var (
	// errStreamEnded: the server closed a stream before the exit frame.
	errStreamEnded = errors.New("the output stream ended before the exit frame")
	// errStreamIdle: not a single line arrived within StreamIdleTimeout.
	errStreamIdle = errors.New("the output stream went silent")
)

// A stream is an open NDJSON response, read line by line. It is given up
// when no line arrives within its idle timeout.
type stream struct {
	body   io.ReadCloser
	ctx    context.Context // cancelled (with a cause) to abort the body
	cancel context.CancelCauseFunc
	idle   *time.Timer
	limit  time.Duration // the idle timeout
	// maxIdle is the configured idle timeout (StreamIdleTimeout); a
	// follower that knows the server's heartbeat sets a shorter one.
	maxIdle time.Duration
	lines   lineReader
}

// openStream paces and sends rq, and returns its body once the server
// answered 200. The response headers must arrive within OperationTimeout;
// the body may then last as long as lines keep coming.
func (c *Client) openStream(ctx context.Context, rq request) (*stream, error) {
	if err := c.pace.wait(ctx); err != nil {
		return nil, &notSentError{op: rq.op, err: err}
	}
	sctx, cancel := context.WithCancelCause(ctx)
	headers := time.AfterFunc(c.cfg.operationTimeout, func() { cancel(errNoAnswer) })
	resp, err := c.send(sctx, rq)
	answeredInTime := headers.Stop()
	if err != nil {
		cancel(nil)
		return nil, transportError(ctx, sctx, rq.op, err)
	}
	if err := checkStatus(rq.op, resp); err != nil {
		resp.Body.Close()
		cancel(nil)
		return nil, err
	}
	if !answeredInTime {
		resp.Body.Close()
		cancel(nil)
		return nil, &sandbox.UnavailableError{Operation: rq.op, Err: errNoAnswer}
	}
	s := &stream{body: resp.Body, ctx: sctx, cancel: cancel, limit: c.cfg.streamIdleTimeout, maxIdle: c.cfg.streamIdleTimeout}
	s.lines.r = bufio.NewReaderSize(resp.Body, 64<<10)
	s.idle = time.AfterFunc(s.limit, func() { cancel(errStreamIdle) })
	return s, nil
}

// limitIdle sets the stream's idle timeout to d, but never above the
// configured one; zero keeps it.
func (s *stream) limitIdle(d time.Duration) {
	if d <= 0 {
		return
	}
	if d = min(d, s.maxIdle); d != s.limit {
		s.limit = d
		s.idle.Reset(d)
	}
}

// next returns the next line, without its end of line. Its errors are a
// *sandbox.ProtocolError for a line over maxFrame, or why the stream was
// lost: errStreamIdle, errStreamEnded or the read error.
func (s *stream) next() ([]byte, error) {
	line, err := s.lines.next()
	switch {
	case err == nil:
		s.idle.Reset(s.limit)
		return line, nil
	case context.Cause(s.ctx) == errStreamIdle:
		return nil, errStreamIdle
	case errors.Is(err, io.EOF):
		return nil, errStreamEnded
	}
	return nil, err
}

// Close aborts the response, whatever is left of it.
func (s *stream) Close() {
	s.idle.Stop()
	s.cancel(nil)
	s.body.Close()
}

// lineReader splits a body into lines of at most maxFrame bytes. A last
// line without its newline is not a line: the stream broke inside it.
type lineReader struct {
	r   *bufio.Reader
	buf []byte // a line longer than r's buffer, put together
}

// next returns the next line, without its end of line. It is valid until
// the next call: a line that fits r's buffer is returned in place.
func (l *lineReader) next() ([]byte, error) {
	chunk, err := l.r.ReadSlice('\n')
	if err == nil && len(chunk) <= maxFrame+1 { // +1: the newline
		return trimEOL(chunk), nil
	}
	l.buf = l.buf[:0]
	for {
		if len(l.buf)+len(chunk) > maxFrame+1 {
			return nil, &sandbox.ProtocolError{Kind: sandbox.FrameTooLarge, Detail: fmt.Sprintf("a line is longer than %d bytes", maxFrame)}
		}
		l.buf = append(l.buf, chunk...)
		switch {
		case err == nil:
			return trimEOL(l.buf), nil
		case errors.Is(err, bufio.ErrBufferFull):
			chunk, err = l.r.ReadSlice('\n')
			continue
		case errors.Is(err, io.EOF) && len(l.buf) > 0:
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
}

// trimEOL cuts the newline, and a CR before it, off the end of a line.
func trimEOL(line []byte) []byte {
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line
}
