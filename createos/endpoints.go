package createos

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// This file has one method per endpoint of the protocol that the Client
// uses: each builds the request, names it, and maps the statuses with a
// meaning of their own (PROTOCOL.md §2) to the sandbox package's errors.
// Ids are validated by the callers before they reach a path.

func sandboxPath(id string) string { return "/sandboxes/" + url.PathEscape(id) }

func processPath(leaseID, pid string) string {
	return sandboxPath(leaseID) + "/processes/" + url.PathEscape(pid)
}

// sandboxData is a sandbox as the server reports it.
type sandboxData struct {
	ID        string            `json:"id"`
	Status    string            `json:"status"`
	Name      string            `json:"name"`
	Workspace string            `json:"workspace"` // [ext]
	Labels    map[string]string `json:"labels"`    // [ext]
	// ForkedFrom is the source of a fork (SandboxView.forked_from).
	ForkedFrom string `json:"forked_from"`
}

type createSandboxBody struct {
	Shape                 string            `json:"shape"`
	Rootfs                string            `json:"rootfs,omitempty"`
	Region                string            `json:"region,omitempty"`
	Name                  string            `json:"name,omitempty"`
	DiskMiB               int               `json:"disk_mib,omitempty"`
	Egress                []string          `json:"egress,omitempty"`
	Envs                  map[string]string `json:"envs,omitempty"`
	AutoPauseAfterSeconds int64             `json:"auto_pause_after_seconds,omitempty"`
	IngressEnabled        bool              `json:"ingress_enabled"`
	Labels                map[string]string `json:"labels,omitempty"` // [ext]
}

// createSandbox sends a create, which the hosted service answers only
// once the sandbox runs: each attempt has the create budget.
func (c *Client) createSandbox(ctx context.Context, body createSandboxBody, idempotencyKey string) (sandboxData, error) {
	rq := request{op: "create sandbox", method: http.MethodPost, path: "/sandboxes", json: body, timeout: c.cfg.createTimeout}
	if idempotencyKey != "" {
		rq.header = http.Header{"Idempotency-Key": {idempotencyKey}}
	}
	var data sandboxData
	if err := c.call(ctx, rq, &data); err != nil {
		return sandboxData{}, err
	}
	if !sandbox.ValidID(data.ID) {
		return sandboxData{}, invalidResponse(rq.op, "the sandbox id is missing or not a valid id")
	}
	if data.Status == "" {
		// The TypeScript SDK documents a create answer without a status
		// and takes it for running (docs/CREATEOS-API.md §6, conflict 1);
		// a GET settles it.
		data.Status = string(sandbox.StatusCreating)
	}
	return data, nil
}

// getSandbox reads a sandbox's state. 404 is a *sandbox.LeaseGoneError.
func (c *Client) getSandbox(ctx context.Context, id string) (sandboxData, error) {
	rq := request{op: "get sandbox", method: http.MethodGet, path: sandboxPath(id)}
	var data sandboxData
	if err := c.call(ctx, rq, &data); err != nil {
		return sandboxData{}, leaseGoneOn404(err, id)
	}
	if data.ID != id {
		return sandboxData{}, invalidResponse(rq.op, "the answer is about another sandbox")
	}
	return data, nil
}

// deleteSandbox destroys a sandbox; one that is already gone is success.
func (c *Client) deleteSandbox(ctx context.Context, id string) error {
	err := c.call(ctx, request{op: "destroy sandbox", method: http.MethodDelete, path: sandboxPath(id)}, nil)
	if statusOf(err) == http.StatusNotFound {
		return nil
	}
	return err
}

const (
	// pageSize is the limit asked of each page of a list: the most the
	// hosted service gives (docs/CREATEOS-API.md §1.7).
	pageSize = 500
	// maxPages bounds one list walk against a server that never ends it.
	maxPages = 1000
)

// listSandboxes walks every page of the sandbox list, with filters: the
// [ext] label filter ("label": "k=v" each) of servers that know it (others
// ignore it), or "status".
func (c *Client) listSandboxes(ctx context.Context, filter url.Values) (all []sandboxData, err error) {
	for offset, pages := 0, 0; ; pages++ {
		if pages == maxPages {
			return nil, invalidResponse("list sandboxes", "the list does not end")
		}
		items, total, err := c.listPage(ctx, filter, offset, pageSize)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		// docs/CREATEOS-API.md §4.6: the next offset counts what came, never the
		// page size asked (the server clamps it).
		offset += len(items)
		if len(items) == 0 || total < 0 || offset >= total {
			return all, nil
		}
	}
}

// listPage reads one page of the sandbox list. Its data is the official
// {"data":[…],"pagination":{"total":N,…}}, or a legacy shape: a bare
// array, or the {"sandboxes":[…]} of earlier sandboxd versions. total is
// -1 when the answer does not say (then there is no next page).
func (c *Client) listPage(ctx context.Context, filter url.Values, offset, limit int) (items []sandboxData, total int, err error) {
	rq := request{op: "list sandboxes", method: http.MethodGet, path: "/sandboxes",
		query: url.Values{"limit": {strconv.Itoa(limit)}, "offset": {strconv.Itoa(offset)}}}
	for k, v := range filter {
		rq.query[k] = v
	}
	var raw json.RawMessage
	if err := c.call(ctx, rq, &raw); err != nil {
		return nil, 0, err
	}
	if len(raw) > 0 && raw[0] == '[' {
		if json.Unmarshal(raw, &items) != nil {
			return nil, 0, invalidResponse(rq.op, "the list does not have the expected shape")
		}
		return items, -1, nil
	}
	var page struct {
		Data       *[]sandboxData `json:"data"`
		Sandboxes  *[]sandboxData `json:"sandboxes"`
		Pagination *struct {
			Total *int `json:"total"`
		} `json:"pagination"`
	}
	if json.Unmarshal(raw, &page) != nil {
		return nil, 0, invalidResponse(rq.op, "the list does not have the expected shape")
	}
	switch {
	case page.Data != nil:
		total = -1
		if page.Pagination != nil && page.Pagination.Total != nil {
			total = *page.Pagination.Total
		}
		return *page.Data, total, nil
	case page.Sandboxes != nil:
		return *page.Sandboxes, -1, nil
	}
	return nil, 0, invalidResponse(rq.op, "the answer has no list of sandboxes")
}

// transition asks for an asynchronous pause or resume ("pause", "resume").
func (c *Client) transition(ctx context.Context, id, verb string) error {
	err := c.call(ctx, request{op: verb + " sandbox", method: http.MethodPost, path: sandboxPath(id) + "/" + verb}, nil)
	return leaseGoneOn404(err, id)
}

// exec runs a one-shot command and returns its exit code. Its output is
// not kept.
func (c *Client) exec(ctx context.Context, leaseID, cmd string, args ...string) (int, error) {
	rq := request{op: "exec", method: http.MethodPost, path: sandboxPath(leaseID) + "/exec",
		json: map[string]any{"cmd": cmd, "args": args}}
	var data struct {
		Result *struct {
			ExitCode *int `json:"exit_code"`
		} `json:"result"`
	}
	if err := c.call(ctx, rq, &data); err != nil {
		return 0, leaseGoneOn404(err, leaseID)
	}
	if data.Result == nil || data.Result.ExitCode == nil {
		return 0, invalidResponse(rq.op, "the answer has no result.exit_code")
	}
	return *data.Result.ExitCode, nil
}

// putFile writes a file in the sandbox. The hosted service requires the
// parent directory to exist (sandboxd creates it): when the upload is
// refused with 400 or 404 — the status of a missing parent is unconfirmed —
// the parent is made with a one-shot `mkdir -p` and the upload sent once
// more. A sandbox that is gone fails the mkdir with a *sandbox.LeaseGoneError.
func (c *Client) putFile(ctx context.Context, leaseID, file string, content []byte) error {
	if content == nil {
		content = []byte{}
	}
	rq := request{op: "upload file", method: http.MethodPut, path: sandboxPath(leaseID) + "/files",
		query: url.Values{"path": {file}}, raw: content}
	err := c.call(ctx, rq, nil)
	if status := statusOf(err); status == http.StatusNotFound || status == http.StatusBadRequest {
		code, merr := c.exec(ctx, leaseID, "mkdir", "-p", "--", path.Dir(file))
		if merr != nil {
			return merr
		}
		if code != 0 {
			return leaseGoneOn404(err, leaseID)
		}
		err = c.call(ctx, rq, nil)
	}
	return leaseGoneOn404(err, leaseID)
}

// removeFiles deletes files with a one-shot `rm -f`: there is no file
// DELETE.
func (c *Client) removeFiles(ctx context.Context, leaseID string, files ...string) error {
	code, err := c.exec(ctx, leaseID, "rm", append([]string{"-f", "--"}, files...)...)
	if err == nil && code != 0 {
		err = errors.New("rm exited with status " + strconv.Itoa(code))
	}
	return err
}

// createProcess starts a managed process, the shell with args. When it fails, notCreated
// reports whether the request was never sent or its answer proves that no
// process exists (a status below 500); otherwise one may have been
// created.
func (c *Client) createProcess(ctx context.Context, leaseID string, args []string, cwd string) (pid string, notCreated bool, err error) {
	rq := request{op: "create process", method: http.MethodPost, path: sandboxPath(leaseID) + "/processes",
		json: map[string]any{"cmd": shell, "args": args, "cwd": cwd}}
	var data struct {
		ProcessID string `json:"process_id"`
	}
	if err := c.call(ctx, rq, &data); err != nil {
		var notSent *notSentError
		status := statusOf(err)
		return "", errors.As(err, &notSent) || (status != 0 && status < 500), leaseGoneOn404(err, leaseID)
	}
	if !sandbox.ValidID(data.ProcessID) {
		return "", false, invalidResponse(rq.op, "the process id is missing or not a valid id")
	}
	return data.ProcessID, false, nil
}

// writeInput writes data to a process's stdin. 409 — its stdin is closed,
// or nothing reads it any more — is the caller's to judge.
func (c *Client) writeInput(ctx context.Context, leaseID, pid string, data []byte) error {
	return c.call(ctx, request{op: "write input", method: http.MethodPost, path: processPath(leaseID, pid) + "/input",
		json: map[string]string{"data_base64": base64.StdEncoding.EncodeToString(data)}}, nil)
}

// connect opens a process's output stream, replaying every entry with a
// seq above after.
func (c *Client) connect(ctx context.Context, leaseID, pid string, after int64) (*stream, error) {
	return c.openStream(ctx, request{op: "connect output", method: http.MethodGet, path: processPath(leaseID, pid) + "/connect",
		query: url.Values{"after": {strconv.FormatInt(after, 10)}}})
}

// treeExit is the answer of wait: how the process ended and the seq of
// the newest entry of its output journal, when the server tells it.
type treeExit struct {
	status      exitStatus
	newestSeq   int64
	knowsNewest bool
}

// longestWait is the timeout_ms asked of one wait request.
const longestWait = 30 * time.Second

// waitTree waits up to d for a process's whole tree to exit. exited is
// false when it had not: 408, or (what the hosted service may answer at
// the timeout, docs/CREATEOS-API.md §3.12) the process's current state, still
// starting, running or terminating, or with tree_exited false.
func (c *Client) waitTree(ctx context.Context, leaseID, pid string, d time.Duration) (te treeExit, exited bool, err error) {
	rq := request{op: "wait for process", method: http.MethodGet, path: processPath(leaseID, pid) + "/wait",
		query:    url.Values{"scope": {"tree"}, "timeout_ms": {strconv.FormatInt(d.Milliseconds(), 10)}},
		longPoll: d, own: []int{http.StatusRequestTimeout}}
	var data struct {
		ExitCode json.RawMessage `json:"exit_code"`
		Signal   json.RawMessage `json:"signal"`
		Output   *struct {
			NewestSeq *int64 `json:"newest_seq"`
		} `json:"output"`
		State      string `json:"state"`
		TreeExited *bool  `json:"tree_exited"`
	}
	if err := c.call(ctx, rq, &data); err != nil {
		if statusOf(err) == http.StatusRequestTimeout {
			return treeExit{}, false, nil
		}
		return treeExit{}, false, err
	}
	switch {
	case data.State == "starting" || data.State == "running" || data.State == "terminating",
		data.TreeExited != nil && !*data.TreeExited:
		return treeExit{}, false, nil
	}
	st, err := parseExitStatus(data.ExitCode, data.Signal)
	if err != nil {
		return treeExit{}, false, err
	}
	te.status = st
	if data.Output != nil && data.Output.NewestSeq != nil {
		te.newestSeq, te.knowsNewest = *data.Output.NewestSeq, true
	}
	return te, true, nil
}

// waitExit waits as long as ctx allows for a process's tree to exit.
func (c *Client) waitExit(ctx context.Context, leaseID, pid string) (treeExit, error) {
	for {
		te, exited, err := c.waitTree(ctx, leaseID, pid, longestWait)
		if err != nil || exited {
			return te, err
		}
	}
}

// errTreeAlive: a kill was answered, but not with tree_exited:true.
var errTreeAlive = errors.New("the server did not confirm that the process tree exited")

// killGrace is how long a killed tree has between SIGTERM and SIGKILL.
const killGrace = time.Second

// killProcess ends a process's whole tree and succeeds only when the server
// confirms that every process of it is gone (or the process is unknown).
func (c *Client) killProcess(ctx context.Context, leaseID, pid string) error {
	rq := request{op: "kill process", method: http.MethodDelete, path: processPath(leaseID, pid),
		query: url.Values{"grace_ms": {strconv.FormatInt(killGrace.Milliseconds(), 10)}}, longPoll: killGrace}
	var data struct {
		TreeExited bool `json:"tree_exited"`
	}
	err := c.call(ctx, rq, &data)
	switch {
	case statusOf(err) == http.StatusNotFound:
		return nil
	case err != nil:
		return err
	case !data.TreeExited:
		return errTreeAlive
	}
	return nil
}

// leaseGoneOn404 turns a 404 on a sandbox's own URL into a
// *sandbox.LeaseGoneError.
func leaseGoneOn404(err error, leaseID string) error {
	if statusOf(err) == http.StatusNotFound {
		return &sandbox.LeaseGoneError{LeaseID: leaseID}
	}
	return err
}
