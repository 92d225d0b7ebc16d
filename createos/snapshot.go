package createos

import (
	"context"
	"net/http"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// SnapshotLease keeps a live sandbox as the ready template name ([ext]
// POST /templates {"name", "from_sandbox"}, docs/PROTOCOL.md §8;
// sandbox.LeaseSnapshotter). The server freezes the sandbox for the copy
// and leaves it as it was. Idempotent by name, as EnsureTemplate is: a
// create answered 409 (an earlier attempt whose answer was lost) is
// resolved by reading the template of that name, which is the answer if
// it was made from this sandbox and is ready; one made otherwise is a
// *sandbox.InvalidInputError naming "name". A sandbox that is gone (404)
// is a *sandbox.LeaseGoneError; a server without the extension (the
// hosted service) answers a *sandbox.APIError.
func (c *Client) SnapshotLease(ctx context.Context, leaseID, name string) (sandbox.Template, error) {
	if err := sandbox.CheckID("lease id", leaseID); err != nil {
		return sandbox.Template{}, err
	}
	if err := sandbox.CheckTemplateName("name", name); err != nil {
		return sandbox.Template{}, err
	}
	rq := request{op: "snapshot sandbox", method: http.MethodPost, path: "/templates", own: []int{http.StatusConflict},
		json: struct {
			Name        string `json:"name"`
			FromSandbox string `json:"from_sandbox"`
		}{name, leaseID}}
	var data templateData
	err := c.call(ctx, rq, &data)
	if statusOf(err) == http.StatusConflict {
		rq = request{op: "get template", method: http.MethodGet, path: templatePath(name)}
		data = templateData{}
		if err = c.call(ctx, rq, &data); err == nil && (data.FromSandbox != leaseID || data.Status != templateReady) {
			return sandbox.Template{}, &sandbox.InvalidInputError{Field: "name",
				Reason: "names a template that is not a snapshot of sandbox " + leaseID}
		}
	} else if err != nil {
		return sandbox.Template{}, leaseGoneOn404(err, leaseID)
	}
	if err != nil {
		return sandbox.Template{}, err
	}
	if err := checkTemplate(rq.op, data, name); err != nil {
		return sandbox.Template{}, err
	}
	if data.Status != templateReady {
		return sandbox.Template{}, invalidResponse(rq.op, "the snapshot is not ready")
	}
	return sandbox.Template{ID: data.ID, Name: name}, nil
}

var _ sandbox.LeaseSnapshotter = (*Client)(nil)
