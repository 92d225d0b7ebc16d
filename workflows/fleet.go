package workflows

import (
	"time"

	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// This file is where every activity of this package runs: the one routing
// policy, for a single sandbox service and for a fleet of sandbox hosts
// alike (package documentation, "Fleets of sandbox hosts").

// DefaultHostStartTimeout is how long an activity on a lease waits for the
// lease's host to take it (its schedule-to-start timeout on the host's
// task queue) before the host counts as lost: long enough for a worker to
// restart, short enough that a run does not wait for a dead machine.
// ActivityOptions.ScheduleToStartTimeout overrides it.
const DefaultHostStartTimeout = time.Minute

// PlacementTaskQueue is the task queue where the hosts of a fleet whose
// workflows run on shared take new leases: CreateLease and
// AcquireFreshLease, and the sweep of a run that holds no lease. Each host
// polls it only while it has room for another lease.
func PlacementTaskQueue(shared string) string { return shared + "/placement" }

// HostTaskQueue is the task queue of one host of a fleet whose workflows
// run on shared: every activity on a lease that lives on the host
// (sandbox.Lease.Host) runs there, and only that host polls it.
func HostTaskQueue(shared, host string) string { return shared + "/host/" + host }

// FleetInterceptor marks the workflows a worker runs as running on a fleet
// of sandbox hosts: their placements go to PlacementTaskQueue of the
// worker's task queue instead of that queue itself. A host-mode worker
// (internal/workerapp) installs it on the worker of its shared queue;
// nothing else changes for the workflows, whose leases say where they
// live.
func FleetInterceptor() interceptor.WorkerInterceptor { return &fleetInterceptor{} }

type fleetInterceptor struct {
	interceptor.WorkerInterceptorBase
}

func (*fleetInterceptor) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &fleetWorkflow{interceptor.WorkflowInboundInterceptorBase{Next: next}}
}

type fleetWorkflow struct {
	interceptor.WorkflowInboundInterceptorBase
}

func (f *fleetWorkflow) ExecuteWorkflow(ctx workflow.Context, in *interceptor.ExecuteWorkflowInput) (any, error) {
	return f.Next.ExecuteWorkflow(workflow.WithValue(ctx, fleetKey{}, true), in)
}

type fleetKey struct{}

// onFleet reports whether the workflow runs on a fleet's host worker.
func onFleet(ctx workflow.Context) bool { return ctx.Value(fleetKey{}) != nil }

// route returns the options of the activity name on lease (the zero
// Lease for none):
//
//	the lease lives on a host   that host's task queue, whatever opts say, and
//	                            a schedule-to-start timeout (default
//	                            DefaultHostStartTimeout)
//	none, on a fleet            the placement queue: any host with room
//	                            (CreateLease, AcquireFreshLease, a sweep)
//	otherwise                   opts as they are: the workflow's own queue unless
//	                            opts.TaskQueue names another
//
// UpdateSession works on no lease and needs no host: it runs where the
// workflow runs.
func route(ctx workflow.Context, name string, lease sandbox.Lease, opts workflow.ActivityOptions) workflow.ActivityOptions {
	shared := workflow.GetInfo(ctx).TaskQueueName
	switch {
	case lease.Host != "":
		opts.TaskQueue = HostTaskQueue(shared, lease.Host)
		if opts.ScheduleToStartTimeout <= 0 {
			opts.ScheduleToStartTimeout = DefaultHostStartTimeout
		}
		if opts.Summary != "" {
			opts.Summary += " on host " + lease.Host
		}
	case name != NameUpdateSession && onFleet(ctx):
		opts.TaskQueue = PlacementTaskQueue(shared)
	}
	return opts
}

// checkLeaseHost rejects, on a fleet, an existing lease given without its
// host: no host queue would reach it.
func checkLeaseHost(ctx workflow.Context, lease *sandbox.Lease) error {
	if lease == nil || lease.Host != "" || !onFleet(ctx) {
		return nil
	}
	err := &sandbox.InvalidInputError{Field: "leaseHost", Reason: "on a fleet of sandbox hosts, name the host of lease " + lease.ID}
	return activities.Failure(err)
}
