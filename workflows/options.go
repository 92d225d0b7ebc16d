package workflows

import (
	"encoding/json"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// ActivityOverrides replaces parts of the default activity options. Nil
// entries and zero fields keep the defaults.
type ActivityOverrides struct {
	CreateLease       *ActivityOptions `json:"createLease,omitempty"`
	Execute           *ActivityOptions `json:"execute,omitempty"`
	DestroyLease      *ActivityOptions `json:"destroyLease,omitempty"`
	AcquireFreshLease *ActivityOptions `json:"acquireFreshLease,omitempty"`
	// PauseLease and ResumeLease are the activities of a session's idle
	// pause and of the resume before its next command.
	PauseLease  *ActivityOptions `json:"pauseLease,omitempty"`
	ResumeLease *ActivityOptions `json:"resumeLease,omitempty"`
	// ForkLease and SetEgress are the activities of a session's fork and
	// set_egress Updates.
	ForkLease *ActivityOptions `json:"forkLease,omitempty"`
	SetEgress *ActivityOptions `json:"setEgress,omitempty"`
	// SnapshotLease is the activity of a session's snapshot Update.
	SnapshotLease *ActivityOptions `json:"snapshotLease,omitempty"`
	// EnsureTemplate is the activity that builds Request.Dockerfile.
	EnsureTemplate *ActivityOptions `json:"ensureTemplate,omitempty"`
}

// execute returns the override of Execute; o may be nil.
func (o *ActivityOverrides) execute() *ActivityOptions {
	if o == nil {
		return nil
	}
	return o.Execute
}

// ActivityOptions are the options of one activity that a request may
// override.
type ActivityOptions struct {
	// TaskQueue moves the activity to another task queue. On a fleet of
	// sandbox hosts the fleet decides: an activity on a lease runs on its
	// host's queue, a placement on the placement queue (fleet.go).
	TaskQueue              string        `json:"taskQueue,omitempty"`
	ScheduleToCloseTimeout time.Duration `json:"scheduleToCloseTimeout,omitempty"`
	// ScheduleToStartTimeout, on a fleet, is how long an activity on a
	// lease waits for the lease's host to take it before the host counts
	// as lost (DefaultHostStartTimeout when zero). Set on CreateLease or
	// AcquireFreshLease, it bounds the wait for a host with room, which is
	// otherwise unbounded.
	ScheduleToStartTimeout time.Duration `json:"scheduleToStartTimeout,omitempty"`
	StartToCloseTimeout    time.Duration `json:"startToCloseTimeout,omitempty"`
	HeartbeatTimeout       time.Duration `json:"heartbeatTimeout,omitempty"`
	// RetryPolicy replaces the activity's retry policy. For Execute, its
	// MaximumAttempts counts failures of the sandbox service, not attempts:
	// worker deaths and detaches are retried for free, within the
	// ScheduleToCloseTimeout (withFailureBudget).
	RetryPolicy *temporal.RetryPolicy `json:"retryPolicy,omitempty"`
}

// UnmarshalJSON accepts the timeouts as integer nanoseconds or Go duration
// strings (sandbox.JSONDuration).
func (o *ActivityOptions) UnmarshalJSON(b []byte) error {
	type plain ActivityOptions
	aux := struct {
		*plain
		ScheduleToCloseTimeout *sandbox.JSONDuration `json:"scheduleToCloseTimeout,omitempty"`
		ScheduleToStartTimeout *sandbox.JSONDuration `json:"scheduleToStartTimeout,omitempty"`
		StartToCloseTimeout    *sandbox.JSONDuration `json:"startToCloseTimeout,omitempty"`
		HeartbeatTimeout       *sandbox.JSONDuration `json:"heartbeatTimeout,omitempty"`
	}{
		plain:                  (*plain)(o),
		ScheduleToCloseTimeout: (*sandbox.JSONDuration)(&o.ScheduleToCloseTimeout),
		ScheduleToStartTimeout: (*sandbox.JSONDuration)(&o.ScheduleToStartTimeout),
		StartToCloseTimeout:    (*sandbox.JSONDuration)(&o.StartToCloseTimeout),
		HeartbeatTimeout:       (*sandbox.JSONDuration)(&o.HeartbeatTimeout),
	}
	return json.Unmarshal(b, &aux)
}

// nonRetryableTypes are the types that no activity retries: retrying
// cannot help, or (for cleanup errors) must not happen on the same lease.
// They come from the sandbox taxonomy (sandbox.Kinds), the one place that
// says so; the activities mark each failure from the same table.
func nonRetryableTypes() []string { return sandbox.NonRetryableTypes() }

// leaseOptions are the defaults of CreateLease and AcquireFreshLease: a new
// sandbox may take a while to reach running, the activity heartbeats while
// it waits, and unavailability is retried a few times.
func leaseOptions(startToClose time.Duration) workflow.ActivityOptions {
	return workflow.ActivityOptions{
		StartToCloseTimeout: startToClose,
		HeartbeatTimeout:    30 * time.Second,
		// A cancelled run sweeps its leases only after a create in flight
		// has finished, so that the sweep sees what it created.
		WaitForCancellation: true,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        time.Second,
			BackoffCoefficient:     2,
			MaximumInterval:        30 * time.Second,
			MaximumAttempts:        5,
			NonRetryableErrorTypes: nonRetryableTypes(),
		},
	}
}

// ExecuteHorizon is how long past its command's timeout Execute may go on
// in all, its attempts together (its ScheduleToCloseTimeout): time for the
// re-attaches that follow worker deaths and Temporal outages. A command
// without a timeout gets 24 hours in all. Past it, the run fails with
// SandboxUnattended and destroys the lease, and the command with it.
const ExecuteHorizon = time.Hour

// executeOptions are the defaults of Execute. The heartbeat timeout notices
// a dead worker (the retry then re-attaches to the running command). The
// retry policy's MaximumAttempts is the budget of failures of the sandbox
// service, not of attempts (withFailureBudget); the attempts are bounded by
// the ScheduleToCloseTimeout, the command's timeout plus ExecuteHorizon.
func executeOptions(cmd sandbox.Command) workflow.ActivityOptions {
	startToClose, scheduleToClose := 24*time.Hour, 24*time.Hour
	if cmd.Timeout > 0 {
		startToClose, scheduleToClose = cmd.Timeout+5*time.Minute, cmd.Timeout+ExecuteHorizon
	}
	return workflow.ActivityOptions{
		ScheduleToCloseTimeout: scheduleToClose,
		StartToCloseTimeout:    startToClose,
		HeartbeatTimeout:       20 * time.Second,
		WaitForCancellation:    true, // let the activity kill the process tree before the workflow moves on
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        time.Second,
			BackoffCoefficient:     2,
			MaximumInterval:        10 * time.Second,
			MaximumAttempts:        4,
			NonRetryableErrorTypes: nonRetryableTypes(),
		},
	}
}

// withFailureBudget returns Execute's options with the retry policy's
// MaximumAttempts taken out, and that number: the budget of failures of
// the sandbox service that the activity enforces itself
// (activities.ExecuteInput.MaxFailures). Temporal would count every
// attempt, the worker deaths and detaches that cost nothing among them,
// and end the run with its untyped timeout while the command ran on. A
// request's own RetryPolicy override keeps its meaning this way: its
// MaximumAttempts bounds the failures (1: the first failure is final; 0:
// no bound but the horizon), its intervals pace the retries.
func withFailureBudget(opts workflow.ActivityOptions) (workflow.ActivityOptions, int) {
	if opts.RetryPolicy == nil || opts.RetryPolicy.MaximumAttempts <= 0 {
		return opts, 0
	}
	policy := *opts.RetryPolicy
	budget := int(policy.MaximumAttempts)
	policy.MaximumAttempts = 0
	opts.RetryPolicy = &policy
	return opts, budget
}

// destroyOptions are the defaults of DestroyLease: a leaked lease costs
// money, so it is retried for a day.
func destroyOptions() workflow.ActivityOptions {
	return workflow.ActivityOptions{
		ScheduleToCloseTimeout: 24 * time.Hour,
		StartToCloseTimeout:    5 * time.Minute,
		HeartbeatTimeout:       30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        time.Second,
			BackoffCoefficient:     2,
			MaximumInterval:        time.Minute,
			NonRetryableErrorTypes: []string{sandbox.TypeInvalidInput},
		},
	}
}

// apply returns base with the non-zero fields of o.
func (o *ActivityOptions) apply(base workflow.ActivityOptions) workflow.ActivityOptions {
	if o == nil {
		return base
	}
	if o.TaskQueue != "" {
		base.TaskQueue = o.TaskQueue
	}
	if o.ScheduleToCloseTimeout > 0 {
		base.ScheduleToCloseTimeout = o.ScheduleToCloseTimeout
	}
	if o.ScheduleToStartTimeout > 0 {
		base.ScheduleToStartTimeout = o.ScheduleToStartTimeout
	}
	if o.StartToCloseTimeout > 0 {
		base.StartToCloseTimeout = o.StartToCloseTimeout
	}
	if o.HeartbeatTimeout > 0 {
		base.HeartbeatTimeout = o.HeartbeatTimeout
	}
	if o.RetryPolicy != nil {
		base.RetryPolicy = o.RetryPolicy
	}
	return base
}

// activityOptions is the resolved options of every activity of a run.
type activityOptions struct {
	createLease, execute, destroyLease, acquireFreshLease workflow.ActivityOptions
	pauseLease, resumeLease, forkLease, setEgress         workflow.ActivityOptions
	ensureTemplate, snapshotLease                         workflow.ActivityOptions
}

func resolveOptions(req Request) activityOptions {
	o := req.ActivityOptions
	if o == nil {
		o = &ActivityOverrides{}
	}
	return activityOptions{
		createLease:       o.CreateLease.apply(leaseOptions(5 * time.Minute)),
		execute:           o.Execute.apply(executeOptions(req.Command)),
		destroyLease:      o.DestroyLease.apply(destroyOptions()),
		acquireFreshLease: o.AcquireFreshLease.apply(leaseOptions(10 * time.Minute)),
		pauseLease:        o.PauseLease.apply(leaseOptions(2 * time.Minute)),
		resumeLease:       o.ResumeLease.apply(leaseOptions(2 * time.Minute)),
		forkLease:         o.ForkLease.apply(leaseOptions(10 * time.Minute)), // a copy of the source's files
		setEgress:         o.SetEgress.apply(leaseOptions(2 * time.Minute)),
		ensureTemplate:    o.EnsureTemplate.apply(templateOptions()),
		snapshotLease:     o.SnapshotLease.apply(leaseOptions(10 * time.Minute)), // a copy of the lease's files
	}
}
