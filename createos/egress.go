package createos

import (
	"context"
	"net/http"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// SetEgress replaces a sandbox's egress rules (PUT /sandboxes/{id}/egress,
// docs/CREATEOS-API.md §3.6) in one step: new connections follow them. The
// rules are checked first (sandbox.CheckEgress); an empty list is sent as
// [], which the API reads as "allow all" (as far as the server's policy
// allows). A sandbox that is gone (404) is a *sandbox.LeaseGoneError; rules
// the server refuses are a *sandbox.APIError: 400 malformed, 403 beyond the
// server's policy (sandboxd's code EGRESS_NOT_ALLOWED).
func (c *Client) SetEgress(ctx context.Context, leaseID string, rules []string) error {
	if err := sandbox.CheckID("lease id", leaseID); err != nil {
		return err
	}
	if err := sandbox.CheckEgress("egress", rules); err != nil {
		return err
	}
	if rules == nil {
		rules = []string{}
	}
	rq := request{op: "set egress", method: http.MethodPut, path: sandboxPath(leaseID) + "/egress",
		json: map[string][]string{"egress": rules}}
	var view struct {
		ID string `json:"id"`
	}
	if err := c.call(ctx, rq, &view); err != nil {
		return leaseGoneOn404(err, leaseID)
	}
	if view.ID != "" && view.ID != leaseID {
		return invalidResponse(rq.op, "the answer is about another sandbox")
	}
	return nil
}
