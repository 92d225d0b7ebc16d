package faultproxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"
)

// Proxy is an HTTP reverse proxy to put in front of any
// CreateOS-compatible server: point the client at the proxy's URL and add
// Rules that break particular requests in particular ways — the failures
// that the network and the server really produce, on the real network path.
//
// Requests that no rule matches are forwarded unchanged. The proxy keeps a
// log of every fault it injected (see Log).
type Proxy struct {
	target    *url.URL
	transport http.RoundTripper
	server    *httptest.Server

	mu     sync.Mutex
	rules  []*ruleState
	rand   *rand.Rand
	events []Event
}

// Rule says which requests to break and how.
type Rule struct {
	// Name identifies the rule in the log; optional.
	Name string
	// Method matches the request method; empty matches any.
	Method string
	// Path is a path.Match pattern for the request path without the
	// "/v1" prefix, for example "/sandboxes/*/processes"; empty matches
	// any path.
	Path string
	// After skips the first After matching requests: After 2 breaks the
	// third one.
	After int
	// Times is how many matching requests to break; zero means all of them
	// (after the skipped ones).
	Times int
	// Probability, when above zero, breaks each candidate request with this
	// probability instead of every one.
	Probability float64
	// Fault is what to do to a broken request.
	Fault Fault
}

// Fault is what a rule does to a request. Build one with the functions
// below (Status, DropResponse, Stall, CutStream, …).
type Fault struct {
	kind     faultKind
	status   int
	stall    time.Duration
	frames   int
	bytes    int
	hold     func()
	describe string
}

type faultKind int

const (
	faultStatus faultKind = iota + 1
	faultDropResponse
	faultStall
	faultCutStream
	faultSequenceGap
	faultDuplicateFrames
	faultCorruptBase64
	faultRewindSequence
	faultFailAfterForward
	faultPass
	faultHold
)

func (f Fault) String() string { return f.describe }

// Status answers with an HTTP status and an empty body without forwarding:
// the server never sees the request.
func Status(code int) Fault {
	return Fault{kind: faultStatus, status: code, describe: fmt.Sprintf("answer %d without forwarding", code)}
}

// DropResponse forwards the request, then resets the client's connection
// instead of answering: the server acted, the client cannot know it.
func DropResponse() Fault {
	return Fault{kind: faultDropResponse, describe: "forward, then drop the response"}
}

// Stall forwards the request, then holds the response for d (past the
// client's deadline, if d is long enough) before resetting the connection.
// The server acted; the client sees a timeout.
func Stall(d time.Duration) Fault {
	return Fault{kind: faultStall, stall: d, describe: fmt.Sprintf("forward, then stall %s", d)}
}

// CutStream forwards a streamed response and cuts the connection after
// the given number of NDJSON frames or bytes, whichever comes first (zero
// means no limit of that kind).
func CutStream(frames, bytes int) Fault {
	return Fault{kind: faultCutStream, frames: frames, bytes: bytes, describe: fmt.Sprintf("cut the stream after %d frames / %d bytes", frames, bytes)}
}

// SequenceGap forwards a streamed response but leaves out its data frame
// number n (1-based), so that the client sees a sequence gap.
func SequenceGap(n int) Fault {
	return Fault{kind: faultSequenceGap, frames: n, describe: fmt.Sprintf("drop data frame %d", n)}
}

// DuplicateFrames forwards a streamed response with every data frame sent
// twice.
func DuplicateFrames() Fault {
	return Fault{kind: faultDuplicateFrames, describe: "send every data frame twice"}
}

// CorruptBase64 forwards a streamed response with the payload of data frame
// n (1-based) replaced by invalid base64.
func CorruptBase64(n int) Fault {
	return Fault{kind: faultCorruptBase64, frames: n, describe: fmt.Sprintf("corrupt the base64 of data frame %d", n)}
}

// FailAfterForward forwards the request, lets the server act on it, then
// answers code (and an empty body) instead of the server's answer: the
// client is told that a request failed which in fact succeeded, as a
// gateway does when the server behind it stored an upload and then timed
// out. Before it answers it calls hold, if not nil, and waits for it: a
// test uses it to let the request's effect show on the server side first
// (a process passing the start gate that the request wrote, say).
func FailAfterForward(code int, hold func()) Fault {
	return Fault{kind: faultFailAfterForward, status: code, hold: hold, describe: fmt.Sprintf("forward, then answer %d", code)}
}

// RewindSequence forwards a streamed response with data frame n (1-based,
// at least 2) carrying the seq of the data frame before it: inside one
// connection the sequence goes backwards, and the frame's payload is one
// that the client has not seen.
func RewindSequence(n int) Fault {
	return Fault{kind: faultRewindSequence, frames: max(n, 2), describe: fmt.Sprintf("give data frame %d the seq of the one before", max(n, 2))}
}

// Pass forwards the request unchanged. A rule with it breaks nothing: it
// only records, in Log and Fired, that a matching request was made — to
// assert that a client sent a request (a kill, a reconnect) or to count
// them.
func Pass() Fault {
	return Fault{kind: faultPass, describe: "pass unchanged"}
}

// Hold calls hold and waits for it to return before it forwards the
// request, then relays the answer unchanged: a test holds a request (a
// process create, a start gate) until it has looked at, or changed, the
// world around it.
func Hold(hold func()) Fault {
	return Fault{kind: faultHold, hold: hold, describe: "hold, then pass unchanged"}
}

// Event is one fault the proxy injected.
type Event struct {
	Time   time.Time
	Rule   string
	Method string
	Path   string
	Fault  string
	// Status is the status the server answered with, when the request was
	// forwarded: for DropResponse and Stall it is what the client never
	// learned. Zero when the request was not forwarded or got no answer.
	Status int
	// Response is the start (up to 64 KiB) of the body that the server
	// answered and the client never saw, for DropResponse and Stall on
	// requests that are not streams: the id of a sandbox or process
	// created in the dark, say. It may hold whatever the server sends;
	// String never shows it.
	Response []byte
}

func (e Event) String() string {
	return fmt.Sprintf("%s %s %s: %s", e.Rule, e.Method, e.Path, e.Fault)
}

type ruleState struct {
	Rule
	matched int // matching requests seen
	fired   int // faults injected
}

// New starts a proxy on a loopback port in front of target (an
// origin such as "http://127.0.0.1:7575"). seed makes probabilistic rules
// reproducible. Close it when done.
func New(target string, seed uint64) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("fault proxy: target must be an origin like http://127.0.0.1:7575")
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DisableCompression = true
	// Many clients at once (a soak test) would otherwise open and close a
	// connection to the target for most requests.
	transport.MaxIdleConnsPerHost = 64
	p := &Proxy{
		target:    u,
		transport: transport,
		rand:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
	p.server = httptest.NewServer(p)
	return p, nil
}

// URL is the proxy's origin: give it to the client instead of the
// server's.
func (p *Proxy) URL() string { return p.server.URL }

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.server.CloseClientConnections()
	p.server.Close()
}

// AddRule adds a rule. Rules are tried in the order they were added; the
// first that breaks a request decides its fault.
func (p *Proxy) AddRule(r Rule) {
	if r.Name == "" {
		r.Name = fmt.Sprintf("rule %d", len(p.rules)+1)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, &ruleState{Rule: r})
}

// ClearRules removes every rule: from now on requests pass unchanged.
func (p *Proxy) ClearRules() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = nil
}

// Log returns the faults injected so far, in order.
func (p *Proxy) Log() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}

// Fired returns how many faults the named rule injected.
func (p *Proxy) Fired(rule string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.rules {
		if r.Name == rule {
			return r.fired
		}
	}
	return 0
}

// decide returns the fault for r, if any rule breaks it, and logs it; event
// is the index of its entry in the log.
func (p *Proxy) decide(r *http.Request) (fault Fault, event int, broken bool) {
	apiPath := strings.TrimPrefix(r.URL.Path, "/v1")
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, rule := range p.rules {
		if rule.Method != "" && rule.Method != r.Method {
			continue
		}
		if rule.Path != "" {
			if ok, _ := path.Match(rule.Path, apiPath); !ok {
				continue
			}
		}
		rule.matched++
		if rule.matched <= rule.After || (rule.Times > 0 && rule.fired >= rule.Times) {
			continue
		}
		if rule.Probability > 0 && p.rand.Float64() >= rule.Probability {
			continue
		}
		rule.fired++
		p.events = append(p.events, Event{Time: time.Now(), Rule: rule.Name, Method: r.Method, Path: apiPath, Fault: rule.Fault.describe})
		return rule.Fault, len(p.events) - 1, true
	}
	return Fault{}, 0, false
}

// record adds what the server answered to the log entry of a fault.
func (p *Proxy) record(event, status int, response []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events[event].Status = status
	p.events[event].Response = response
}

// maxRecorded bounds Event.Response.
const maxRecorded = 64 << 10

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fault, event, broken := p.decide(r)
	if broken && fault.kind == faultStatus {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(fault.status)
		return
	}
	if broken && fault.kind == faultHold {
		fault.hold()
	}
	resp, err := p.forward(r)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if broken {
		switch fault.kind {
		case faultDropResponse, faultStall:
			var kept []byte
			if !isStream(r) {
				kept, _ = io.ReadAll(io.LimitReader(resp.Body, maxRecorded))
			}
			p.record(event, resp.StatusCode, kept)
			if fault.kind == faultStall {
				select {
				case <-time.After(fault.stall):
				case <-r.Context().Done():
				}
			}
			resetConnection(w)
			return
		case faultFailAfterForward:
			drain(resp.Body)
			p.record(event, resp.StatusCode, nil)
			if fault.hold != nil {
				fault.hold()
			}
			w.WriteHeader(fault.status)
			return
		case faultPass, faultHold:
			p.record(event, resp.StatusCode, nil)
			broken = false // relayed as it is
		}
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	transform := broken && isStream(r)
	if transform {
		w.Header().Del("Content-Length") // the faults change it
	}
	w.WriteHeader(resp.StatusCode)
	// Send the headers at once: a client that waits for them before it
	// lets the stream's first byte happen (a start gate) must not wait for
	// that byte.
	http.NewResponseController(w).Flush()
	if !transform {
		copyFlushing(w, resp.Body)
		return
	}
	p.relayStream(w, resp.Body, fault)
}

// forward sends r to the target.
func (p *Proxy) forward(r *http.Request) (*http.Response, error) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme = p.target.Scheme
	out.URL.Host = p.target.Host
	out.Host = p.target.Host
	return p.transport.RoundTrip(out)
}

// isStream reports whether r asks for an NDJSON stream: a process's
// output (connect) or a streamed exec.
func isStream(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/connect") || r.URL.Query().Get("stream") == "true"
}

// relayStream copies an NDJSON stream line by line, applying fault.
func (p *Proxy) relayStream(w http.ResponseWriter, body io.Reader, fault Fault) {
	flush := http.NewResponseController(w).Flush
	reader := bufio.NewReaderSize(body, 64<<10)
	frames, sent, dataFrames := 0, 0, 0
	var lastSeq json.RawMessage // of the data frame before, for RewindSequence
	for {
		line, err := reader.ReadBytes('\n')
		if len(line) > 0 {
			frames++
			isData := frameType(line) == "data"
			if isData {
				dataFrames++
			}
			out := [][]byte{line}
			switch fault.kind {
			case faultCutStream:
				if (fault.frames > 0 && frames > fault.frames) || (fault.bytes > 0 && sent+len(line) > fault.bytes) {
					if fault.bytes > 0 && fault.bytes > sent {
						w.Write(line[:fault.bytes-sent])
						flush()
					}
					resetConnection(w)
					return
				}
			case faultSequenceGap:
				if isData && dataFrames == fault.frames {
					out = nil
				}
			case faultDuplicateFrames:
				if isData {
					out = [][]byte{line, line}
				}
			case faultCorruptBase64:
				if isData && dataFrames == fault.frames {
					out = [][]byte{corruptBase64(line)}
				}
			case faultRewindSequence:
				if isData && dataFrames == fault.frames && lastSeq != nil {
					out = [][]byte{withField(line, "seq", lastSeq)}
				}
				if isData {
					lastSeq = field(line, "seq")
				}
			}
			for _, l := range out {
				if _, werr := w.Write(l); werr != nil {
					return
				}
				sent += len(l)
			}
			flush()
		}
		if err != nil {
			return
		}
	}
}

// frameType returns the "type" of an NDJSON frame, or "" if it has none.
func frameType(line []byte) string {
	var frame struct {
		Type string `json:"type"`
	}
	json.Unmarshal(line, &frame)
	return frame.Type
}

// corruptBase64 replaces the data_base64 field of a data frame with text
// that is not base64.
func corruptBase64(line []byte) []byte {
	return withField(line, "data_base64", json.RawMessage(`"!not*base64!"`))
}

// field returns the raw value of a frame's field, or nil.
func field(line []byte, name string) json.RawMessage {
	var frame map[string]json.RawMessage
	if json.Unmarshal(line, &frame) != nil {
		return nil
	}
	return frame[name]
}

// withField returns the frame with one field's value replaced.
func withField(line []byte, name string, value json.RawMessage) []byte {
	var frame map[string]json.RawMessage
	if json.Unmarshal(line, &frame) != nil {
		return line
	}
	frame[name] = value
	out, err := json.Marshal(frame)
	if err != nil {
		return line
	}
	return append(out, '\n')
}

// drain reads what is left of a body the client will not see.
func drain(body io.Reader) { _, _ = io.Copy(io.Discard, body) }

// copyFlushing copies a response body, flushing as it goes so that
// streams stay live.
func copyFlushing(w http.ResponseWriter, body io.Reader) {
	flush := http.NewResponseController(w).Flush
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			flush()
		}
		if err != nil {
			return
		}
	}
}

// resetConnection closes the client's connection abruptly (TCP RST), the
// way a crashed server or a broken network does.
func resetConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
	conn.Close()
}
