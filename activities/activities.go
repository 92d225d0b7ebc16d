// Package activities runs the operations of a sandbox.Provider as Temporal
// activities: CreateLease, Execute, DestroyLease and AcquireFreshLease, and
// for sessions PauseLease, ResumeLease, ForkLease and SetEgress.
//
// Each activity leaves with its failure already classified: a top-level
// *temporal.ApplicationError whose Type is the sandbox package's type name
// and whose NonRetryable flag follows sandbox.Retryable. Temporal decides
// retries from that top-level failure only, so a cleanup error can never be
// retried on the lease that may hold an orphan, while a lost output
// connection is retried by the activity's retry policy.
//
// The activities are methods of [Activities], which holds their
// dependencies; register them with [Activities.Register] and call them by the
// Name* constants.
package activities

import (
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Activity type names. They are stable API: workflow histories refer to them.
const (
	NameCreateLease       = "sandboxflow.CreateLease"
	NameExecute           = "sandboxflow.Execute"
	NameDestroyLease      = "sandboxflow.DestroyLease"
	NameAcquireFreshLease = "sandboxflow.AcquireFreshLease"
	// Sessions (workflows.Session) also pause an idle lease and resume it.
	NamePauseLease  = "sandboxflow.PauseLease"
	NameResumeLease = "sandboxflow.ResumeLease"
	// A session forks its paused lease into another session's, and
	// changes its lease's egress between commands.
	NameForkLease = "sandboxflow.ForkLease"
	NameSetEgress = "sandboxflow.SetEgress"
)

// DefaultHeartbeatInterval is how often long-running activities record a
// heartbeat when Activities.HeartbeatInterval is zero. The SDK may send them
// less often (it throttles to a fraction of the heartbeat timeout).
const DefaultHeartbeatInterval = 5 * time.Second

// Activities holds what the activities need. The zero value is not usable:
// Provider is required.
type Activities struct {
	// Provider leases sandboxes and runs commands in them.
	Provider sandbox.Provider
	// Secrets resolves the secret environment variables of a command
	// (ExecuteInput.SecretEnv). Nil means commands cannot have secrets.
	Secrets Secrets
	// Heartbeats records Execute's new processes on the Temporal server
	// before their commands start; nil means ServerHeartbeats. The SDK's
	// test environments have no server: give them a recorder that keeps
	// heartbeats with activity.RecordHeartbeat.
	Heartbeats HeartbeatRecorder
	// HeartbeatInterval overrides DefaultHeartbeatInterval. Either is
	// capped at a third of each activity's heartbeat timeout.
	HeartbeatInterval time.Duration
	// Host names the sandbox host whose server Provider is, when sandboxes
	// are spread over a fleet of hosts (see the workflows package, "Fleets
	// of sandbox hosts"): every lease the activities return carries it
	// (sandbox.Lease.Host), so that the workflow sends the work on that
	// lease to this host. Empty when Provider is a service that every
	// worker shares.
	Host string
}

// onHost returns lease marked as living on the worker's host.
func (a *Activities) onHost(lease sandbox.Lease) sandbox.Lease {
	lease.Host = a.Host
	return lease
}

// Registry is where activities are registered: a worker.Worker or a
// testsuite environment.
type Registry interface {
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// Register registers the activities under their Name* constants.
func (a *Activities) Register(r Registry) {
	r.RegisterActivityWithOptions(a.CreateLease, activity.RegisterOptions{Name: NameCreateLease})
	r.RegisterActivityWithOptions(a.Execute, activity.RegisterOptions{Name: NameExecute})
	r.RegisterActivityWithOptions(a.DestroyLease, activity.RegisterOptions{Name: NameDestroyLease})
	r.RegisterActivityWithOptions(a.AcquireFreshLease, activity.RegisterOptions{Name: NameAcquireFreshLease})
	r.RegisterActivityWithOptions(a.PauseLease, activity.RegisterOptions{Name: NamePauseLease})
	r.RegisterActivityWithOptions(a.ResumeLease, activity.RegisterOptions{Name: NameResumeLease})
	r.RegisterActivityWithOptions(a.ForkLease, activity.RegisterOptions{Name: NameForkLease})
	r.RegisterActivityWithOptions(a.SetEgress, activity.RegisterOptions{Name: NameSetEgress})
	r.RegisterActivityWithOptions(a.ListOwnedLeases, activity.RegisterOptions{Name: NameListOwnedLeases})
	r.RegisterActivityWithOptions(a.EnsureTemplate, activity.RegisterOptions{Name: NameEnsureTemplate})
	r.RegisterActivityWithOptions(a.SnapshotLease, activity.RegisterOptions{Name: NameSnapshotLease})
}

// heartbeatInterval is how often an activity with the given heartbeat
// timeout records a heartbeat: HeartbeatInterval (or the default), but never
// more than a third of the timeout — a request may set a heartbeat timeout
// shorter than the interval, and every long command on a healthy worker
// would then time out.
func (a *Activities) heartbeatInterval(timeout time.Duration) time.Duration {
	interval := DefaultHeartbeatInterval
	if a.HeartbeatInterval > 0 {
		interval = a.HeartbeatInterval
	}
	if timeout > 0 {
		interval = min(interval, timeout/3)
	}
	return interval
}
