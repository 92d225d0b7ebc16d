package createos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// request is one HTTP request of the protocol. Its path is built from
// validated ids only.
type request struct {
	// op names the request in errors ("create process"). Error text names
	// the operation and never the URL, the key or any body.
	op     string
	method string
	path   string // below "/v1"
	query  url.Values
	header http.Header // extra headers
	// The body: JSON of json, or the raw bytes of raw (a file upload), or
	// none when both are nil.
	json any
	raw  []byte
	// timeout, when set, replaces the operation timeout of each attempt
	// (a create has a budget of its own).
	timeout time.Duration
	// longPoll is added to the operation timeout of a request that the
	// server may hold open on purpose (wait?timeout_ms=…).
	longPoll time.Duration
	// own lists statuses that have a meaning of their own for this request
	// (408 of wait): they are never retried.
	own []int
}

const (
	// maxResponse bounds a JSON response; larger ones break the contract.
	maxResponse = 8 << 20
	// maxDrain is how much of an unwanted body is read (and thrown away) so
	// that its connection may be reused.
	maxDrain = 64 << 10
	// maxRetries is how many times a request is repeated after a failure
	// worth another try (docs/CREATEOS-API.md §4.1): 3 attempts in all.
	maxRetries = 2
	// defaultRetryBase and maxRetryDelay shape the backoff between
	// attempts: base × 2^attempt + jitter in [0, base), at most the max.
	defaultRetryBase = 500 * time.Millisecond
	maxRetryDelay    = 30 * time.Second
)

// userAgent names the client to the server's logs.
const userAgent = "sandboxflow-createos"

// errNoAnswer is the cause of a request given up after OperationTimeout.
var errNoAnswer = errors.New("no answer within the operation timeout")

// notSentError is a request that was never sent: its context ended before
// (while it waited for its pacing slot, for example). It wraps the
// context's error.
type notSentError struct {
	op  string
	err error
}

func (e *notSentError) Error() string { return e.op + ": " + e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// call sends rq, repeating it under the official retry rules, and decodes
// the envelope's data into out (when out is not nil). A failure status is
// a *sandbox.APIError (a *sandbox.PaymentRequiredError for 402); a request
// that did not get an answer is a *sandbox.UnavailableError, or wraps
// ctx's error when ctx ended. When a repeat cannot be sent (ctx ended
// during the backoff), the failure of the last attempt sent is returned.
func (c *Client) call(ctx context.Context, rq request, out any) error {
	var sent error // the failure of the last attempt that was sent
	for attempt := 0; ; attempt++ {
		retryAfter, again, err := c.attempt(ctx, rq, out)
		var notSent *notSentError
		if sent != nil && errors.As(err, &notSent) {
			return sent
		}
		if err == nil || !again || attempt == maxRetries || ctx.Err() != nil {
			return err
		}
		sent = err
		delay := c.backoff(attempt)
		if retryAfter >= 0 {
			delay = retryAfter
		}
		if sleep(ctx, delay) != nil {
			return err
		}
	}
}

// attempt paces and sends rq once. again reports whether the failure is
// worth another try under docs/CREATEOS-API.md §4.1: a network error or 408,
// 500, 502, 504 for an idempotent method; 429 and 503 (the server did not
// process the request) for any; never for a raw upload body (as the Go
// SDK). retryAfter is the server's Retry-After, or -1.
func (c *Client) attempt(ctx context.Context, rq request, out any) (retryAfter time.Duration, again bool, err error) {
	retryAfter = -1
	defer func() { again = again && rq.raw == nil }()
	if err := c.pace.wait(ctx); err != nil {
		return retryAfter, false, &notSentError{op: rq.op, err: err}
	}
	if ctx.Err() != nil {
		return retryAfter, false, &notSentError{op: rq.op, err: ctx.Err()}
	}
	timeout := orDefault(rq.timeout, c.cfg.operationTimeout) + rq.longPoll
	opCtx, cancel := context.WithTimeoutCause(ctx, timeout, errNoAnswer)
	defer cancel()
	resp, err := c.send(opCtx, rq)
	if err != nil {
		return retryAfter, idempotent(rq.method), transportError(ctx, opCtx, rq.op, err)
	}
	defer resp.Body.Close()
	if err := checkStatus(rq.op, resp); err != nil {
		status := statusOf(err)
		again = !slices.Contains(rq.own, status) && retryableStatus(rq.method, status)
		if again {
			retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		}
		return retryAfter, again, err
	}
	if out == nil {
		drain(resp.Body)
		return retryAfter, false, nil
	}
	if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusResetContent {
		return retryAfter, false, decodeEnvelope(rq.op, []byte(`{"status":"success","data":{}}`), out)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return retryAfter, idempotent(rq.method), transportError(ctx, opCtx, rq.op, err)
	}
	if len(body) > maxResponse {
		return retryAfter, false, invalidResponse(rq.op, "the response is too large")
	}
	return retryAfter, false, decodeEnvelope(rq.op, body, out)
}

// idempotent reports whether a method may be repeated after a failure
// whose outcome is unknown.
func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// retryableStatus applies the retry table of docs/CREATEOS-API.md §4.1.
func retryableStatus(method string, status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	case http.StatusRequestTimeout, http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
		return idempotent(method)
	}
	return false
}

// backoff is the pause before repeat number attempt+1.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.retryBase<<attempt + rand.N(c.retryBase+1)
	return min(d, maxRetryDelay)
}

// parseRetryAfter reads a Retry-After header: delta-seconds (fractions
// accepted) or an HTTP-date. It returns -1 when there is none or it does
// not parse, and at most maxRetryDelay.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return -1
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs < 0 || math.IsNaN(secs) {
			return -1
		}
		return min(time.Duration(secs*float64(time.Second)), maxRetryDelay)
	}
	if at, err := http.ParseTime(v); err == nil {
		return min(max(at.Sub(now), 0), maxRetryDelay)
	}
	return -1
}

// send builds and sends rq without pacing it.
func (c *Client) send(ctx context.Context, rq request) (*http.Response, error) {
	var (
		body        io.Reader
		contentType string
	)
	switch {
	case rq.json != nil:
		b, err := json.Marshal(rq.json)
		if err != nil {
			return nil, err
		}
		body, contentType = bytes.NewReader(b), "application/json"
	case rq.raw != nil:
		body, contentType = bytes.NewReader(rq.raw), "application/octet-stream"
	}
	target := c.cfg.base + rq.path
	if len(rq.query) > 0 {
		target += "?" + rq.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, rq.method, target, body)
	if err != nil {
		return nil, err
	}
	for name, values := range rq.header {
		req.Header[name] = values
	}
	req.Header.Set("X-Api-Key", c.cfg.key)
	req.Header.Set("User-Agent", userAgent)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return c.cfg.httpClient.Do(req)
}

// checkStatus accepts 2xx. Any other answer, redirects included, becomes a
// *sandbox.APIError (a *sandbox.PaymentRequiredError for 402) that keeps
// the server's machine code and request id; the rest of its body is
// thrown away unread into any error.
func checkStatus(op string, resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	code := errorCode(resp)
	id := requestID(resp.Header)
	if resp.StatusCode == http.StatusPaymentRequired {
		return &sandbox.PaymentRequiredError{Operation: op, Code: code, RequestID: id}
	}
	return &sandbox.APIError{Status: resp.StatusCode, Operation: op, Code: code, RequestID: id}
}

// machineToken is what a code or request id may look like to be kept: a
// short token that cannot smuggle a message (or a secret echoed in one)
// into an error text.
var machineToken = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$`)

// errorCode reads the machine code of a JSend failure body (docs/CREATEOS-API.md
// §1.5): data.code of a fail envelope (a string), or the top-level code of
// an error envelope (an integer; dropped when it only repeats the HTTP
// status). The message is never read. It drains the body.
func errorCode(resp *http.Response) string {
	defer drain(resp.Body)
	if !strings.Contains(resp.Header.Get("Content-Type"), "json") {
		return ""
	}
	var env struct {
		Data json.RawMessage `json:"data"`
		Code json.RawMessage `json:"code"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, maxDrain)).Decode(&env) != nil {
		return ""
	}
	var data struct {
		Code json.RawMessage `json:"code"`
	}
	if len(env.Data) > 0 && env.Data[0] == '{' && json.Unmarshal(env.Data, &data) == nil && len(data.Code) > 0 {
		if code := tokenOf(data.Code); code != "" {
			return code
		}
	}
	if code := tokenOf(env.Code); code != "" && code != strconv.Itoa(resp.StatusCode) {
		return code
	}
	return ""
}

// tokenOf returns a JSON string or integer as a machine token, or "".
func tokenOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		var n json.Number
		if json.Unmarshal(raw, &n) != nil {
			return ""
		}
		if _, err := n.Int64(); err != nil {
			return ""
		}
		s = n.String()
	}
	if !machineToken.MatchString(s) {
		return ""
	}
	return s
}

// requestID returns the server's id of the request (X-Request-Id, else
// X-Fc-Request-Id) when it looks like one.
func requestID(h http.Header) string {
	for _, name := range []string{"X-Request-Id", "X-Fc-Request-Id"} {
		if id := h.Get(name); machineToken.MatchString(id) {
			return id
		}
	}
	return ""
}

// transportError names a request that got no answer. The error of
// net/http is a *url.Error whose text holds the URL: only its cause is
// kept.
func transportError(ctx, opCtx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	if context.Cause(opCtx) == errNoAnswer {
		return &sandbox.UnavailableError{Operation: op, Err: errNoAnswer}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return &sandbox.UnavailableError{Operation: op, Err: err}
}

// decodeEnvelope checks {"status":"success","data":{…}} and decodes data
// into out. The body never reaches the error.
func decodeEnvelope(op string, body []byte, out any) error {
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	if json.Unmarshal(body, &env) != nil || env.Status != "success" || len(env.Data) == 0 {
		return invalidResponse(op, "not a success envelope")
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = env.Data
		return nil
	}
	if env.Data[0] != '{' {
		return invalidResponse(op, "not a success envelope with a data object")
	}
	if json.Unmarshal(env.Data, out) != nil {
		return invalidResponse(op, "the data does not have the expected shape")
	}
	return nil
}

func invalidResponse(op, detail string) *sandbox.ProtocolError {
	return &sandbox.ProtocolError{Kind: sandbox.InvalidResponse, Detail: op + ": " + detail}
}

// statusOf returns the HTTP status of a failure answer, or 0 when err is
// not one.
func statusOf(err error) int {
	var api *sandbox.APIError
	if errors.As(err, &api) {
		return api.Status
	}
	return 0
}

// drain reads and throws away what is left of a body, up to maxDrain.
func drain(body io.Reader) { _, _ = io.Copy(io.Discard, io.LimitReader(body, maxDrain)) }
