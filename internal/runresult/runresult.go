// Package runresult waits for a workflow run's result without depending on
// the server noticing, in time, that the run closed.
//
// A client's run.Get long-polls the run's history for its close event. The
// Temporal server (seen with v1.32) sometimes drops that notification: its
// history notifier hands each waiting poll a one-slot channel and discards
// what does not fit. The poll then waits out its full timeout (20 s) although
// the result is there. Get checks the run's state every CheckInterval
// while it waits, and reads a run that closed in the meantime at once.
package runresult

import (
	"context"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
)

// CheckInterval is how often Get looks at a run whose result has not arrived.
const CheckInterval = time.Second

// Get waits for run's result like run.Get(ctx, out). lostWakeup reports
// that the run had closed but the server had not woken the long poll, so
// the result was read by a new request.
func Get(ctx context.Context, c client.Client, run client.WorkflowRun, out any) (lostWakeup bool, err error) {
	pollCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- run.Get(pollCtx, out) }()
	check := time.NewTicker(CheckInterval)
	defer check.Stop()
	for {
		select {
		case err := <-got:
			return false, err
		case <-check.C:
		}
		desc, err := c.DescribeWorkflowExecution(ctx, run.GetID(), run.GetRunID())
		if err != nil || desc.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			continue
		}
		select {
		case err := <-got: // on its way already
			return false, err
		case <-time.After(100 * time.Millisecond):
		}
		cancel()
		<-got
		// A Get of a closed run answers from its history at once.
		return true, c.GetWorkflow(ctx, run.GetID(), run.GetRunID()).Get(ctx, out)
	}
}
