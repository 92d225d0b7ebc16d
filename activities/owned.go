package activities

import (
	"context"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// NameListOwnedLeases is the activity through which the reaper
// (workflows.Reaper) lists the leases of runs.
const NameListOwnedLeases = "sandboxflow.ListOwnedLeases"

// ListOwnedLeases lists the live leases that name the workflow that owns
// them (LabelWorkflowID, set on every lease these activities create or
// fork), walking every page of the server's sandbox list. Leases of no
// run, and gone ones, are left out.
//
// A server without labels (the hosted service, docs/CREATEOS-API.md §5)
// reports none: its sandboxes carry their labels only as hashes in their
// names, from which no owner can be read back, so none is listed and the
// reaper destroys nothing there.
func (a *Activities) ListOwnedLeases(ctx context.Context) ([]sandbox.Lease, error) {
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	all, err := a.Provider.ListLeases(ctx, nil)
	if err != nil {
		return nil, classify(err)
	}
	var owned []sandbox.Lease
	for _, l := range all {
		if l.Status.Terminal() || l.Labels[LabelWorkflowID] == "" || l.Labels[LabelRun] == "" {
			continue
		}
		owned = append(owned, a.onHost(l))
	}
	return owned, nil
}
