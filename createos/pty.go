package createos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Terminal is a managed process on a pseudo-terminal in a sandbox
// (kind "pty", docs/CREATEOS-API.md §3.12), for a person at a keyboard:
// what it shows comes through Follow, what is typed goes through Input,
// and Resize changes its size. Nothing of it is retried on its own
// behalf but the output stream, which resumes from its cursor.
type Terminal struct {
	c       *Client
	leaseID string
	id      string
}

// TerminalSpec is what OpenTerminal starts.
type TerminalSpec struct {
	// Cmd and Args are the command; an empty Cmd (and no Args) asks for
	// the image's shell.
	Cmd  string
	Args []string
	Cwd  string
	Env  map[string]string
	// Rows and Cols are the terminal's size, each 1..MaxTerminalSide.
	Rows, Cols int
}

// MaxTerminalSide bounds a terminal's rows and columns, as the server does.
const MaxTerminalSide = 1000

// maxInputChunk is the most bytes one input request carries: the server
// takes 256 KiB, and a paste larger than that is split.
const maxInputChunk = 64 << 10

// ptyStream is the stream name of a terminal's output frames.
const ptyStream = "pty"

func checkTerminalSize(rows, cols int) error {
	if rows < 1 || rows > MaxTerminalSide || cols < 1 || cols > MaxTerminalSide {
		return &sandbox.InvalidInputError{Field: "terminal size", Reason: fmt.Sprintf("rows and cols must be between 1 and %d", MaxTerminalSide)}
	}
	return nil
}

// OpenTerminal starts spec in the sandbox leaseID on a new terminal.
func (c *Client) OpenTerminal(ctx context.Context, leaseID string, spec TerminalSpec) (*Terminal, error) {
	if err := sandbox.CheckID("lease id", leaseID); err != nil {
		return nil, err
	}
	if err := checkTerminalSize(spec.Rows, spec.Cols); err != nil {
		return nil, err
	}
	body := map[string]any{"pty": map[string]int{"rows": spec.Rows, "cols": spec.Cols}}
	if spec.Cmd != "" {
		body["cmd"] = spec.Cmd
	}
	if len(spec.Args) > 0 {
		body["args"] = spec.Args
	}
	if spec.Cwd != "" {
		body["cwd"] = spec.Cwd
	}
	if len(spec.Env) > 0 {
		body["env"] = spec.Env
	}
	rq := request{op: "open terminal", method: http.MethodPost, path: sandboxPath(leaseID) + "/processes", json: body}
	var data struct {
		ProcessID string `json:"process_id"`
		Kind      string `json:"kind"`
	}
	if err := c.call(ctx, rq, &data); err != nil {
		return nil, leaseGoneOn404(err, leaseID)
	}
	if !sandbox.ValidID(data.ProcessID) {
		return nil, invalidResponse(rq.op, "the process id is missing or not a valid id")
	}
	if data.Kind != ptyStream {
		return nil, invalidResponse(rq.op, "the process is not on a terminal")
	}
	return &Terminal{c: c, leaseID: leaseID, id: data.ProcessID}, nil
}

// ID is the terminal's process id.
func (t *Terminal) ID() string { return t.id }

// Input types data into the terminal: keystrokes, or a paste (sent in
// pieces of at most 64 KiB, in order).
func (t *Terminal) Input(ctx context.Context, data []byte) error {
	for len(data) > 0 {
		n := min(len(data), maxInputChunk)
		if err := t.c.writeInput(ctx, t.leaseID, t.id, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// Resize sets the terminal's size; its foreground program gets SIGWINCH.
func (t *Terminal) Resize(ctx context.Context, rows, cols int) error {
	if err := checkTerminalSize(rows, cols); err != nil {
		return err
	}
	return t.c.call(ctx, request{op: "resize terminal", method: http.MethodPost, path: processPath(t.leaseID, t.id) + "/resize",
		json: map[string]int{"rows": rows, "cols": cols}}, nil)
}

// Kill ends the terminal's whole process tree.
func (t *Terminal) Kill(ctx context.Context) error { return t.c.killProcess(ctx, t.leaseID, t.id) }

// TerminalExit is how a terminal's command ended: its exit code, or the
// signal that killed it.
type TerminalExit struct {
	Code   int
	Signal string
}

// maxTerminalReconnects is how many times in a row Follow reopens a
// stream that broke without delivering anything.
const maxTerminalReconnects = 3

// Follow writes everything the terminal shows to w, from its start, until
// its command exits, and returns how it exited. A stream that breaks is
// reopened after the last byte written, so nothing is shown twice.
func (t *Terminal) Follow(ctx context.Context, w io.Writer) (TerminalExit, error) {
	var after int64
	for failures := 0; ; {
		s, err := t.c.connect(ctx, t.leaseID, t.id, after)
		if err != nil {
			return TerminalExit{}, leaseGoneOn404(err, t.leaseID)
		}
		before := after
		exit, done, err := t.read(s, w, &after)
		s.Close()
		if done || err != nil {
			return exit, err
		}
		if ctx.Err() != nil {
			return TerminalExit{}, ctx.Err()
		}
		if after == before {
			if failures++; failures >= maxTerminalReconnects {
				return TerminalExit{}, &sandbox.UnavailableError{Operation: "follow terminal", Err: errStreamEnded}
			}
		} else {
			failures = 0
		}
	}
}

// read copies one stream's terminal output to w. done is true at the exit
// frame; a stream that broke is neither done nor an error.
func (t *Terminal) read(s *stream, w io.Writer, after *int64) (exit TerminalExit, done bool, err error) {
	for {
		line, err := s.next()
		if errors.Is(err, errStreamEnded) || errors.Is(err, errStreamIdle) || errors.Is(err, io.ErrUnexpectedEOF) {
			return TerminalExit{}, false, nil
		}
		if err != nil {
			return TerminalExit{}, false, err
		}
		if strings.TrimSpace(string(line)) == "" {
			continue
		}
		var f wireFrame
		if json.Unmarshal(line, &f) != nil || f.Type == nil {
			return TerminalExit{}, false, protocolError(sandbox.InvalidFrame, "a terminal frame is not a JSON object with a type")
		}
		switch *f.Type {
		case "heartbeat":
		case "data":
			if f.Seq == nil || *f.Seq != *after+1 || f.Stream == nil || *f.Stream != ptyStream || f.Data == nil {
				return TerminalExit{}, false, protocolError(sandbox.InvalidFrame, fmt.Sprintf("a terminal's data frame after seq %d is not the next of stream pty", *after))
			}
			data, err := strictBase64.DecodeString(*f.Data)
			if err != nil {
				return TerminalExit{}, false, protocolError(sandbox.InvalidFrame, "a terminal's data frame is not valid base64")
			}
			if _, err := w.Write(data); err != nil {
				return TerminalExit{}, false, err
			}
			*after = *f.Seq
		case "exit":
			st, err := parseExitStatus(f.ExitCode, f.Signal)
			if err != nil {
				return TerminalExit{}, false, err
			}
			return TerminalExit{Code: st.code, Signal: st.signal}, true, nil
		case "error":
			return TerminalExit{}, false, &sandbox.UnavailableError{Operation: "follow terminal", Err: errors.New("the server ended the terminal's output stream with an error")}
		default:
			return TerminalExit{}, false, protocolError(sandbox.InvalidFrame, "a terminal frame of an unknown type")
		}
	}
}
