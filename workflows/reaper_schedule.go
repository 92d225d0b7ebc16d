package workflows

// This file is ordinary Go code that a worker runs when it starts, not
// workflow code.

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// ReaperScheduleID is the id of the Temporal Schedule that runs Reaper,
// shown on the Web UI's Schedules page; ReaperWorkflowID prefixes the id
// of each of its runs.
const (
	ReaperScheduleID = "sandboxflow-reaper"
	ReaperWorkflowID = "sandboxflow-reaper"
)

// DefaultReaperInterval is how often the schedule runs Reaper when
// ReaperSchedule.Interval is zero. A lease left behind by a run that could
// not release it is destroyed within Interval + ClosedFor (+ the reaper's
// own run) of its owner's close: 6 minutes with the defaults.
const DefaultReaperInterval = 5 * time.Minute

// ReaperSchedule configures the schedule of the reaper.
type ReaperSchedule struct {
	// TaskQueue is where Reaper and its activities run: a queue of workers
	// with the activities over the sandbox server (DefaultTaskQueue when
	// empty).
	TaskQueue string
	// Interval between two runs (DefaultReaperInterval when zero).
	Interval time.Duration
	// ClosedFor is ReaperRequest.ClosedFor.
	ClosedFor time.Duration
}

// EnsureReaperSchedule creates the schedule that runs Reaper every
// Interval, unless it exists. Many workers may call it at once: the one
// whose create wins makes it, the others find it, and a schedule that
// exists is left as it is (edit or delete it with the Temporal CLI or the
// Web UI to change it). Its overlap policy is SKIP: a run still going
// when the next is due makes that one skip, so runs never pile up.
// It reports whether it created the schedule.
func EnsureReaperSchedule(ctx context.Context, c client.Client, s ReaperSchedule) (bool, error) {
	if s.TaskQueue == "" {
		s.TaskQueue = DefaultTaskQueue
	}
	if s.Interval <= 0 {
		s.Interval = DefaultReaperInterval
	}
	_, err := c.ScheduleClient().Create(ctx, client.ScheduleOptions{
		ID:      ReaperScheduleID,
		Spec:    client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: s.Interval}}},
		Overlap: enumspb.SCHEDULE_OVERLAP_POLICY_SKIP,
		Note:    "sandboxflow: destroys the leases of runs that closed without releasing them",
		Action: &client.ScheduleWorkflowAction{
			ID:        ReaperWorkflowID,
			Workflow:  ReaperWorkflowName,
			Args:      []any{ReaperRequest{ClosedFor: s.ClosedFor}},
			TaskQueue: s.TaskQueue,
			// A run that hangs (a sandbox server that does not answer)
			// ends, and the next one starts over.
			WorkflowExecutionTimeout: max(s.Interval, 30*time.Minute),
		},
	})
	switch {
	case errors.Is(err, temporal.ErrScheduleAlreadyRunning):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("create the reaper's schedule %s: %w", ReaperScheduleID, err)
	}
	return true, nil
}
