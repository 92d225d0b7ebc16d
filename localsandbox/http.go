package localsandbox

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime/debug"
	"strconv"
	"time"
)

// maxJSONBytes caps a JSON request body.
const maxJSONBytes = 1 << 20

// apiError is a failure answered with its status and a short message in the
// error envelope: {"status":"error","error":"..."}. Messages never echo
// request bodies, keys or command lines.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.msg) }

func badRequest(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func notFound(what string) *apiError { return &apiError{http.StatusNotFound, what + " not found"} }

func conflict(msg string) *apiError { return &apiError{http.StatusConflict, msg} }

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
		var apiErr *apiError
		if !errors.As(err, &apiErr) {
			s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			apiErr = &apiError{http.StatusInternalServerError, "internal error"}
		}
		writeError(w, apiErr.status, apiErr.msg)
	})
}

// writeData answers 200 with the success envelope around data.
func writeData(w http.ResponseWriter, data any) error {
	body, err := json.Marshal(struct {
		Status string `json:"status"`
		Data   any    `json:"data"`
	}{"success", data})
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(http.StatusOK)
	w.Write(append(body, '\n'))
	return nil
}

func writeError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}{"error", msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// decodeJSON reads a JSON object of at most maxJSONBytes into v, rejecting
// unknown fields and trailing data. An empty body counts as {} when
// allowEmpty is set.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, allowEmpty bool) error {
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
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return badRequest("field %q has the wrong type", typeErr.Field)
		case bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")):
			if msg := err.Error(); len(msg) < 120 && bytes.Contains([]byte(msg), []byte("unknown field")) {
				return badRequest("%s", msg)
			}
			return badRequest("malformed JSON body")
		default:
			return badRequest("the body must be a JSON object")
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("trailing data after the JSON object")
	}
	return nil
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

// withAuth answers 401 to a request without the right X-Api-Key. Keys are
// compared by their hashes in constant time.
func (s *Server) withAuth(next http.Handler) http.Handler {
	if s.opts.InsecureNoAuth {
		return next
	}
	want := sha256.Sum256([]byte(s.opts.APIKey))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("X-Api-Key")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			writeError(w, http.StatusUnauthorized, "missing or wrong API key")
			return
		}
		next.ServeHTTP(w, r)
	})
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

// withOpen answers 503 once the server is shutting down.
func (s *Server) withOpen(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-s.done:
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
