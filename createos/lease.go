package createos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// errNotReady is the cause of a sandbox that did not run within
// ReadyTimeout.
var errNotReady = errors.New("the sandbox was not running within the ready timeout")

// CreateLease creates a sandbox, waits until it runs and prepares its
// workspace (the directory where commands' files are staged).
//
// The request carries spec.Labels, and spec.IdempotencyKey as the header
// Idempotency-Key; both are extensions of the protocol that a server may
// ignore. The sandbox is created with ingress disabled. The wait polls the
// sandbox's state through creating, pausing and resuming under one
// deadline, ReadyTimeout; a sandbox that settles in another state than
// running, or not in time, is a failure.
//
// If any step after the server returned the sandbox's id fails, the
// sandbox is destroyed before the error is returned, with a deadline of
// its own even when ctx has ended. If that cannot be confirmed either, the
// error is a *sandbox.CleanupError naming the sandbox, which may still
// exist. A create request that got no answer (or a 5xx) may have created
// a sandbox whose id never came back: find it by its labels with
// ListLeases.
//
// A sandbox that settles in a state other than running is a
// *sandbox.LeaseGoneError (it was destroyed); one still not running after
// ReadyTimeout is a *sandbox.UnavailableError; a workspace that cannot be
// prepared (mkdir exits non-zero) is a *sandbox.ProtocolError, as a new
// sandbox must allow it.
func (c *Client) CreateLease(ctx context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
	if err := checkLabels(spec.Labels); err != nil {
		return sandbox.Lease{}, err
	}
	if strings.ContainsFunc(spec.IdempotencyKey, isControl) {
		return sandbox.Lease{}, &sandbox.InvalidInputError{Field: "idempotency key", Reason: "must not contain control characters"}
	}
	created, err := c.createSandbox(ctx, createSandboxBody{
		Shape:  orDefault(spec.Shape, c.cfg.shape),
		Rootfs: orDefault(spec.Rootfs, c.cfg.rootfs),
		Region: orDefault(spec.Region, c.cfg.region),
		Labels: spec.Labels,
	}, spec.IdempotencyKey)
	if err != nil {
		return sandbox.Lease{}, err
	}
	lease, err := c.prepare(ctx, created)
	if err != nil {
		return sandbox.Lease{}, c.discardSandbox(ctx, created.ID, err)
	}
	return lease, nil
}

// prepare waits until a new sandbox runs and creates its staging
// directory.
func (c *Client) prepare(ctx context.Context, created sandboxData) (sandbox.Lease, error) {
	data := created
	if data.Status != string(sandbox.StatusRunning) {
		var err error
		if data, err = c.awaitRunning(ctx, created.ID); err != nil {
			return sandbox.Lease{}, err
		}
	}
	if data.Workspace == "" {
		data.Workspace = created.Workspace
	}
	lease, err := c.toLease(data)
	if err != nil {
		return sandbox.Lease{}, err
	}
	code, err := c.exec(ctx, lease.ID, "mkdir", "-p", stagingDir(lease.Workspace))
	if err != nil {
		return sandbox.Lease{}, err
	}
	if code != 0 {
		return sandbox.Lease{}, invalidResponse("prepare workspace", fmt.Sprintf("mkdir exited with status %d", code))
	}
	return lease, nil
}

// awaitRunning polls a sandbox's state until it runs, under one deadline.
// Failures worth another try (5xx, 429, no answer) are tried again until
// the deadline.
func (c *Client) awaitRunning(ctx context.Context, id string) (sandboxData, error) {
	readyCtx, cancel := context.WithTimeoutCause(ctx, c.cfg.readyTimeout, errNotReady)
	defer cancel()
	for {
		data, err := c.getSandbox(readyCtx, id)
		status := sandbox.LeaseStatus(data.Status)
		switch {
		case err == nil && status == sandbox.StatusRunning:
			return data, nil
		case err == nil && !status.Transitional():
			if err := checkStatusName(data.Status); err != nil {
				return sandboxData{}, err
			}
			return sandboxData{}, &sandbox.LeaseGoneError{LeaseID: id, Status: status}
		case err != nil && !sandbox.Retryable(err):
			if ctx.Err() == nil && context.Cause(readyCtx) == errNotReady {
				return sandboxData{}, &sandbox.UnavailableError{Operation: "wait for sandbox", Err: errNotReady}
			}
			return sandboxData{}, err
		}
		if err := sleep(readyCtx, c.pollInterval); err != nil {
			if ctx.Err() != nil {
				return sandboxData{}, fmt.Errorf("wait for sandbox: %w", ctx.Err())
			}
			return sandboxData{}, &sandbox.UnavailableError{Operation: "wait for sandbox", Err: errNotReady}
		}
	}
}

// discardSandbox destroys a sandbox that could not be made ready, with a
// fresh deadline, and returns cause, or a *sandbox.CleanupError when the
// sandbox may still exist.
func (c *Client) discardSandbox(ctx context.Context, id string, cause error) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.operationTimeout)
	defer cancel()
	if err := c.deleteSandbox(dctx, id); err != nil {
		return &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: id, Err: alsoFailed(cause, err)}
	}
	return cause
}

// GetLease reports a sandbox's state. A sandbox that does not exist (404)
// or is in a terminal state is a *sandbox.LeaseGoneError.
func (c *Client) GetLease(ctx context.Context, leaseID string) (sandbox.Lease, error) {
	if err := sandbox.CheckID("lease id", leaseID); err != nil {
		return sandbox.Lease{}, err
	}
	data, err := c.getSandbox(ctx, leaseID)
	if err != nil {
		return sandbox.Lease{}, err
	}
	lease, err := c.toLease(data)
	if err != nil {
		return sandbox.Lease{}, err
	}
	if lease.Status.Terminal() {
		return sandbox.Lease{}, &sandbox.LeaseGoneError{LeaseID: leaseID, Status: lease.Status}
	}
	return lease, nil
}

// DestroyLease destroys a sandbox and every process in it. A sandbox that
// is already gone (404) is success.
func (c *Client) DestroyLease(ctx context.Context, leaseID string) error {
	if err := sandbox.CheckID("lease id", leaseID); err != nil {
		return err
	}
	return c.deleteSandbox(ctx, leaseID)
}

// ListLeases returns the sandboxes that carry every one of labels, with the
// [ext] request GET /sandboxes?label=k=v&label=…
//
// The answer is filtered again on the client by the labels each sandbox
// reports: a server that ignores the filter, or reports no labels, yields
// fewer leases, never someone else's. An orphan sweep that destroys what
// it lists stays safe on any server.
func (c *Client) ListLeases(ctx context.Context, labels map[string]string) ([]sandbox.Lease, error) {
	if err := checkLabels(labels); err != nil {
		return nil, err
	}
	pairs := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		pairs = append(pairs, k+"="+labels[k])
	}
	found, err := c.listSandboxes(ctx, pairs)
	if err != nil {
		return nil, err
	}
	var leases []sandbox.Lease
	for _, data := range found {
		if !sandbox.ValidID(data.ID) {
			return nil, invalidResponse("list sandboxes", "a sandbox id is not a valid id")
		}
		lease, err := c.toLease(data)
		if err != nil {
			return nil, err
		}
		if carries(lease.Labels, labels) {
			leases = append(leases, lease)
		}
	}
	return leases, nil
}

// PauseLease asks the server to freeze every process of a sandbox. It
// returns once the server accepted (the pause itself is asynchronous). A
// concurrent transition (409) is success when the sandbox is pausing or
// paused anyway.
func (c *Client) PauseLease(ctx context.Context, leaseID string) error {
	return c.transitionTo(ctx, leaseID, "pause", sandbox.StatusPausing, sandbox.StatusPaused)
}

// ResumeLease asks the server to thaw a paused (or failed) sandbox, in the
// same way as PauseLease: 409 is success when the sandbox is resuming or
// running anyway.
func (c *Client) ResumeLease(ctx context.Context, leaseID string) error {
	return c.transitionTo(ctx, leaseID, "resume", sandbox.StatusResuming, sandbox.StatusRunning)
}

func (c *Client) transitionTo(ctx context.Context, leaseID, verb string, goals ...sandbox.LeaseStatus) error {
	if err := sandbox.CheckID("lease id", leaseID); err != nil {
		return err
	}
	err := c.transition(ctx, leaseID, verb)
	if statusOf(err) != http.StatusConflict {
		return err
	}
	lease, gerr := c.GetLease(ctx, leaseID)
	if gerr != nil {
		return gerr
	}
	if slices.Contains(goals, lease.Status) {
		return nil
	}
	return err
}

// toLease checks what the server reported of a sandbox.
func (c *Client) toLease(data sandboxData) (sandbox.Lease, error) {
	if err := checkStatusName(data.Status); err != nil {
		return sandbox.Lease{}, err
	}
	workspace := orDefault(data.Workspace, c.cfg.workspace)
	if checkWorkspace("workspace", workspace) != nil {
		return sandbox.Lease{}, invalidResponse("sandbox", "the workspace is not an absolute path")
	}
	return sandbox.Lease{ID: data.ID, Status: sandbox.LeaseStatus(data.Status), Workspace: workspace, Labels: data.Labels}, nil
}

// checkStatusName accepts the states of the contract.
func checkStatusName(status string) error {
	switch sandbox.LeaseStatus(status) {
	case sandbox.StatusCreating, sandbox.StatusRunning, sandbox.StatusPausing, sandbox.StatusPaused,
		sandbox.StatusResuming, sandbox.StatusError, sandbox.StatusDestroyed, sandbox.StatusFailed:
		return nil
	}
	return invalidResponse("sandbox", "unknown status "+quoteIfSafe(status))
}

// checkLabels accepts labels that survive the list query (label=k=v): a
// key is not empty and has no '='; nothing has control characters.
func checkLabels(labels map[string]string) error {
	for k, v := range labels {
		if k == "" || strings.Contains(k, "=") || strings.ContainsFunc(k, isControl) {
			return &sandbox.InvalidInputError{Field: "labels", Reason: "a key must be non-empty, without '=' or control characters"}
		}
		if strings.ContainsFunc(v, isControl) {
			return &sandbox.InvalidInputError{Field: "labels", Reason: fmt.Sprintf("the value of %q has control characters", k)}
		}
	}
	return nil
}

// carries reports whether have holds every pair of want.
func carries(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// sleep pauses for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// alsoFailed joins a cleanup failure to the failure that came first, if
// any, keeping both reachable with errors.As.
func alsoFailed(first, cleanup error) error {
	if first == nil {
		return cleanup
	}
	return fmt.Errorf("%w; then %w", first, cleanup)
}
