// Package metrics names sandboxflow's own metrics. The activities record
// them through the SDK's client.MetricsHandler, so they go wherever a
// worker's client sends the SDK's metrics; package prom serves them, and
// the SDK's, to Prometheus.
package metrics

// Names of sandboxflow's own metrics, as the activities record them through
// the SDK's client.MetricsHandler (activity.GetMetricsHandler). Prometheus
// shows counters with a _total suffix and the duration in seconds:
// sandboxflow_leases_created_total, sandboxflow_command_duration_seconds.
//
// Every series also carries the SDK's activity tags: activity_type,
// workflow_type, namespace and task_queue.
const (
	// LeasesCreated counts sandboxes created for runs (CreateLease and
	// AcquireFreshLease).
	LeasesCreated = "sandboxflow_leases_created"
	// LeasesDestroyed counts destroys the sandbox server confirmed
	// (DestroyLease, and CreateLease's destroy of a sandbox it could not set
	// up): a run's lease at its end, an unusable lease before its
	// replacement, an orphan a sweep found. A lease already gone counts
	// too: gone is what was asked. Once every lease is gone,
	// LeasesCreated + LeaksSuspected = LeasesDestroyed, unless a destroy was
	// repeated (a retry whose first try had succeeded).
	LeasesDestroyed = "sandboxflow_leases_destroyed"
	// LeaksSuspected counts orphans that a sweep found and destroyed:
	// sandboxes of a run that the run did not know it had, typically left
	// by a create whose response was lost. Also counted in LeasesDestroyed.
	LeaksSuspected = "sandboxflow_leaks_suspected"
	// CleanupErrors counts activity attempts that failed with
	// SandboxCleanupError, by TagReason (creation_unconfirmed,
	// termination_unconfirmed): each costs the run a compensation.
	CleanupErrors = "sandboxflow_cleanup_errors"
	// Compensations counts fresh leases taken to replace an unusable one:
	// each successful AcquireFreshLease.
	Compensations = "sandboxflow_compensations"
	// ConnectionExhaustionRetries counts Execute attempts that failed with
	// OutputConnectionError (the output stream could not be re-attached;
	// the command was killed): Execute's retry policy runs the command again
	// while attempts remain.
	ConnectionExhaustionRetries = "sandboxflow_connection_exhaustion_retries"
	// CommandDuration times each command that an Execute attempt started
	// and that ended with a result (an exit, a signal or its timeout), from
	// the creation of its process to its end. A timer: a histogram in
	// seconds.
	CommandDuration = "sandboxflow_command_duration"
	// OutputBytes counts the raw output bytes read from sandboxes, by
	// TagStream (stdout, stderr). An attempt that re-attaches to a running
	// command reads its output again.
	OutputBytes = "sandboxflow_output_bytes"
)

// Tags of sandboxflow's own metrics.
const (
	// TagReason is the sandbox.CleanupReason of a CleanupErrors count.
	TagReason = "reason"
	// TagStream is the sandbox.Stream of an OutputBytes count.
	TagStream = "stream"
)
