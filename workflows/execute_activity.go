package workflows

// This file is the one gateway through which workflow code runs an
// activity: every CreateLease, Execute, DestroyLease, AcquireFreshLease,
// Pause/Resume, Fork and UpdateSession goes through executeActivity, which
// routes it (route, fleet.go) and names a host that took no work.

import (
	"errors"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// executeActivity runs the activity name on lease where route puts it and
// waits for its result in out. An activity that its lease's host did not
// take in time fails with SandboxHostLost, non-retryable: the lease is
// unusable (compensation gives it up without a DestroyLease that nobody
// would take, and takes a fresh lease on another host).
func executeActivity(ctx workflow.Context, opts workflow.ActivityOptions, lease sandbox.Lease, name string, in, out any) error {
	err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, route(ctx, name, lease, opts)), name, in).Get(ctx, out)
	var timeout *temporal.TimeoutError
	if lease.Host != "" && errors.As(err, &timeout) && timeout.TimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START {
		lost := &sandbox.HostLostError{Host: lease.Host, LeaseID: lease.ID}
		return activities.NewFailure(lost.Error(), sandbox.DetailsOf(lost), err)
	}
	return err
}
