package localsandbox

import (
	"encoding/base64"
	"errors"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// Request limits of the process endpoints.
const (
	maxInputBytes     = 256 << 10 // decoded, per input request
	maxArgs           = 10000
	inputWriteTimeout = 10 * time.Second
	defaultGrace      = time.Second
	maxGrace          = time.Minute
	defaultWait       = 30 * time.Second
	maxWait           = 10 * time.Minute
	// streamBatchBytes is how much output a stream takes from the journal
	// between flushes.
	streamBatchBytes = 256 << 10
	// streamWriteTimeout ends a stream whose client has read nothing for
	// this long.
	streamWriteTimeout = 2 * time.Minute
)

// processRequest is the body of POST /processes (and, with stream and
// stdin, of POST /exec): docs/CREATEOS-API.md §3.12 and §3.4.
type processRequest struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Cwd  string            `json:"cwd,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	// Pty runs a managed process on a terminal of that size (kind "pty").
	Pty    *terminalSize `json:"pty,omitempty"`
	Stream bool          `json:"stream,omitempty"`
	Stdin  *string       `json:"stdin,omitempty"`
}

// terminalSize is the body of POST /{pid}/resize and a create's pty.
type terminalSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// maxTerminalSide bounds a terminal's rows and columns.
const maxTerminalSide = 1000

// winSize checks a terminal size.
func (t terminalSize) winSize() (*leaseinit.WinSize, error) {
	if t.Rows < 1 || t.Rows > maxTerminalSide || t.Cols < 1 || t.Cols > maxTerminalSide {
		return nil, badRequest("pty rows and cols must be between 1 and %d", maxTerminalSide)
	}
	return &leaseinit.WinSize{Rows: uint16(t.Rows), Cols: uint16(t.Cols)}, nil
}

// defaultShell is what a pty process without cmd runs: the image's bash
// if it has one, else its sh, interactive.
var defaultShell = []string{"/bin/sh", "-c", "command -v bash >/dev/null && exec bash -i; exec sh -i"}

// defaultTerm is TERM for a pty process whose request sets none.
const defaultTerm = "xterm-256color"

func (req *processRequest) argv() ([]string, error) {
	if req.Cmd == "" && req.Pty != nil && len(req.Args) == 0 {
		return slices.Clone(defaultShell), nil
	}
	if req.Cmd == "" {
		return nil, badRequest("cmd is required")
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	if len(req.Args) > maxArgs {
		return nil, badRequest("at most %d args", maxArgs)
	}
	if strings.ContainsRune(req.Cmd, 0) || strings.ContainsRune(req.Cwd, 0) {
		return nil, badRequest("cmd and cwd must not contain NUL")
	}
	for _, a := range req.Args {
		if strings.ContainsRune(a, 0) {
			return nil, badRequest("args must not contain NUL")
		}
	}
	return append([]string{req.Cmd}, req.Args...), nil
}

// startErrorStatus maps an error from lease.start to its answer.
func startErrorStatus(err error) error {
	var se *startError
	switch {
	case errors.As(err, &se):
		return startFailed(se.msg)
	case errors.Is(err, errLeaseGone):
		return notFound("sandbox")
	case errors.Is(err, errLeaseNotRunning):
		return conflict(err.Error())
	case errors.Is(err, errTooManyProcesses):
		return withCode("TOO_MANY_PROCESSES", &apiError{http.StatusTooManyRequests, err.Error()})
	}
	return err
}

func (s *Server) createProcess(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	var req processRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Stream || req.Stdin != nil {
		return badRequest("stream and stdin belong to exec; a process takes input through /input")
	}
	var size *leaseinit.WinSize
	if req.Pty != nil {
		if size, err = req.Pty.winSize(); err != nil {
			return err
		}
		if _, ok := req.Env["TERM"]; !ok {
			req.Env = maps.Clone(req.Env)
			if req.Env == nil {
				req.Env = map[string]string{}
			}
			req.Env["TERM"] = defaultTerm
		}
	}
	argv, err := req.argv()
	if err != nil {
		return err
	}
	p, err := l.start(argv, req.Cwd, req.Env, false, size)
	if err != nil {
		return startErrorStatus(err)
	}
	s.log.Info("process started", "sandbox", l.id, "process", p.id)
	return writeData(w, p.view())
}

// processView is a managed process as the API shows it (ManagedProcess,
// docs/CREATEOS-API.md §3.12).
type processView struct {
	ProcessID    string       `json:"process_id"`
	Kind         string       `json:"kind"`
	PID          int          `json:"pid"`
	State        string       `json:"state"`
	LeaderExited bool         `json:"leader_exited"`
	TreeExited   bool         `json:"tree_exited"`
	CreatedAt    time.Time    `json:"created_at"`
	FinishedAt   time.Time    `json:"finished_at,omitzero"`
	ExitCode     *int         `json:"exit_code,omitempty"`
	Signal       string       `json:"signal,omitempty"`
	Cmd          string       `json:"cmd,omitempty"`
	Args         []string     `json:"args,omitempty"`
	Cwd          string       `json:"cwd,omitempty"`
	Output       outputWindow `json:"output"`
}

// outputWindow is the part of a process's output its journal still holds.
type outputWindow struct {
	OldestSeq int64 `json:"oldest_seq"`
	NewestSeq int64 `json:"newest_seq"`
	Bytes     int   `json:"bytes"`
}

// view shows p: "running" until its main process (the leader) exits,
// "terminating" while a DELETE ends its tree, then "exited"; tree_exited
// once nothing of its tree is left.
func (p *process) view() processView {
	v := processView{ProcessID: p.id, Kind: "process", PID: p.pid, State: "running",
		CreatedAt: stamp(p.created), Cmd: p.argv[0], Args: p.argv[1:], Cwd: p.cwd}
	if p.size != nil {
		v.Kind = "pty"
	}
	p.mu.Lock()
	exit, finished := p.exit, p.finished
	p.mu.Unlock()
	select {
	case <-p.done:
		v.TreeExited = true
	default:
	}
	switch {
	case exit != nil:
		v.State, v.LeaderExited, v.FinishedAt = "exited", true, stamp(finished)
		if exit.Signal != "" {
			v.Signal = exit.Signal
		} else {
			v.ExitCode = &exit.Code
		}
	case p.terminating.Load():
		v.State = "terminating"
	}
	v.Output.OldestSeq, v.Output.NewestSeq, v.Output.Bytes = p.journal.Window()
	return v
}

// listProcesses answers GET /processes: the running processes and the
// exited ones still retained, oldest first.
func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	l.mu.Lock()
	procs := make([]*process, 0, len(l.procs))
	for _, p := range l.procs {
		if !p.oneShot {
			procs = append(procs, p)
		}
	}
	l.mu.Unlock()
	slices.SortFunc(procs, func(a, b *process) int { return a.created.Compare(b.created) })
	views := make([]processView, 0, len(procs))
	for _, p := range procs {
		views = append(views, p.view())
	}
	return writeData(w, map[string]any{"processes": views})
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) error {
	_, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	return writeData(w, p.view())
}

func (s *Server) lookupProcess(r *http.Request) (*lease, *process, error) {
	l, err := s.lookupLease(r)
	if err != nil {
		return nil, nil, err
	}
	pid, err := pathID(r, "pid")
	if err != nil {
		return nil, nil, err
	}
	p, ok := l.process(pid)
	if !ok {
		return nil, nil, notFound("process")
	}
	return l, p, nil
}

func (s *Server) closeStdin(w http.ResponseWriter, r *http.Request) error {
	_, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	// 200 after the process exited and on a repeat, as the Go and Python
	// examples expect: they close stdin of a process that may be done.
	if err := p.closeStdin(); err != nil {
		return err
	}
	return writeData(w, okAnswer)
}

// okAnswer is the answer of a request that has nothing more to say.
var okAnswer = map[string]bool{"ok": true}

func (s *Server) input(w http.ResponseWriter, r *http.Request) error {
	_, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	var req struct {
		DataBase64 *string `json:"data_base64"`
	}
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.DataBase64 == nil {
		return badRequest("data_base64 is required")
	}
	if base64.StdEncoding.DecodedLen(len(*req.DataBase64)) > maxInputBytes+2 {
		return &apiError{http.StatusRequestEntityTooLarge, "input is limited to 256 KiB a request"}
	}
	data, err := base64.StdEncoding.Strict().DecodeString(*req.DataBase64)
	if err != nil {
		return badRequest("data_base64 is not valid padded base64")
	}
	if len(data) > maxInputBytes {
		return &apiError{http.StatusRequestEntityTooLarge, "input is limited to 256 KiB a request"}
	}
	switch err := p.writeStdin(data, inputWriteTimeout); {
	case err == nil:
		return writeData(w, map[string]int64{"input_seq": p.inputSeq.Add(1)})
	case errors.Is(err, errStdinClosed):
		return conflict("stdin is closed")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &apiError{http.StatusRequestTimeout, "the process is not reading its stdin"}
	case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
		return conflict("nothing reads the process's stdin any more")
	default:
		return err
	}
}

// allowedSignals are the signals a client may send to a process tree: the
// official ones (docs/CREATEOS-API.md §3.12) and [ext] SIGALRM.
var allowedSignals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL, "SIGINT": syscall.SIGINT,
	"SIGHUP": syscall.SIGHUP, "SIGQUIT": syscall.SIGQUIT, "SIGUSR1": syscall.SIGUSR1,
	"SIGUSR2": syscall.SIGUSR2, "SIGWINCH": syscall.SIGWINCH, "SIGALRM": syscall.SIGALRM,
}

// signal answers POST /{pid}/signal: the signal goes to every process of the
// tree.
func (s *Server) signal(w http.ResponseWriter, r *http.Request) error {
	_, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	var req struct {
		Signal string `json:"signal"`
	}
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	sig, ok := allowedSignals[req.Signal]
	if !ok {
		return badRequest("signal must be one of SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGALRM")
	}
	select {
	case <-p.done:
		return conflict("the process tree has exited")
	default:
	}
	p.signal(sig)
	return writeData(w, okAnswer)
}

// resize answers POST /{pid}/resize {rows, cols}: a pty process's new
// terminal size, and SIGWINCH to its foreground process group.
func (s *Server) resize(w http.ResponseWriter, r *http.Request) error {
	_, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	var req terminalSize
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	size, err := req.winSize()
	if err != nil {
		return err
	}
	if p.size == nil {
		return conflict("the process runs on pipes, not on a pty")
	}
	if err := p.resize(*size); errors.Is(err, errNoTerminal) {
		return conflict("the process tree has exited")
	} else if err != nil {
		return err
	}
	return writeData(w, okAnswer)
}

// deleteProcess answers DELETE /{pid}?grace_ms=N: SIGTERM to the tree,
// SIGKILL after the grace, then the process's view; tree_exited is true
// only when the tree is gone, and then the process is forgotten.
func (s *Server) deleteProcess(w http.ResponseWriter, r *http.Request) error {
	l, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	grace, err := queryDuration(r, "grace_ms", defaultGrace, maxGrace)
	if err != nil {
		return err
	}
	gone := p.terminate(grace)
	if gone {
		l.forget(p)
	} else {
		s.log.Error("a process tree survived SIGKILL", "sandbox", l.id, "process", p.id)
	}
	return writeData(w, p.view())
}

// wait answers GET /{pid}/wait?scope=tree&timeout_ms=N with the process's
// view once the whole tree has exited (scope=leader: once the main process
// has), or at the timeout, with the view as it is then.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) error {
	_, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	timeout, err := queryDuration(r, "timeout_ms", defaultWait, maxWait)
	if err != nil {
		return err
	}
	until := p.done
	switch scope := r.URL.Query().Get("scope"); scope {
	case "", "tree":
	case "leader", "process":
		until = p.mainExited
	default:
		return badRequest("scope must be leader or tree")
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-until:
	case <-timer.C:
	case <-r.Context().Done():
		return nil
	}
	return writeData(w, p.view())
}

// connect answers GET /{pid}/connect?after=N with the NDJSON event stream:
// every journal entry after N, then live ones, heartbeats while idle, and
// finally the exit (or an error) frame — except when Shutdown killed the
// process: then the stream breaks.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) error {
	l, p, err := s.lookupProcess(r)
	if err != nil {
		return err
	}
	defer l.hold()() // not idle while a stream is open
	after, err := queryInt(r, "after", 0, math.MaxInt64-1)
	if err != nil {
		return err
	}
	c, err := p.journal.Attach(after)
	if err != nil {
		return withCode("OUTPUT_EXPIRED", &apiError{http.StatusGone, "output after that seq was evicted from the journal"})
	}
	defer p.journal.Detach(c)
	out := newFrameWriter(w, s.opts.HeartbeatInterval)
	var frame []byte
	entries := make([]journal.Entry, 0, 16)
	for {
		b := p.journal.Take(c, entries, streamBatchBytes)
		switch {
		case b.Err != nil:
			out.send([]byte(`{"type":"error","error":"output_offset_expired"}` + "\n"))
			return nil
		case b.Exit != nil:
			select {
			case <-s.done:
				// The server is going away and took the process with it: that
				// is not how the command ended. Break the stream, as a crash
				// would, so the client finds the lease gone rather than
				// reporting the command killed.
				panic(http.ErrAbortHandler)
			default:
			}
			frame = frame[:0]
			if b.Exit.Signal != "" {
				frame = append(frame, `{"type":"exit","signal":"`...)
				frame = append(frame, b.Exit.Signal...)
				frame = append(frame, "\"}\n"...)
			} else {
				frame = append(frame, `{"type":"exit","exit_code":`...)
				frame = strconv.AppendInt(frame, int64(b.Exit.Code), 10)
				frame = append(frame, "}\n"...)
			}
			out.send(frame)
			return nil
		case len(b.Entries) > 0:
			for _, e := range b.Entries {
				frame = append(frame[:0], `{"type":"data","seq":`...)
				frame = strconv.AppendInt(frame, e.Seq, 10)
				frame = append(frame, `,"stream":"`...)
				frame = append(frame, e.Stream.String()...)
				frame = append(frame, `","data_base64":"`...)
				frame = base64.StdEncoding.AppendEncode(frame, e.Data)
				frame = append(frame, "\"}\n"...)
				if !out.write(frame) {
					return nil
				}
			}
			clear(b.Entries) // drop references to the data
		default:
			if !out.idle(r, b.Wait, []byte(`{"type":"heartbeat"}`+"\n")) {
				return nil
			}
		}
	}
}

// frameWriter writes an NDJSON stream: frames, flushes when the stream
// goes idle, heartbeats while it stays idle.
type frameWriter struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	heartbeat *time.Timer
	interval  time.Duration
	failed    bool
}

func newFrameWriter(w http.ResponseWriter, heartbeat time.Duration) *frameWriter {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: http.NewResponseController(w), heartbeat: time.NewTimer(heartbeat), interval: heartbeat}
	fw.flush()
	return fw
}

// write writes one frame; false once the client is gone.
func (fw *frameWriter) write(frame []byte) bool {
	if fw.failed {
		return false
	}
	fw.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if _, err := fw.w.Write(frame); err != nil {
		fw.failed = true
		return false
	}
	fw.heartbeat.Reset(fw.interval)
	return true
}

// send writes a final frame and flushes it.
func (fw *frameWriter) send(frame []byte) {
	if fw.write(frame) {
		fw.flush()
	}
	fw.heartbeat.Stop()
}

func (fw *frameWriter) flush() {
	fw.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if fw.rc.Flush() != nil {
		fw.failed = true
	}
}

// idle flushes, then waits for more (wake), writing heartbeats meanwhile.
// It returns false once the client is gone.
func (fw *frameWriter) idle(r *http.Request, wake <-chan struct{}, heartbeat []byte) bool {
	fw.flush()
	for !fw.failed {
		select {
		case <-wake:
			return true
		case <-fw.heartbeat.C:
			fw.write(heartbeat)
			fw.flush()
		case <-r.Context().Done():
			return false
		}
	}
	return false
}
