package createos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// assertNothingLeaks checks an error's text against everything it must
// never hold.
func assertNothingLeaks(t *testing.T, err error, secrets ...string) {
	t.Helper()
	for _, s := range append(secrets, testKey, bodySecret, "/v1", "/sandboxes", "http://") {
		assert.NotContains(t, err.Error(), s)
	}
}

func TestUnauthorizedErrorHasNoSecrets(t *testing.T) {
	f := newFakeServer(t)
	const wrongKey = "wrong-key-5a5a"
	c, err := New(Config{BaseURL: f.srv.URL, APIKey: wrongKey})
	require.NoError(t, err)
	lease := f.newLease()

	_, err = c.GetLease(t.Context(), lease.ID)
	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusUnauthorized, api.Status)
	assert.Equal(t, "get sandbox: HTTP 401", err.Error())

	_, err = c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"true"}, Env: map[string]string{"TOKEN": "env-secret"}}, nil)
	require.ErrorAs(t, err, &api, "a 401 on create proves nothing was created")
	assert.Contains(t, err.Error(), "HTTP 401")
	assertNothingLeaks(t, err, wrongKey, "env-secret")

	for _, rq := range f.requests("") {
		assert.Equal(t, wrongKey, rq.Header.Get("X-Api-Key"), "every request carries the key")
	}
}

func TestRedirectsAreNotFollowed(t *testing.T) {
	f := newFakeServer(t)
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		http.Redirect(w, r, "/v1/sandboxes?stolen=1", http.StatusTemporaryRedirect)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.GetLease(t.Context(), f.newLease().ID)

	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusTemporaryRedirect, api.Status)
	assert.Equal(t, []string{"getSandbox"}, f.routes())
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there any more
	c, err := New(Config{BaseURL: "http://" + addr, APIKey: testKey})
	require.NoError(t, err)
	c.retryBase = time.Millisecond

	_, err = c.GetLease(t.Context(), "sb-1")

	var unavailable *sandbox.UnavailableError
	require.ErrorAs(t, err, &unavailable)
	assert.Equal(t, "get sandbox", unavailable.Operation)
	assert.True(t, sandbox.Retryable(err))
	assert.True(t, strings.HasPrefix(err.Error(), "get sandbox: sandbox server unavailable"), err.Error())
	assertNothingLeaks(t, err)
}

func TestResponsesOutsideTheEnvelopeAreProtocolErrors(t *testing.T) {
	f := newFakeServer(t)
	answers := []string{
		`not json`,
		`{"status":"error","data":{}}`,
		`{"status":"success"}`,
		`{"status":"success","data":"sb-1"}`,
		`{"status":"success","data":{"id":7}}`,
	}
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		w.Write([]byte(answers[n-1]))
		return true
	})
	c := newTestClient(t, f)
	lease := f.newLease()

	for range answers {
		_, err := c.GetLease(t.Context(), lease.ID)
		var protocol *sandbox.ProtocolError
		require.ErrorAs(t, err, &protocol)
		assert.Equal(t, sandbox.InvalidResponse, protocol.Kind)
		assertNothingLeaks(t, err, "not json")
	}
}

// A JSend failure keeps its machine code and the request id, never its
// message: fail carries data.code (a string), error a top-level code (an
// integer, dropped when it only repeats the status).
func TestFailuresKeepTheServerCodeAndRequestID(t *testing.T) {
	for name, tc := range map[string]struct {
		contentType, body string
		header            string
		code, text        string
	}{
		"fail with data.code": {"application/json", `{"status":"fail","data":{"code":"QUOTA_EXCEEDED","message":"%s"}}`, "X-Request-Id",
			"QUOTA_EXCEEDED", "get sandbox: HTTP 403 QUOTA_EXCEEDED (request req-42)"},
		"error with code": {"application/json; charset=utf-8", `{"status":"error","message":"%s","code":1042}`, "X-Fc-Request-Id",
			"1042", "get sandbox: HTTP 403 1042 (request req-42)"},
		"code repeats the status": {"application/json", `{"status":"error","message":"%s","code":403}`, "X-Request-Id",
			"", "get sandbox: HTTP 403 (request req-42)"},
		"a code that is a sentence": {"application/json", `{"status":"fail","data":{"code":"%s is bad"}}`, "X-Request-Id",
			"", "get sandbox: HTTP 403 (request req-42)"},
		"not JSON": {"text/plain", `{"status":"fail","data":{"code":"QUOTA_EXCEEDED","x":"%s"}}`, "X-Request-Id",
			"", "get sandbox: HTTP 403 (request req-42)"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeServer(t)
			f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
				w.Header().Set("Content-Type", tc.contentType)
				w.Header().Set(tc.header, "req-42")
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprintf(w, tc.body, bodySecret)
				return true
			})
			c := newTestClient(t, f)

			_, err := c.GetLease(t.Context(), f.newLease().ID)

			var api *sandbox.APIError
			require.ErrorAs(t, err, &api)
			assert.Equal(t, tc.code, api.Code)
			assert.Equal(t, "req-42", api.RequestID)
			assert.Equal(t, tc.text, err.Error())
			assertNothingLeaks(t, err)
		})
	}
}

// 402 is its own type, never retried: no retry helps until credit is
// added.
func TestPaymentRequired(t *testing.T) {
	f := newFakeServer(t)
	f.on("exec", func(w http.ResponseWriter, r *http.Request, n int) bool {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-7")
		w.WriteHeader(http.StatusPaymentRequired)
		fmt.Fprintf(w, `{"status":"fail","data":{"code":"NO_CREDIT","message":%q}}`, bodySecret)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.CreateLease(t.Context(), sandbox.LeaseSpec{})

	var payment *sandbox.PaymentRequiredError
	require.ErrorAs(t, err, &payment)
	assert.Equal(t, sandbox.PaymentRequiredError{Operation: "exec", Code: "NO_CREDIT", RequestID: "req-7"}, *payment)
	assert.Equal(t, sandbox.TypePaymentRequired, sandbox.ErrorType(err))
	assert.False(t, sandbox.Retryable(err))
	assert.Equal(t, 1, f.count("exec"))
	assertNothingLeaks(t, err)
}

// The retry table of docs/CREATEOS-API.md §4.1: idempotent methods are tried
// again after a network error or 408/500/502/504; any method after 429 or
// 503; nothing else, and never a raw upload.
func TestRetryRules(t *testing.T) {
	lost := func(w http.ResponseWriter) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	for _, tc := range []struct {
		route  string
		answer func(w http.ResponseWriter)
		tries  int
	}{
		{"getSandbox", func(w http.ResponseWriter) { fail(w, http.StatusInternalServerError) }, 3},
		{"getSandbox", func(w http.ResponseWriter) { fail(w, http.StatusBadGateway) }, 3},
		{"getSandbox", func(w http.ResponseWriter) { fail(w, http.StatusGatewayTimeout) }, 3},
		{"getSandbox", func(w http.ResponseWriter) { fail(w, http.StatusRequestTimeout) }, 3},
		{"getSandbox", func(w http.ResponseWriter) { fail(w, http.StatusTooManyRequests) }, 3},
		{"getSandbox", lost, 3},
		{"getSandbox", func(w http.ResponseWriter) { fail(w, http.StatusForbidden) }, 1},
		{"getSandbox", func(w http.ResponseWriter) { fail(w, http.StatusNotFound) }, 1},
		{"deleteSandbox", func(w http.ResponseWriter) { fail(w, http.StatusServiceUnavailable) }, 3},
		{"exec", func(w http.ResponseWriter) { fail(w, http.StatusServiceUnavailable) }, 3},
		{"exec", func(w http.ResponseWriter) { fail(w, http.StatusTooManyRequests) }, 3},
		{"exec", func(w http.ResponseWriter) { fail(w, http.StatusInternalServerError) }, 1},
		{"exec", func(w http.ResponseWriter) { fail(w, http.StatusBadGateway) }, 1},
		{"exec", lost, 1},
		{"putFile", func(w http.ResponseWriter) { fail(w, http.StatusServiceUnavailable) }, 1},
	} {
		f := newFakeServer(t)
		f.on(tc.route, func(w http.ResponseWriter, r *http.Request, n int) bool { tc.answer(w); return true })
		c := newTestClient(t, f)
		lease := f.newLease()

		var err error
		switch tc.route {
		case "getSandbox":
			_, err = c.GetLease(t.Context(), lease.ID)
		case "deleteSandbox":
			err = c.DestroyLease(t.Context(), lease.ID)
		case "exec":
			_, err = c.exec(t.Context(), lease.ID, "true")
		case "putFile":
			err = c.putFile(t.Context(), lease.ID, "/workspace/x", []byte("x"))
		}
		require.Error(t, err)
		assert.Equal(t, tc.tries, f.count(tc.route), "%s answered %s", tc.route, describeAnswer(tc.answer))
	}
}

func describeAnswer(answer func(http.ResponseWriter)) string {
	rec := &statusRecorder{header: http.Header{}}
	defer func() { _ = recover() }() // the lost answer hijacks
	answer(rec)
	return fmt.Sprint(rec.status)
}

type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(status int)      { r.status = status }

// A retried request waits as long as Retry-After says, instead of its
// backoff: here the backoff is an hour, so only the header can let the
// retry happen before the test's deadline.
func TestRetryAfterReplacesTheBackoff(t *testing.T) {
	f := newFakeServer(t)
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			fail(w, http.StatusTooManyRequests)
			return true
		}
		return false
	})
	c := newTestClient(t, f)
	c.retryBase = time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	_, err := c.GetLease(ctx, f.newLease().ID)

	require.NoError(t, err)
	assert.Equal(t, 2, f.count("getSandbox"))
}

// When the caller's context ends during the backoff, the failure of the
// last attempt is returned, not the context's error.
func TestRetryStopsWithTheCaller(t *testing.T) {
	f := newFakeServer(t)
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		fail(w, http.StatusServiceUnavailable)
		return true
	})
	ctx, cancel := context.WithCancel(t.Context())
	// The caller gives up as soon as the first answer is in.
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		cancel()
		return resp, err
	})}
	c := newTestClient(t, f, func(cfg *Config) { cfg.HTTPClient = hc })
	c.retryBase = time.Hour

	_, err := c.GetLease(ctx, f.newLease().ID)

	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusServiceUnavailable, api.Status)
	assert.Equal(t, 1, f.count("getSandbox"))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              -1,
		"2":                             2 * time.Second,
		"1.5":                           1500 * time.Millisecond,
		"0":                             0,
		"-1":                            -1,
		"soon":                          -1,
		"3600":                          maxRetryDelay,
		"Tue, 01 Sep 2026 12:00:05 GMT": 5 * time.Second,
		"Tue, 01 Sep 2026 11:00:00 GMT": 0,
	} {
		assert.Equal(t, want, parseRetryAfter(v, now), v)
	}
}
