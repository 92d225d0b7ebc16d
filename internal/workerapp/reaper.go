package workerapp

import (
	"context"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/workflows"
)

// reaperEnsureTimeout bounds EnsureReaper's request to Temporal.
const reaperEnsureTimeout = 30 * time.Second

// EnsureReaper creates the Temporal Schedule that runs the reaper
// (workflows.Reaper) on cfg.TaskQueue every cfg.ReaperInterval, unless it
// exists or cfg.ReaperInterval is negative: the worker binary and the dev
// stack call it when they start, any number of workers at once
// (workflows.EnsureReaperSchedule). It reports whether it created the
// schedule.
//
// Host mode does not run the reaper: every host's sweep destroys the
// leases on it whose owner is closed (workflows.SweepHost).
func EnsureReaper(ctx context.Context, c client.Client, cfg Config) (bool, error) {
	if cfg.ReaperInterval < 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reaperEnsureTimeout)
	defer cancel()
	return workflows.EnsureReaperSchedule(ctx, c, workflows.ReaperSchedule{
		TaskQueue: cfg.TaskQueue,
		Interval:  cfg.ReaperInterval,
		ClosedFor: cfg.ReaperClosedFor,
	})
}
