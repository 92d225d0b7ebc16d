package createos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// ForkLease makes a new sandbox whose files start as a copy of a paused
// sandbox's (POST /sandboxes/{id}/fork, docs/CREATEOS-API.md §3.3), waits until
// it runs and prepares its workspace, as CreateLease does. Processes are
// not carried over.
//
// The source must be paused, and the caller pauses it: pausing is
// asynchronous and changes what the caller's own commands find, so it is
// the caller's step, not a side effect of this one. The source's state is
// read first; one that is not paused is a *sandbox.InvalidInputError
// before anything is sent (the server would refuse it: 400 or 409), one
// that is gone a *sandbox.LeaseGoneError.
//
// The request carries spec.Egress (when set; the fork otherwise inherits
// the source's) and spec.Labels (an [ext] that sandboxd keeps and the
// hosted service ignores). The hosted API has no idempotency key and no
// name on a fork, so a fork whose answer never came (no answer, or a 500,
// 502 or 504) may have made a sandbox. It is looked for in the sandbox
// list: a sandbox that carries spec.Labels, or, on a server that keeps no
// labels, the one sandbox forked from the source (forked_from) that was not
// there before the request. Found, it is the answer. Not found, the error
// is a *sandbox.CleanupError with Reason ForkUnconfirmed: not retryable, as
// a second request might make a second fork; the remedy is a sweep by the
// fork's labels. An answer that proves nothing was made (429, 503 or
// another 4xx, or a request never sent) is returned as it is. The lookup
// has a deadline of its own even when ctx has ended; a fork it finds then
// is destroyed, as nobody waits for it any more.
//
// A fork that settles in a state other than running is a
// *sandbox.LeaseGoneError naming it, and, as any fork that cannot be made
// ready, it is destroyed before the error is returned (a
// *sandbox.CleanupError when that cannot be confirmed).
func (c *Client) ForkLease(ctx context.Context, sourceID string, spec sandbox.ForkSpec) (sandbox.Lease, error) {
	if err := sandbox.CheckID("source id", sourceID); err != nil {
		return sandbox.Lease{}, err
	}
	if err := spec.Validate(); err != nil {
		return sandbox.Lease{}, err
	}
	if err := checkLabels(spec.Labels); err != nil {
		return sandbox.Lease{}, err
	}
	source, err := c.GetLease(ctx, sourceID)
	if err != nil {
		return sandbox.Lease{}, err
	}
	if source.Status != sandbox.StatusPaused {
		return sandbox.Lease{}, &sandbox.InvalidInputError{Field: "source id",
			Reason: fmt.Sprintf("sandbox %s is %s: only a paused sandbox can be forked; pause it first", sourceID, source.Status)}
	}
	before, err := c.forksOf(ctx, sourceID, spec.Labels)
	if err != nil {
		return sandbox.Lease{}, err
	}
	created, err := c.forkSandbox(ctx, sourceID, forkSandboxBody{Egress: spec.Egress, Labels: spec.Labels})
	if err != nil {
		if created, err = c.recoverFork(ctx, sourceID, spec.Labels, before, err); err != nil {
			return sandbox.Lease{}, err
		}
	}
	lease, err := c.prepare(ctx, created)
	if err != nil {
		return sandbox.Lease{}, c.discardSandbox(ctx, created.ID, err)
	}
	return lease, nil
}

// forkSandboxBody is the body of POST /sandboxes/{id}/fork: every field
// omitted inherits the source's.
type forkSandboxBody struct {
	Egress []string          `json:"egress,omitempty"`
	Labels map[string]string `json:"labels,omitempty"` // [ext]
}

// forkSandbox sends a fork. The answer is the new sandbox's view, forking.
func (c *Client) forkSandbox(ctx context.Context, sourceID string, body forkSandboxBody) (sandboxData, error) {
	rq := request{op: "fork sandbox", method: http.MethodPost, path: sandboxPath(sourceID) + "/fork", json: body}
	var data sandboxData
	if err := c.call(ctx, rq, &data); err != nil {
		return sandboxData{}, leaseGoneOn404(err, sourceID)
	}
	switch {
	case !sandbox.ValidID(data.ID):
		return sandboxData{}, invalidResponse(rq.op, "the sandbox id is missing or not a valid id")
	case data.ID == sourceID || (data.ForkedFrom != "" && data.ForkedFrom != sourceID):
		return sandboxData{}, invalidResponse(rq.op, "the answer is not about a fork of the source")
	case data.Status == "":
		data.Status = string(sandbox.StatusForking) // a GET settles it
	}
	return data, nil
}

// forksOf returns the ids of the sandboxes listed as forks of sourceID,
// in the list filtered by labels (a filter that the hosted service
// ignores).
func (c *Client) forksOf(ctx context.Context, sourceID string, labels map[string]string) (map[string]bool, error) {
	all, err := c.listSandboxes(ctx, labelFilter(labels))
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, data := range all {
		if data.ForkedFrom == sourceID {
			ids[data.ID] = true
		}
	}
	return ids, nil
}

// forkMayExist reports whether a fork's failure leaves room for a fork:
// it got no answer, or one that does not prove that nothing was made.
func forkMayExist(err error) bool {
	var notSent *notSentError
	var unavailable *sandbox.UnavailableError
	switch status := statusOf(err); {
	case errors.As(err, &notSent):
		return false
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		return false // the server did not process it (docs/CREATEOS-API.md §1.9)
	case status >= 500:
		return true
	case status != 0:
		return false
	}
	return errors.As(err, &unavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// recoverFork looks for the fork that a failed request may have made (see
// ForkLease). It returns the fork found, forkErr when the failure proves
// that there is none, and otherwise a *sandbox.CleanupError.
func (c *Client) recoverFork(ctx context.Context, sourceID string, labels map[string]string, before map[string]bool, forkErr error) (sandboxData, error) {
	if !forkMayExist(forkErr) {
		return sandboxData{}, forkErr
	}
	lookCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.operationTimeout)
	defer cancel()
	all, err := c.listSandboxes(lookCtx, labelFilter(labels))
	var found []sandboxData
	if err == nil {
		found = ourForks(all, sourceID, labels, before)
	}
	if err != nil || len(found) != 1 {
		cause := forkErr
		if err != nil {
			cause = alsoFailed(forkErr, err)
		}
		return sandboxData{}, &sandbox.CleanupError{Reason: sandbox.ForkUnconfirmed, LeaseID: sourceID, Err: cause}
	}
	fork := found[0]
	switch status := sandbox.LeaseStatus(fork.Status); {
	case !sandbox.ValidID(fork.ID):
		return sandboxData{}, invalidResponse("list sandboxes", "a sandbox id is not a valid id")
	case !status.Known():
		return sandboxData{}, invalidResponse("list sandboxes", "unknown status "+quoteIfSafe(fork.Status))
	case status.Terminal():
		return sandboxData{}, &sandbox.LeaseGoneError{LeaseID: fork.ID, Status: status}
	case ctx.Err() != nil:
		return sandboxData{}, c.discardSandbox(ctx, fork.ID, forkErr)
	}
	return fork, nil
}

// ourForks picks a fork's sandbox out of a list: those that carry every
// label of the fork (which name it alone), or else, when the server keeps
// no labels, the forks of the source that were not listed before it.
func ourForks(all []sandboxData, sourceID string, labels map[string]string, before map[string]bool) []sandboxData {
	var labelled, unlabelled []sandboxData
	for _, data := range all {
		switch {
		case data.ID == sourceID, data.ForkedFrom != "" && data.ForkedFrom != sourceID:
		case len(labels) > 0 && carries(data.Labels, labels):
			labelled = append(labelled, data)
		case len(data.Labels) == 0 && data.ForkedFrom == sourceID && !before[data.ID]:
			unlabelled = append(unlabelled, data)
		}
	}
	if len(labelled) > 0 {
		return labelled[:1] // one request makes one fork at most
	}
	return unlabelled
}

// labelFilter is the [ext] list filter of labels: label=k=v, in key order.
func labelFilter(labels map[string]string) url.Values {
	if len(labels) == 0 {
		return nil
	}
	pairs := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		pairs = append(pairs, k+"="+labels[k])
	}
	return url.Values{"label": pairs}
}
