package localsandbox

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"golang.org/x/sys/unix"
)

// exec answers POST /exec: a one-shot command under the same isolation as
// a managed process, with the sandbox's envs and the request's env. It
// answers once the command exited, with data{result{exit_code, stdout,
// stderr}, exec_ms} (the last JournalBytes of each stream; a command killed
// by a signal reports 128+n, and [ext] the signal's name), or with
// ?stream=true as NDJSON. A command that cannot start is a result too:
// exit code 127 and result.error saying why. What the command left running
// in the background lives on in the lease; in process-group mode, and when
// the client goes away first, its tree is killed.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	defer l.hold()() // not idle while the exec runs
	var req processRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Pty != nil {
		return unsupported("pty", "an exec runs on pipes; a terminal is a managed process's (POST /processes with pty)")
	}
	argv, err := req.argv()
	if err != nil {
		return err
	}
	streamed := req.Stream || r.URL.Query().Get("stream") == "true"
	began := time.Now()
	p, err := l.start(argv, req.Cwd, req.Env, true, nil)
	var se *startError
	if errors.As(err, &se) {
		return s.notStarted(w, streamed, startFailed(se.msg).msg)
	}
	if err != nil {
		return startErrorStatus(err)
	}
	defer p.terminate(0)
	if req.Stdin != nil {
		input := []byte(*req.Stdin)
		s.workers.Go(func() {
			p.writeStdin(input, maxWait)
			p.closeStdin()
		})
	} else {
		p.closeStdin()
	}
	c, _ := p.journal.Attach(0)
	defer p.journal.Detach(c)
	if streamed {
		s.execStream(w, r, p, c)
		return nil
	}

	tails := [2]tail{{max: s.opts.JournalBytes}, {max: s.opts.JournalBytes}}
	entries := make([]journal.Entry, 0, 16)
	for {
		b := p.journal.Take(c, entries, streamBatchBytes)
		switch {
		case b.Err != nil:
			return &apiError{http.StatusInternalServerError, "output was lost"}
		case b.Exit != nil:
			l.publishNow()
			return writeData(w, execAnswer{
				Result: commandResult{
					ExitCode: exitCode(*b.Exit),
					Stdout:   string(tails[journal.Stdout].bytes()),
					Stderr:   string(tails[journal.Stderr].bytes()),
					Signal:   b.Exit.Signal,
				},
				ExecMS: float64(time.Since(began).Microseconds()) / 1000,
			})
		case len(b.Entries) > 0:
			for _, e := range b.Entries {
				tails[e.Stream].write(e.Data)
			}
			clear(b.Entries)
		default:
			select {
			case <-b.Wait:
			case <-r.Context().Done():
				return nil
			}
		}
	}
}

// execAnswer is the answer of a buffered exec.
type execAnswer struct {
	Result commandResult `json:"result"`
	ExecMS float64       `json:"exec_ms"`
}

type commandResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	// Error says why the command could not start.
	Error  string `json:"error,omitempty"`
	Signal string `json:"signal,omitempty"` // [ext]
}

// notFoundExit is the exit code of a command that could not start, as a
// shell reports one it cannot find.
const notFoundExit = 127

// notStarted answers an exec whose command could not start (why says why,
// with what it quotes of the request cut to maxEcho): a result, as the
// service's agent reports it, not a failure of the request.
func (s *Server) notStarted(w http.ResponseWriter, streamed bool, why string) error {
	if !streamed {
		return writeData(w, execAnswer{Result: commandResult{ExitCode: notFoundExit, Error: why}})
	}
	out := newFrameWriter(w, s.opts.HeartbeatInterval)
	frame, _ := json.Marshal(map[string]string{"error": why})
	out.write(append(frame, '\n'))
	out.send([]byte(`{"exit_code":` + strconv.Itoa(notFoundExit) + "}\n"))
	return nil
}

// execStream writes the NDJSON of a streamed exec: {"stdout":"…"} and
// {"stderr":"…"} text (a UTF-8 character split between reads is sent whole),
// {"hb":true} while idle, then {"exit_code":N} or {"error":"…"}.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, p *process, c *journal.Cursor) {
	out := newFrameWriter(w, s.opts.HeartbeatInterval)
	var pending [2][]byte
	emit := func(st journal.Stream, text []byte) bool {
		if len(text) == 0 {
			return true
		}
		frame, _ := json.Marshal(map[string]string{st.String(): string(text)})
		return out.write(append(frame, '\n'))
	}
	entries := make([]journal.Entry, 0, 16)
	for {
		b := p.journal.Take(c, entries, streamBatchBytes)
		switch {
		case b.Err != nil:
			out.send([]byte(`{"error":"output_offset_expired"}` + "\n"))
			return
		case b.Exit != nil:
			p.lease.publishNow()
			for st := range pending {
				if !emit(journal.Stream(st), pending[st]) {
					return
				}
			}
			frame, _ := json.Marshal(map[string]int{"exit_code": exitCode(*b.Exit)})
			out.send(append(frame, '\n'))
			return
		case len(b.Entries) > 0:
			for _, e := range b.Entries {
				data := append(pending[e.Stream], e.Data...)
				complete, rest := splitUTF8(data)
				if !emit(e.Stream, complete) {
					return
				}
				pending[e.Stream] = slices.Clone(rest)
			}
			clear(b.Entries)
		default:
			if !out.idle(r, b.Wait, []byte(`{"hb":true}`+"\n")) {
				return
			}
		}
	}
}

// exitCode is the shell's view of an exit status: 128+n for signal n.
func exitCode(st journal.ExitStatus) int {
	if st.Signal != "" {
		return 128 + int(unix.SignalNum(st.Signal))
	}
	return st.Code
}

// splitUTF8 splits b before a trailing incomplete UTF-8 sequence, if any.
func splitUTF8(b []byte) (complete, rest []byte) {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		c := b[i]
		if c < utf8.RuneSelf {
			break // ASCII: everything before is complete
		}
		if !utf8.RuneStart(c) {
			continue // a continuation byte: look further back
		}
		need := 0
		switch {
		case c&0xE0 == 0xC0:
			need = 2
		case c&0xF0 == 0xE0:
			need = 3
		case c&0xF8 == 0xF0:
			need = 4
		}
		if need > len(b)-i {
			return b[:i], b[i:]
		}
		break
	}
	return b, nil
}

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	buf []byte
}

func (t *tail) write(p []byte) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
}

func (t *tail) bytes() []byte {
	if len(t.buf) > t.max {
		return t.buf[len(t.buf)-t.max:]
	}
	return t.buf
}
