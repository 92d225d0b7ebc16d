package workflows

import (
	"fmt"
	"slices"

	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
)

// setEgress is the set_egress Update: it gives the session's lease these
// egress rules, and makes them the session's, so that every lease it takes
// later — a fresh lease that replaces an unusable one, the lease of a
// forked session, the lease after a continue-as-new — is created with them
// (they live in the session's LeaseSpec, which all of those start from).
//
// A paused lease is resumed first: the API documents egress changes on a
// running sandbox. A session without a lease only records the rules; so
// does one whose lease turns out to be gone (it is given up, and the next
// command takes a fresh lease, with the rules, as compensation has it).
// When the server refuses the rules, the session keeps its old ones and
// the Update fails with the refusal.
func (s *session) setEgress(ctx workflow.Context, rules []string) error {
	r := s.r
	if err := s.ready(ctx); err != nil {
		return err
	}
	if r.lease != nil {
		opts := r.options.setEgress
		opts.Summary = fmt.Sprintf("set egress of lease %s: %s", r.lease.ID, describeEgress(rules))
		err := executeActivity(ctx, opts, *r.lease, activities.NameSetEgress,
			activities.SetEgressInput{LeaseID: r.lease.ID, Egress: rules}, nil)
		switch {
		case err == nil:
		case r.compensation.unusable(err):
			if err := r.compensation.giveUp(ctx, err); err != nil {
				return err
			}
			r.setPhase(ctx, PhaseIdle)
		default:
			return err
		}
	}
	s.req.Lease.Egress = slices.Clone(rules)
	r.req.Lease.Egress = s.req.Lease.Egress
	return nil
}

// describeEgress names egress rules in a summary: "any" for "*", "default"
// for none (everything the sandbox server's own policy allows: the API's
// "empty allows all", which sandboxd caps at nothing by default), or how
// many rules.
func describeEgress(rules []string) string {
	switch {
	case len(rules) == 0:
		return "default"
	case slices.Contains(rules, "*"):
		return "any"
	case len(rules) == 1:
		return "1 rule"
	}
	return fmt.Sprintf("%d rules", len(rules))
}
