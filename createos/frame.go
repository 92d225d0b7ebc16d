package createos

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// frameKind is the "type" of an event of an output stream.
type frameKind int

const (
	frameHeartbeat frameKind = iota + 1
	frameData
	frameExit
	frameError
)

// frame is one event of a process's output stream (GET …/connect), checked
// against the contract:
//
//	{"type":"heartbeat"}
//	{"type":"data","seq":N,"stream":"stdout"|"stderr","data_base64":"…"}
//	{"type":"exit","exit_code":N}   or   {"type":"exit","signal":"SIGKILL"}
//	{"type":"error","error":"output_offset_expired"}
type frame struct {
	kind   frameKind
	seq    int64          // data: 1, 2, 3… per process
	stream sandbox.Stream // data
	data   []byte         // data: the decoded bytes
	exit   exitStatus     // exit
	code   string         // error: the error code
}

// exitStatus is how a process ended: its exit code, or the signal that
// killed it.
type exitStatus struct {
	code   int
	signal string
}

// wireFrame is a frame as JSON. Raw fields are checked one by one.
type wireFrame struct {
	Type     *string         `json:"type"`
	Seq      *int64          `json:"seq"`
	Stream   *string         `json:"stream"`
	Data     *string         `json:"data_base64"`
	ExitCode json.RawMessage `json:"exit_code"`
	Signal   json.RawMessage `json:"signal"`
	Error    *string         `json:"error"`
}

// strictBase64 is padded standard base64 whose unused bits are zero: every
// byte string has exactly one encoding.
var strictBase64 = base64.StdEncoding.Strict()

// parseFrame checks one NDJSON line (not blank) and returns its frame. Its
// errors are *sandbox.ProtocolError and never quote the line. The data of a
// data frame may be decoded into buf, which is reused when large enough:
// it is valid until buf is used again.
func parseFrame(line, buf []byte) (frame, error) {
	if fr, ok := parseCanonicalData(line, buf); ok {
		return fr, nil
	}
	return parseJSONFrame(line)
}

// parseJSONFrame is parseFrame for any layout of the JSON object.
func parseJSONFrame(line []byte) (frame, error) {
	if t := bytes.TrimLeft(line, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return frame{}, protocolError(sandbox.InvalidFrame, "a frame is not a JSON object")
	}
	var w wireFrame
	if err := json.Unmarshal(line, &w); err != nil {
		return frame{}, protocolError(sandbox.InvalidFrame, "a frame is not valid JSON of the expected shape")
	}
	if w.Type == nil {
		return frame{}, protocolError(sandbox.InvalidFrame, "a frame has no type")
	}
	switch *w.Type {
	case "heartbeat":
		return frame{kind: frameHeartbeat}, nil
	case "data":
		return parseData(w)
	case "exit":
		st, err := parseExitStatus(w.ExitCode, w.Signal)
		if err != nil {
			return frame{}, err
		}
		return frame{kind: frameExit, exit: st}, nil
	case "error":
		code := ""
		if w.Error != nil {
			code = *w.Error
		}
		return frame{kind: frameError, code: code}, nil
	}
	return frame{}, protocolError(sandbox.UnknownEvent, "event type "+quoteIfSafe(*w.Type))
}

func parseData(w wireFrame) (frame, error) {
	if w.Seq == nil || *w.Seq < 1 {
		return frame{}, protocolError(sandbox.InvalidFrame, "a data frame has no positive seq")
	}
	if w.Stream == nil || (*w.Stream != string(sandbox.Stdout) && *w.Stream != string(sandbox.Stderr)) {
		return frame{}, protocolError(sandbox.InvalidFrame, fmt.Sprintf("data frame %d names no stream stdout or stderr", *w.Seq))
	}
	if w.Data == nil {
		return frame{}, protocolError(sandbox.InvalidFrame, fmt.Sprintf("data frame %d has no data_base64", *w.Seq))
	}
	// The decoder skips CR and LF, which the contract's base64 has none
	// of: the length check rejects them.
	data, err := strictBase64.DecodeString(*w.Data)
	if err != nil || strictBase64.EncodedLen(len(data)) != len(*w.Data) {
		return frame{}, protocolError(sandbox.BadBase64, fmt.Sprintf("data frame %d is not strict padded base64", *w.Seq))
	}
	return frame{kind: frameData, seq: *w.Seq, stream: sandbox.Stream(*w.Stream), data: data}, nil
}

// The layout of the data frames that servers (ours included) write.
const (
	canonicalDataStart  = `{"type":"data","seq":`
	canonicalDataStream = `,"stream":"`
	canonicalDataField  = `","data_base64":"`
	canonicalDataEnd    = `"}`
)

// parseCanonicalData reads a data frame laid out exactly as
//
//	{"type":"data","seq":N,"stream":"stdout","data_base64":"…"}
//
// (N positive, without leading zeros; stream stdout or stderr) whose payload
// is strict padded base64, without encoding/json, and decodes the payload
// into buf: data frames carry nearly every byte of a stream, and
// validating and unquoting their long payloads cost encoding/json most of
// its time. Any other line — another layout, escapes, bad base64 — is not
// ok, and parseJSONFrame reads it in full; on the lines this accepts, both
// give the same frame.
func parseCanonicalData(line, buf []byte) (fr frame, ok bool) {
	rest, ok := bytes.CutPrefix(line, []byte(canonicalDataStart))
	if !ok {
		return frame{}, false
	}
	digits := 0
	for digits < len(rest) && rest[digits] >= '0' && rest[digits] <= '9' {
		digits++
	}
	if digits == 0 || digits > 18 || rest[0] == '0' { // 18 digits always fit an int64
		return frame{}, false
	}
	var seq int64
	for _, d := range rest[:digits] {
		seq = seq*10 + int64(d-'0')
	}
	if rest, ok = bytes.CutPrefix(rest[digits:], []byte(canonicalDataStream)); !ok || len(rest) < len("stdout") {
		return frame{}, false
	}
	stream := sandbox.Stream(rest[:len("stdout")])
	if stream != sandbox.Stdout && stream != sandbox.Stderr {
		return frame{}, false
	}
	if rest, ok = bytes.CutPrefix(rest[len("stdout"):], []byte(canonicalDataField)); !ok {
		return frame{}, false
	}
	payload, ok := bytes.CutSuffix(rest, []byte(canonicalDataEnd))
	if !ok || bytes.IndexByte(payload, '"') >= 0 {
		return frame{}, false
	}
	// Strict decoding rejects every byte outside the alphabet but CR and
	// LF, which it skips: the length check rejects those.
	size := strictBase64.DecodedLen(len(payload))
	if buf == nil || cap(buf) < size { // never nil: an empty payload is []byte{}, as with DecodeString
		buf = make([]byte, size)
	}
	data := buf[:size]
	n, err := strictBase64.Decode(data, payload)
	if err != nil || strictBase64.EncodedLen(n) != len(payload) {
		return frame{}, false
	}
	return frame{kind: frameData, seq: seq, stream: stream, data: data[:n]}, true
}

// parseExitStatus accepts an integer exit_code or a signal name matching
// ^SIG[A-Z0-9]+$. A field that is present (not null) must be valid; a
// valid signal wins over an exit code, as a Result has one or the other.
func parseExitStatus(code, signal json.RawMessage) (exitStatus, error) {
	hasCode := len(code) > 0 && string(code) != "null"
	hasSignal := len(signal) > 0 && string(signal) != "null"
	var st exitStatus
	if hasCode {
		n, err := strconv.ParseInt(string(code), 10, 32)
		if err != nil {
			return exitStatus{}, protocolError(sandbox.MissingExitStatus, "exit_code is not an integer")
		}
		st.code = int(n)
	}
	if hasSignal {
		var name string
		if json.Unmarshal(signal, &name) != nil || !validSignal(name) {
			return exitStatus{}, protocolError(sandbox.MissingExitStatus, "signal is not a signal name")
		}
		st = exitStatus{signal: name}
	}
	if !hasCode && !hasSignal {
		return exitStatus{}, protocolError(sandbox.MissingExitStatus, "the exit has neither exit_code nor signal")
	}
	return st, nil
}

// validSignal matches ^SIG[A-Z0-9]+$.
func validSignal(name string) bool {
	if len(name) < 4 || name[:3] != "SIG" {
		return false
	}
	for _, r := range name[3:] {
		if (r < 'A' || r > 'Z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// quoteIfSafe quotes a server-chosen name for an error message when it is
// a short plain token, and hides it otherwise: error text never carries
// what could be a piece of output or a secret.
func quoteIfSafe(s string) string {
	if len(s) == 0 || len(s) > 40 {
		return "(not shown)"
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' && r != '-' && r != '.' {
			return "(not shown)"
		}
	}
	return strconv.Quote(s)
}

func protocolError(kind sandbox.ProtocolKind, detail string) *sandbox.ProtocolError {
	return &sandbox.ProtocolError{Kind: kind, Detail: detail}
}
