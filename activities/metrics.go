package activities

import (
	"context"
	"errors"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/metrics"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// meter records sandboxflow's own metrics (named in package metrics)
// through the activity's SDK metrics handler: they carry the same
// activity tags as the SDK's metrics, go wherever the worker's client sends
// those, and are no-ops where no handler is set (unit tests).
type meter struct {
	h client.MetricsHandler
}

func meterOf(ctx context.Context) meter { return meter{h: activity.GetMetricsHandler(ctx)} }

func (m meter) leaseCreated()   { m.h.Counter(metrics.LeasesCreated).Inc(1) }
func (m meter) leaseDestroyed() { m.h.Counter(metrics.LeasesDestroyed).Inc(1) }
func (m meter) compensation()   { m.h.Counter(metrics.Compensations).Inc(1) }

// orphanDestroyed counts a sweep's destroy: a destroyed lease and a
// suspected leak.
func (m meter) orphanDestroyed() {
	m.leaseDestroyed()
	m.h.Counter(metrics.LeaksSuspected).Inc(1)
}

// failed counts the failures that have a metric of their own: cleanup
// errors by reason and lost output connections. Other errors count only in
// the SDK's metrics (temporal_activity_execution_failed).
func (m meter) failed(err error) {
	var cleanup *sandbox.CleanupError
	switch {
	case errors.As(err, &cleanup):
		m.h.WithTags(map[string]string{metrics.TagReason: string(cleanup.Reason)}).Counter(metrics.CleanupErrors).Inc(1)
	case sandbox.ErrorType(err) == sandbox.TypeConnectionExhausted:
		m.h.Counter(metrics.ConnectionExhaustionRetries).Inc(1)
	}
}

// commandEnded times a command from its process's creation to its end.
func (m meter) commandEnded(started time.Time) {
	m.h.Timer(metrics.CommandDuration).Record(time.Since(started))
}

// outputCounters are the byte counters of each stream, made once per
// command so that each chunk costs one addition.
func (m meter) outputCounters() map[sandbox.Stream]client.MetricsCounter {
	counters := map[sandbox.Stream]client.MetricsCounter{}
	for _, s := range []sandbox.Stream{sandbox.Stdout, sandbox.Stderr} {
		counters[s] = m.h.WithTags(map[string]string{metrics.TagStream: string(s)}).Counter(metrics.OutputBytes)
	}
	return counters
}
