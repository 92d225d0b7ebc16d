package localsandbox

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// maxJSONBytes caps a JSON request body.
const maxJSONBytes = 1 << 20

// apiError is a failure answered with its status and a short message in a
// JSend envelope (writeError). Messages never echo request bodies, keys or
// command lines, and quote at most maxEcho bytes of any value from the
// request.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.msg) }

// codedError gives an apiError a machine code of its own (data.code of the
// fail envelope), where the status's own code (statusCode) would not tell
// a client enough: a name taken is not another conflict.
type codedError struct {
	*apiError
	code string
}

func (e *codedError) Unwrap() error { return e.apiError }

// withCode gives err the machine code code.
func withCode(code string, err *apiError) *codedError { return &codedError{err, code} }

// maxEcho is the most of a value from the request that an error message
// quotes.
const maxEcho = 64

// badRequest is a 400 whose message is format with args, each string,
// []byte, error or Stringer among them cut to maxEcho bytes: call sites may
// quote what the request said without echoing all of it.
func badRequest(format string, args ...any) *apiError {
	short := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			short[i] = clip(v, maxEcho)
		case []byte:
			short[i] = clip(string(v), maxEcho)
		case error:
			short[i] = clip(v.Error(), maxEcho)
		case fmt.Stringer:
			short[i] = clip(v.String(), maxEcho)
		default:
			short[i] = a
		}
	}
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, short...)}
}

// startFailed is the 400 of a command that could not start. The init says
// why as "<command or working directory>: <reason>": the reason after the
// last ": " is the server's and stays whole, what it is about comes from the
// request and is cut to maxEcho bytes.
func startFailed(msg string) *apiError {
	about, reason := msg, ""
	if i := strings.LastIndex(msg, ": "); i >= 0 && len(msg)-i <= maxEcho {
		about, reason = msg[:i], msg[i:]
	}
	return &apiError{http.StatusBadRequest, clip(about, maxEcho) + reason}
}

// clip returns s if it has at most n bytes, else a copy of its first n
// (cut at a character boundary) marked "…(+N bytes)". The copy shares no
// memory with s.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s…(+%d bytes)", s[:n], len(s)-n)
}

func notFound(what string) *apiError { return &apiError{http.StatusNotFound, what + " not found"} }

func conflict(msg string) *apiError { return &apiError{http.StatusConflict, msg} }

// codeUnsupported is data.code of a declined feature; its message is
// also in the unsupportedHeader header [ext].
const (
	codeUnsupported   = "UNSUPPORTED"
	unsupportedHeader = "X-Sandboxd-Unsupported"
)

// unsupported is the 400 of a field or route of the official API that
// this server does not serve: answered, never silently dropped. Both
// arguments are the server's own words, never cut short.
func unsupported(what, why string) *codedError {
	return withCode(codeUnsupported, &apiError{http.StatusBadRequest, what + " is not supported by this server: " + why})
}

// handlerFunc is an endpoint: it writes a success itself, or returns an
// error that the adapter answers (an *apiError with its status, anything
// else as a logged 500).
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) endpoint(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		var (
			apiErr *apiError
			coded  *codedError
			code   string
		)
		switch {
		case bodyExpired(r):
			// However the handler saw it, the body did not arrive in time.
			apiErr = &apiError{http.StatusRequestTimeout, "the request body did not arrive in time"}
		case !errors.As(err, &apiErr):
			s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "request_id", w.Header().Get("X-Request-Id"), "err", err)
			apiErr = &apiError{http.StatusInternalServerError, "internal error"}
		case errors.As(err, &coded):
			code = coded.code
		}
		if code == codeUnsupported {
			// Also where a client that shows only the status line and
			// headers looks (the Jenkins plugin's tunnel).
			w.Header().Set(unsupportedHeader, apiErr.msg)
		}
		writeFailure(w, apiErr.status, code, apiErr.msg)
	})
}

// writeData answers 200 with the success envelope around data.
func writeData(w http.ResponseWriter, data any) error {
	return writeJSON(w, http.StatusOK, "success", data)
}

// writeJSON answers status with the JSend envelope {"status":…,"data":…}.
func writeJSON(w http.ResponseWriter, status int, envelope string, data any) error {
	body, err := json.Marshal(struct {
		Status string `json:"status"`
		Data   any    `json:"data"`
	}{envelope, data})
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
	return nil
}

// writeError answers status with msg in a JSend failure envelope, under
// the status's own machine code.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeFailure(w, status, "", msg)
}

// writeFailure answers a failure in the JSend envelopes of docs/CREATEOS-API.md
// §1.5: a 4xx is {"status":"fail","data":{"code":"<CODE>","message":"…"}}
// (code "" is the status's own, statusCode), a 5xx is
// {"status":"error","message":"…","code":<status>}. A 429 or 503 is a
// refusal for load (too many sandboxes or processes, shutting down) and
// says when to try again.
func writeFailure(w http.ResponseWriter, status int, code, msg string) {
	var env any
	if status >= 500 {
		env = struct {
			Status  string `json:"status"`
			Message string `json:"message"`
			Code    int    `json:"code"`
		}{"error", msg, status}
	} else {
		if code == "" {
			code = statusCode(status)
		}
		type failData struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		env = struct {
			Status string   `json:"status"`
			Data   failData `json:"data"`
		}{"fail", failData{code, msg}}
	}
	body, _ := json.Marshal(env)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", retryAfterSeconds)
	}
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// retryAfterSeconds is the Retry-After of a refusal for load.
const retryAfterSeconds = "1"

// statusCode is the machine code of a 4xx failure without one of its own.
func statusCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "INVALID_REQUEST"
	case http.StatusUnauthorized:
		return "UNAUTHORIZED"
	case http.StatusForbidden:
		return "FORBIDDEN"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusRequestTimeout:
		return "REQUEST_TIMEOUT"
	case http.StatusConflict:
		return "CONFLICT"
	case http.StatusGone:
		return "GONE"
	case http.StatusRequestEntityTooLarge:
		return "PAYLOAD_TOO_LARGE"
	case http.StatusUnprocessableEntity:
		return "UNPROCESSABLE"
	case http.StatusTooManyRequests:
		return "RATE_LIMITED"
	}
	return "HTTP_" + strconv.Itoa(status)
}

// decodeJSON reads a JSON object of at most maxJSONBytes into v, rejecting
// trailing data. An empty body counts as {} when allowEmpty is set.
//
// A field v does not know is ignored, as the hosted service ignores it: a
// newer SDK that adds a field must keep working. The server logs each such
// name once (unknownFields), so that an operator sees what is dropped. A
// field of the official API that this server does not serve is not
// unknown: v names it, and the handler refuses it by name (unsupported).
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any, allowEmpty bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", maxJSONBytes)}
		}
		return badRequest("reading the request body failed")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return badRequest("a JSON object body is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return badRequest("field %q has the wrong type", typeErr.Field)
		case bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")):
			return badRequest("malformed JSON body")
		default:
			return badRequest("the body must be a JSON object")
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("trailing data after the JSON object")
	}
	s.unknownFields.note(r, body, v)
	return nil
}

// unknownFields are the request fields the server ignored, by name: each
// is logged the first time it is seen, up to maxUnknownFields names (a
// client cannot grow the set, or the log, without bound).
type unknownFields struct {
	log  *slog.Logger
	mu   sync.Mutex
	seen map[string]bool
}

const maxUnknownFields = 256

// note logs the top-level fields of body that v's type does not name and
// that were not logged before.
func (u *unknownFields) note(r *http.Request, body []byte, v any) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return
	}
	known := jsonFieldNames(reflect.TypeOf(v))
	for name := range fields {
		if slices.ContainsFunc(known, func(k string) bool { return strings.EqualFold(k, name) }) {
			continue // encoding/json matches names regardless of case
		}
		name = clip(name, maxEcho)
		u.mu.Lock()
		first := !u.seen[name] && len(u.seen) < maxUnknownFields
		if first {
			if u.seen == nil {
				u.seen = map[string]bool{}
			}
			u.seen[name] = true
		}
		u.mu.Unlock()
		if first {
			u.log.Warn("a request field this server does not know is ignored (logged once per name)", "field", name, "route", r.Pattern)
		}
	}
}

// jsonFieldNames are the names encoding/json decodes into t's fields (t a
// struct or a pointer to one); nil for any other type.
func jsonFieldNames(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-":
		case f.Anonymous && tag == "":
			names = append(names, jsonFieldNames(f.Type)...)
		case !f.IsExported():
		case tag != "":
			names = append(names, tag)
		default:
			names = append(names, f.Name)
		}
	}
	return names
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)

// pathID returns the path parameter name after checking it is an id.
func pathID(r *http.Request, name string) (string, error) {
	id := r.PathValue(name)
	if !idPattern.MatchString(id) {
		return "", badRequest("invalid %s: must be 1 to 200 characters of A-Z, a-z, 0-9, '_' or '-'", name)
	}
	return id, nil
}

// queryInt parses an optional non-negative integer query parameter.
func queryInt(r *http.Request, name string, def, max int64) (int64, error) {
	raw, ok := r.URL.Query()[name]
	if !ok {
		return def, nil
	}
	if len(raw) != 1 {
		return 0, badRequest("%s given more than once", name)
	}
	v, err := strconv.ParseInt(raw[0], 10, 64)
	if err != nil || v < 0 {
		return 0, badRequest("%s must be a non-negative integer", name)
	}
	if v > max {
		return 0, badRequest("%s must be at most %d", name, max)
	}
	return v, nil
}

// queryDuration parses an optional millisecond query parameter.
func queryDuration(r *http.Request, name string, def, max time.Duration) (time.Duration, error) {
	ms, err := queryInt(r, name, def.Milliseconds(), max.Milliseconds())
	return time.Duration(ms) * time.Millisecond, err
}

// publicRoutes are the paths served without a key (docs/CREATEOS-API.md §1.2),
// to GET and HEAD: health and the catalog, nothing of any sandbox.
var publicRoutes = map[string]bool{"/healthz": true, "/readyz": true, "/v1/shapes": true, "/v1/rootfs": true}

// withAuth answers 401 to a request without the right X-Api-Key, from its
// header alone: the body is never read, neither by the handler nor by
// net/http after it (which would wait for up to 256 KiB of it), and the
// connection is closed after the answer. The public routes need no key.
// Keys are compared by their hashes in constant time.
func (s *Server) withAuth(next http.Handler) http.Handler {
	if s.opts.InsecureNoAuth {
		return withoutBrowsers(next)
	}
	want := sha256.Sum256([]byte(s.opts.APIKey))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && publicRoutes[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		got := sha256.Sum256([]byte(r.Header.Get("X-Api-Key")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			// Nothing more is read: not the body, not another request.
			http.NewResponseController(w).SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusUnauthorized, "missing or wrong API key")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withoutBrowsers guards a server that takes no key (InsecureNoAuth, which
// serves loopback only). Its address is reachable from every browser page
// on the machine: any site may send it a "simple" cross-site POST (no
// preflight), and a site whose name is made to resolve to 127.0.0.1 (DNS
// rebinding) may even read its answers. So it answers only what no page
// can send: a request without an Origin header whose Host names loopback
// (localhost or a loopback address). Preview URLs are served before this
// (withIngress) and are unaffected. Programs — the SDKs, curl, the
// provider — send no Origin and the Host they dialled.
func withoutBrowsers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Origin") != "" || !loopbackHost(r.Host) {
			http.NewResponseController(w).SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusForbidden, "a server without a key answers programs on this machine only: no browser pages, no other host names")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a Host header names this machine's
// loopback: localhost or a loopback address, with or without a port.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// withBodyDeadline gives a request's body BodyReadTimeout to arrive, from
// the moment the request is handled. net/http lifts the deadline once the
// body has been read to its end, so it never cuts short the response, a
// stream or a long poll that follows. A request without a body gets no
// deadline: net/http is already reading its connection in the background,
// to see the client go away, and a deadline there would end the request.
func (s *Server) withBodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			if http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.opts.BodyReadTimeout)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody is a request body under withBodyDeadline; it notes whether
// the deadline cut it off.
type deadlineBody struct {
	io.ReadCloser
	expired atomic.Bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		b.expired.Store(true)
	}
	return n, err
}

// bodyExpired reports whether r's body did not arrive within its deadline.
func bodyExpired(r *http.Request) bool {
	b, ok := r.Body.(*deadlineBody)
	return ok && b.expired.Load()
}

// withRecover turns a panic into a logged 500, so that one bad request
// never takes the server down.
func (s *Server) withRecover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("panic in handler", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if !sw.wroteHeader {
				writeError(w, http.StatusInternalServerError, "internal error")
				return
			}
			panic(http.ErrAbortHandler) // the response is cut short
		}()
		next.ServeHTTP(sw, r)
	})
}

// withRequestID names every answer with an X-Request-Id of its own
// (docs/CREATEOS-API.md §1.8), which the server's logs of the request carry too.
// A client's own X-Request-Id is never echoed.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", newID("req-"))
		next.ServeHTTP(w, r)
	})
}

// withOpen answers 503 once the server is shutting down (but to /readyz,
// which says so itself).
func (s *Server) withOpen(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-s.done:
			if r.URL.Path == "/readyz" {
				break
			}
			writeError(w, http.StatusServiceUnavailable, "the server is shutting down")
			return
		default:
		}
		next.ServeHTTP(w, r)
	})
}

// statusWriter notes whether the response has started.
type statusWriter struct {
	http.ResponseWriter
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	w.wroteHeader = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
