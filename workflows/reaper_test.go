package workflows

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// The reaper destroys the leases of closed owners that did not keep them
// (at once when closed long enough, after a second look otherwise) and of
// owners that are gone at both looks; it never touches a lease whose
// owner runs, one kept, one whose owner cannot be asked, or one whose
// owner appears between the looks (a forked session starting).
func TestReaperDecides(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Reaper, workflow.RegisterOptions{Name: ReaperWorkflowName})
	now := env.Now()
	ids := []string{"open", "kept", "closed-long", "closed-just", "gone", "fork", "mute"}
	var leases []sandbox.Lease
	for _, id := range ids {
		leases = append(leases, runLease(id, "w-"+id))
	}
	env.RegisterActivityWithOptions(func(context.Context) ([]sandbox.Lease, error) { return leases, nil },
		activity.RegisterOptions{Name: activities.NameListOwnedLeases})
	looks := 0
	env.RegisterActivityWithOptions(func(_ context.Context, ls []sandbox.Lease) ([]OwnerAnswer, error) {
		looks++
		var out []OwnerAnswer
		for _, l := range ls {
			o := LeaseOwner{LeaseID: l.ID, WorkflowID: "w-" + l.ID, Exists: true}
			var a OwnerAnswer
			switch l.ID {
			case "open":
				o.Open, o.NamesLease = true, true
			case "kept":
				o.ClosedAt, o.NamesLease, o.Kept = now.Add(-time.Hour), true, true
			case "closed-long":
				o.ClosedAt, o.NamesLease = now.Add(-time.Hour), true
			case "closed-just":
				o.ClosedAt = now.Add(-time.Second)
			case "gone":
				o.Exists = false
			case "fork":
				o.Exists, o.Open, o.NamesLease = looks > 1, looks > 1, looks > 1
			case "mute":
				a.Error = "query w-mute: unknown queryType"
			}
			a.Owner = o
			out = append(out, a)
		}
		return out, nil
	}, activity.RegisterOptions{Name: NameDescribeLeaseOwners})
	var mu sync.Mutex // the reaper destroys leases in parallel
	var destroyed []string
	env.RegisterActivityWithOptions(func(_ context.Context, in activities.DestroyLeaseInput) error {
		mu.Lock()
		defer mu.Unlock()
		destroyed = append(destroyed, in.LeaseID)
		return nil
	}, activity.RegisterOptions{Name: activities.NameDestroyLease})

	env.ExecuteWorkflow(ReaperWorkflowName, ReaperRequest{ClosedFor: time.Minute})
	require.NoError(t, env.GetWorkflowError())
	var res ReaperResult
	require.NoError(t, env.GetWorkflowResult(&res))
	assert.Equal(t, len(ids), res.Leases)
	assert.ElementsMatch(t, []string{"closed-long", "closed-just", "gone"}, destroyed)
	assert.Len(t, res.Destroyed, 3)
	var kept []string
	for _, k := range res.Kept {
		kept = append(kept, k.LeaseID)
	}
	assert.ElementsMatch(t, []string{"kept", "mute"}, kept)
	assert.Equal(t, 2, looks)
}

// A lease that cannot be destroyed now is left to the next run: the run
// still succeeds and does not count it.
func TestReaperLeavesWhatItCannotDestroyToTheNextRun(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(Reaper, workflow.RegisterOptions{Name: ReaperWorkflowName})
	env.RegisterActivityWithOptions(func(context.Context) ([]sandbox.Lease, error) {
		return []sandbox.Lease{runLease("a", "w")}, nil
	}, activity.RegisterOptions{Name: activities.NameListOwnedLeases})
	env.RegisterActivityWithOptions(func(_ context.Context, ls []sandbox.Lease) ([]OwnerAnswer, error) {
		return []OwnerAnswer{{Owner: LeaseOwner{LeaseID: "a", WorkflowID: "w", Exists: true, ClosedAt: time.Unix(0, 0)}}}, nil
	}, activity.RegisterOptions{Name: NameDescribeLeaseOwners})
	env.RegisterActivityWithOptions(func(context.Context, activities.DestroyLeaseInput) error {
		return &sandbox.InvalidInputError{Field: "x", Reason: "refused"}
	}, activity.RegisterOptions{Name: activities.NameDestroyLease})
	env.ExecuteWorkflow(ReaperWorkflowName, ReaperRequest{})
	require.NoError(t, env.GetWorkflowError())
	var res ReaperResult
	require.NoError(t, env.GetWorkflowResult(&res))
	assert.Empty(t, res.Destroyed)
}
