package createos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// A follower reads one process's output until the process exits
// (PROTOCOL.md §6, step 5): it attaches to the output stream, reconnects
// when the stream is lost, checks every frame, and decodes and keeps the
// output.
//
// Reconnects are budgeted: connect failures and lost streams share
// maxReconnects, and a good connect does not restore it. Once the budget is
// spent, the follower asks the server to wait for the process tree and
// succeeds only if it has read the whole journal (its cursor is the
// newest seq), after at most one more replay.
type follower struct {
	c       *Client
	leaseID string
	pid     string
	obs     sandbox.Observer
	// onAttach runs once, when a stream is first attached: the run opens
	// the start gate there, so that no output can be missed.
	onAttach func(context.Context) error

	cursor   int64 // the seq of the last data frame taken
	attached bool  // a stream was attached at least once
	connects int   // connect requests made
	out      [2]streamOutput
	// lost is set when output was lost before it could be read.
	lost bool
	// scratch is where data frames are decoded, frame after frame.
	scratch []byte
	// heartbeat is the longest interval seen between two heartbeats with
	// nothing between them: the server's heartbeat interval, once known.
	heartbeat time.Duration
}

// A stream that has sent heartbeats is taken for stalled once
// missedHeartbeats of its intervals pass without a line (but never sooner
// than minStallTimeout, nor later than Config.StreamIdleTimeout): a server
// that beats every 5 s is noticed gone after 15 s, not 60.
const (
	missedHeartbeats = 3
	minStallTimeout  = time.Second
)

// stallTimeout is how long a stream may stay silent, given the server's
// heartbeat interval; zero while it is not known.
func (f *follower) stallTimeout() time.Duration {
	if f.heartbeat == 0 {
		return 0
	}
	return max(missedHeartbeats*f.heartbeat, minStallTimeout)
}

// streamOutput is what is kept of one output stream.
type streamOutput struct {
	text    utf8Stream
	tail    tail
	lastSeq int64 // the seq of the stream's last frame
}

// lostStream is a connection failure that a reconnect may cure: a connect
// answered 5xx or 429 or not at all, or a stream that ended, broke or went
// silent before the exit frame.
type lostStream struct{ err error }

func (l *lostStream) Error() string { return l.err.Error() }
func (l *lostStream) Unwrap() error { return l.err }

func newFollower(c *Client, leaseID string, obs sandbox.Observer) *follower {
	f := &follower{c: c, leaseID: leaseID, obs: obs, onAttach: func(context.Context) error { return nil }}
	for i := range f.out {
		f.out[i].tail = newTail(c.cfg.captureBytes)
	}
	return f
}

// follow reads the output until the exit frame and returns the exit
// status. When ctx ends, its error wraps ctx's error.
func (f *follower) follow(ctx context.Context) (exitStatus, error) {
	var lost error
	for reconnects := 0; ; reconnects++ {
		if reconnects > 0 {
			if err := sleep(ctx, f.c.reconnectDelay); err != nil {
				return exitStatus{}, fmt.Errorf("reconnect output: %w", err)
			}
		}
		st, err := f.attempt(ctx)
		var l *lostStream
		if !errors.As(err, &l) {
			return st, err
		}
		lost = l.err
		if reconnects == maxReconnects {
			return f.fallback(ctx, lost)
		}
	}
}

// fallback runs when the reconnect budget is spent.
func (f *follower) fallback(ctx context.Context, lost error) (exitStatus, error) {
	exhausted := &sandbox.ConnectionExhaustedError{LeaseID: f.leaseID, ProcessID: f.pid, Err: lost}
	if !f.attached { // nothing is known of the output (Execute: the gate never opened)
		exhausted.Attempts = f.connects
		return exitStatus{}, exhausted
	}
	te, err := f.c.waitExit(ctx, f.leaseID, f.pid)
	if err != nil {
		var protocol *sandbox.ProtocolError
		if ctx.Err() != nil || errors.As(err, &protocol) {
			return exitStatus{}, err
		}
		exhausted.Attempts = f.connects
		return exitStatus{}, exhausted
	}
	if te.knowsNewest && te.newestSeq == f.cursor {
		return te.status, nil
	}
	// One more replay round may still catch up with the journal.
	st, err := f.attempt(ctx)
	var l *lostStream
	switch {
	case err == nil:
		return st, nil
	case !errors.As(err, &l):
		return exitStatus{}, err
	case te.knowsNewest && te.newestSeq == f.cursor:
		return te.status, nil
	}
	exhausted.Attempts, exhausted.Err = f.connects, l.err
	return exitStatus{}, exhausted
}

// attempt connects once, after the cursor, and reads until the exit frame.
// A failure that a reconnect may cure is a *lostStream.
func (f *follower) attempt(ctx context.Context) (exitStatus, error) {
	f.connects++
	s, err := f.c.connect(ctx, f.leaseID, f.pid, f.cursor)
	if err != nil {
		return exitStatus{}, f.connectFailure(ctx, err)
	}
	defer s.Close()
	s.limitIdle(f.stallTimeout())
	if !f.attached {
		f.attached = true
		if err := f.onAttach(ctx); err != nil {
			return exitStatus{}, err
		}
	}
	return f.read(ctx, s)
}

// connectFailure classifies a failed connect.
func (f *follower) connectFailure(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	switch status := statusOf(err); {
	case status == http.StatusGone:
		return &sandbox.OutputEvictedError{ProcessID: f.pid, After: f.cursor}
	case status == http.StatusNotFound:
		// The process is unknown; perhaps because its sandbox is gone.
		var gone *sandbox.LeaseGoneError
		if _, gerr := f.c.GetLease(ctx, f.leaseID); errors.As(gerr, &gone) {
			return gerr
		}
		return err
	case status == http.StatusTooManyRequests || status >= 500:
		return &lostStream{err}
	case status != 0: // another 4xx, or a redirect
		return err
	}
	return &lostStream{err} // no answer
}

// read takes the frames of an attached stream until the exit frame.
//
// Inside one connection the seqs of data frames only grow: a frame whose
// seq does not (it goes backwards, or repeats the one before with other
// bytes) may carry output that was never delivered, so it is not skipped
// as a duplicate. The connection is given up instead, and the reconnect
// replays the journal after the cursor, which the server keeps in order.
// Only a frame repeated as it was (same bytes) is a plain duplicate.
func (f *follower) read(ctx context.Context, s *stream) (exitStatus, error) {
	var (
		prevSeq  int64 // of the connection's last data frame; 0 before the first
		prevHash uint64
		beat     time.Time // of the last heartbeat, when nothing came after it
	)
	for {
		line, err := s.next()
		if err != nil {
			var protocol *sandbox.ProtocolError
			switch {
			case ctx.Err() != nil:
				return exitStatus{}, fmt.Errorf("read output: %w", ctx.Err())
			case errors.As(err, &protocol):
				return exitStatus{}, err
			}
			return exitStatus{}, &lostStream{err}
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		fr, err := parseFrame(line, f.scratch)
		if err != nil {
			return exitStatus{}, err
		}
		if fr.kind != frameHeartbeat {
			beat = time.Time{}
		}
		switch fr.kind {
		case frameHeartbeat:
			now := time.Now()
			if !beat.IsZero() && now.Sub(beat) > f.heartbeat {
				f.heartbeat = now.Sub(beat)
				s.limitIdle(f.stallTimeout())
			}
			beat = now
		case frameData:
			h := maphash.Bytes(frameSeed, line)
			if prevSeq != 0 && fr.seq <= prevSeq {
				if fr.seq == prevSeq && h == prevHash {
					continue // the frame before, once more
				}
				return exitStatus{}, &lostStream{protocolError(sandbox.SequenceRegression,
					fmt.Sprintf("data frame %d came after frame %d on one connection", fr.seq, prevSeq))}
			}
			prevSeq, prevHash = fr.seq, h
			if err := f.take(fr); err != nil {
				return exitStatus{}, err
			}
			f.scratch = fr.data[:0] // taken: the next frame may reuse it
		case frameExit:
			return fr.exit, nil
		case frameError:
			if fr.code == "output_offset_expired" {
				return exitStatus{}, &sandbox.OutputEvictedError{ProcessID: f.pid, After: f.cursor}
			}
			return exitStatus{}, protocolError(sandbox.ErrorEvent, "the stream ended with error "+quoteIfSafe(fr.code))
		}
	}
}

// frameSeed hashes data frames to tell a repeated frame from another one
// under the same seq.
var frameSeed = maphash.MakeSeed()

// take accepts a data frame: a replayed one is skipped, one that skips a
// seq is a breach of the contract, and the next one is decoded, kept and
// delivered.
func (f *follower) take(fr frame) error {
	if fr.seq <= f.cursor {
		return nil
	}
	if fr.seq != f.cursor+1 {
		return protocolError(sandbox.SequenceGap, fmt.Sprintf("expected seq %d, got %d", f.cursor+1, fr.seq))
	}
	f.cursor = fr.seq
	o := f.output(fr.stream)
	text := o.text.decode(fr.data)
	o.tail.write(text)
	o.lastSeq = fr.seq
	f.obs.Output(sandbox.Chunk{Seq: fr.seq, Stream: fr.stream, Text: text, Bytes: len(fr.data)})
	return nil
}

func (f *follower) output(s sandbox.Stream) *streamOutput {
	if s == sandbox.Stderr {
		return &f.out[1]
	}
	return &f.out[0]
}

// result ends the output and returns the Result of a process that ended
// with st. A character left incomplete becomes U+FFFD, delivered as a last
// chunk (with the seq of the stream's last frame and no new bytes).
func (f *follower) result(st exitStatus) sandbox.Result {
	for _, s := range []sandbox.Stream{sandbox.Stdout, sandbox.Stderr} {
		o := f.output(s)
		if rest := o.text.flush(); rest != "" {
			o.tail.write(rest)
			f.obs.Output(sandbox.Chunk{Seq: o.lastSeq, Stream: s, Text: rest})
		}
	}
	stdout, stderr := f.output(sandbox.Stdout), f.output(sandbox.Stderr)
	return sandbox.Result{
		ProcessID:   f.pid,
		ExitCode:    st.code,
		Signal:      st.signal,
		Stdout:      stdout.tail.String(),
		Stderr:      stderr.tail.String(),
		StdoutStart: stdout.tail.start(),
		StderrStart: stderr.tail.start(),
		Truncated:   f.lost || stdout.tail.truncated() || stderr.tail.truncated(),
	}
}
