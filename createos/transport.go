package createos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	// longPoll is added to the operation timeout of a request that the
	// server may hold open on purpose (wait?timeout_ms=…).
	longPoll time.Duration
}

const (
	// maxResponse bounds a JSON response; larger ones break the contract.
	maxResponse = 8 << 20
	// maxDrain is how much of an unwanted body is read (and thrown away) so
	// that its connection may be reused.
	maxDrain = 64 << 10
)

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

// call paces and sends rq, checks its status and decodes the envelope's
// data into out (when out is not nil). A failure status is a
// *sandbox.APIError; a request that did not get an answer is a
// *sandbox.UnavailableError, or wraps ctx's error when ctx ended.
func (c *Client) call(ctx context.Context, rq request, out any) error {
	if err := c.pace.wait(ctx); err != nil {
		return &notSentError{op: rq.op, err: err}
	}
	if ctx.Err() != nil {
		return &notSentError{op: rq.op, err: ctx.Err()}
	}
	opCtx, cancel := context.WithTimeoutCause(ctx, c.cfg.operationTimeout+rq.longPoll, errNoAnswer)
	defer cancel()
	resp, err := c.send(opCtx, rq)
	if err != nil {
		return transportError(ctx, opCtx, rq.op, err)
	}
	defer resp.Body.Close()
	if err := checkStatus(rq.op, resp); err != nil {
		return err
	}
	if out == nil {
		drain(resp.Body)
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return transportError(ctx, opCtx, rq.op, err)
	}
	if len(body) > maxResponse {
		return invalidResponse(rq.op, "the response is too large")
	}
	return decodeEnvelope(rq.op, body, out)
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
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return c.cfg.httpClient.Do(req)
}

// checkStatus accepts 2xx. Any other answer, redirects included, becomes a
// *sandbox.APIError and its body is thrown away unread.
func checkStatus(op string, resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	drain(resp.Body)
	return &sandbox.APIError{Status: resp.StatusCode, Operation: op}
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
	if json.Unmarshal(body, &env) != nil || env.Status != "success" || len(env.Data) == 0 || env.Data[0] != '{' {
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
