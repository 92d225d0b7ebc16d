package createos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
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
// The spec is validated first (sandbox.LeaseSpec.Validate, at most
// five labels); its SecretEnv is resolved with Config.Secrets. Nothing is
// sent when either fails.
//
// The request carries spec.Labels, and spec.IdempotencyKey as the header
// Idempotency-Key: extensions of the protocol that a server may ignore. On
// a server that speaks the official API (learned once, from the shape of
// its sandbox list) it also carries a name derived from the prefix, the
// labels and the key (see names.go): when the answer never comes, or the
// name is taken (409), the sandbox is looked up by that name and, if it
// lives, used. The create has its own budget, CreateTimeout, as the hosted
// service answers only once the sandbox runs. spec.Egress and
// spec.IngressEnabled are sent as egress and ingress_enabled. The wait
// polls the sandbox's state through the transitional states under one
// deadline, ReadyTimeout; a sandbox that settles in another state than
// running, or not in time, is a failure.
//
// If any step after the server returned the sandbox's id fails, the
// sandbox is destroyed before the error is returned, with a deadline of
// its own even when ctx has ended. If that cannot be confirmed either, the
// error is a *sandbox.CleanupError naming the sandbox, which may still
// exist. A create request that got no answer (or a 5xx), and whose
// sandbox the name did not find, may still have created one: find it by
// its labels with ListLeases.
//
// A sandbox that settles in a state other than running — or that the name
// found already destroying — is a *sandbox.LeaseGoneError; one still not
// running after ReadyTimeout is a *sandbox.UnavailableError; no credit
// (402) is a *sandbox.PaymentRequiredError; a workspace that cannot be
// prepared (mkdir exits non-zero) is a *sandbox.ProtocolError, as a new
// sandbox must allow it.
func (c *Client) CreateLease(ctx context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
	if err := spec.Validate(); err != nil {
		return sandbox.Lease{}, err
	}
	if err := checkLabels(spec.Labels); err != nil {
		return sandbox.Lease{}, err
	}
	envs, err := c.leaseEnv(ctx, spec)
	if err != nil {
		return sandbox.Lease{}, err
	}
	body := createSandboxBody{
		Shape:                 orDefault(spec.Shape, c.cfg.shape),
		Rootfs:                orDefault(spec.Rootfs, c.cfg.rootfs),
		Region:                orDefault(spec.Region, c.cfg.region),
		DiskMiB:               spec.DiskMiB,
		Egress:                spec.Egress,
		IngressEnabled:        spec.IngressEnabled,
		Envs:                  envs,
		AutoPauseAfterSeconds: int64(spec.AutoPauseAfter / time.Second),
		Labels:                spec.Labels,
		Name:                  createName(spec.NamePrefix, spec.Labels, spec.IdempotencyKey),
	}
	created, err := c.createSandbox(ctx, body, spec.IdempotencyKey)
	if err != nil {
		if created, err = c.recoverCreate(ctx, body.Name, err); err != nil {
			return sandbox.Lease{}, err
		}
	}
	lease, err := c.prepare(ctx, created)
	if err != nil {
		return sandbox.Lease{}, c.discardSandbox(ctx, created.ID, err)
	}
	return lease, nil
}

// recoverCreate looks a failed create's sandbox up by its name when the
// failure leaves room for one: no answer, a 5xx, or the name taken (409).
// It returns the sandbox found, or createErr when there is none (or no
// name to look for). A sandbox found already destroying or gone is a
// *sandbox.LeaseGoneError.
func (c *Client) recoverCreate(ctx context.Context, name string, createErr error) (sandboxData, error) {
	var unavailable *sandbox.UnavailableError
	status := statusOf(createErr)
	if name == "" || ctx.Err() != nil ||
		!(status == http.StatusConflict || status >= 500 || errors.As(createErr, &unavailable)) {
		return sandboxData{}, createErr
	}
	found, ok, err := c.findByName(ctx, name, nil)
	if err == nil && !ok && status == http.StatusConflict {
		// The name is taken, but not by a listed sandbox: the default list
		// may leave out the ones that are gone (docs/CREATEOS-API.md §2.4).
		for _, gone := range []sandbox.LeaseStatus{sandbox.StatusDestroyed, sandbox.StatusFailed} {
			if found, ok, err = c.findByName(ctx, name, url.Values{"status": {string(gone)}}); err != nil || ok {
				break
			}
		}
	}
	switch {
	case err != nil:
		return sandboxData{}, alsoFailed(createErr, err)
	case !ok:
		return sandboxData{}, createErr
	case !sandbox.LeaseStatus(found.Status).Known():
		return sandboxData{}, invalidResponse("list sandboxes", "unknown status "+quoteIfSafe(found.Status))
	case sandbox.LeaseStatus(found.Status).Terminal():
		return sandboxData{}, &sandbox.LeaseGoneError{LeaseID: found.ID, Status: sandbox.LeaseStatus(found.Status)}
	}
	return found, nil
}

// findByName walks the sandbox list (with filter) for the one named name:
// the list has no name filter (docs/CREATEOS-API.md §5).
func (c *Client) findByName(ctx context.Context, name string, filter url.Values) (sandboxData, bool, error) {
	all, err := c.listSandboxes(ctx, filter)
	if err != nil {
		return sandboxData{}, false, err
	}
	for _, data := range all {
		if data.Name == name {
			if !sandbox.ValidID(data.ID) {
				return sandboxData{}, false, invalidResponse("list sandboxes", "a sandbox id is not a valid id")
			}
			return data, true, nil
		}
	}
	return sandboxData{}, false, nil
}

// leaseEnv returns the variables of a new sandbox: spec.Env and the
// resolved values of spec.SecretEnv. Error text never holds a value.
func (c *Client) leaseEnv(ctx context.Context, spec sandbox.LeaseSpec) (map[string]string, error) {
	if len(spec.SecretEnv) == 0 {
		return spec.Env, nil
	}
	if c.cfg.secrets == nil {
		return nil, &sandbox.InvalidInputError{Field: "secretEnv", Reason: "this client has no secret source configured (Config.Secrets)"}
	}
	env := maps.Clone(spec.Env)
	if env == nil {
		env = make(map[string]string, len(spec.SecretEnv))
	}
	for variable, secret := range spec.SecretEnv {
		value, err := c.cfg.secrets.Secret(ctx, secret)
		if err != nil {
			return nil, &sandbox.InvalidInputError{Field: "secretEnv", Reason: err.Error()}
		}
		env[variable] = value
	}
	return env, nil
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
		case err == nil && (status.Terminal() || !status.Transitional()):
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

// ListLeases returns the sandboxes that carry every one of labels. It
// walks every page of the sandbox list, asking the [ext] filter
// GET /sandboxes?label=k=v&label=… of servers that know it.
//
// The answer is filtered again on the client: a sandbox matches when the
// labels it reports carry every wanted pair, or when its name (one that
// CreateLease gave it, on a server without labels) holds the segment of
// every wanted pair; such a sandbox reports the wanted labels as its
// Labels. A server that ignores the filter yields fewer leases, never
// someone else's: an orphan sweep that destroys what it lists stays safe
// on any server.
func (c *Client) ListLeases(ctx context.Context, labels map[string]string) ([]sandbox.Lease, error) {
	if err := checkLabels(labels); err != nil {
		return nil, err
	}
	found, err := c.listSandboxes(ctx, labelFilter(labels))
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
		switch {
		case carries(lease.Labels, labels):
		case len(lease.Labels) == 0 && nameCarries(data.Name, labels):
			lease.Labels = maps.Clone(labels)
		default:
			continue
		}
		leases = append(leases, lease)
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

// checkStatusName accepts the states of docs/CREATEOS-API.md §2.1.
func checkStatusName(status string) error {
	if sandbox.LeaseStatus(status).Known() {
		return nil
	}
	return invalidResponse("sandbox", "unknown status "+quoteIfSafe(status))
}

// checkLabels accepts labels that survive the list query (label=k=v) and
// fit a sandbox name: at most maxLabels; a key is not empty and has no
// '='; nothing has control characters.
func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return &sandbox.InvalidInputError{Field: "labels", Reason: fmt.Sprintf("at most %d labels (they must fit a sandbox name)", maxLabels)}
	}
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
