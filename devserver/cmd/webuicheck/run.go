package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// workflowID is the id of the run the check makes. The stack's database
// is new and in memory every time, so a fixed id never collides, and the
// screenshot shows a readable one.
const workflowID = "webuicheck-compensated"

// faultRule names the FaultProxy rule of the check in the proxy's log.
const faultRule = "drop the first process-create response"

// dropFirstProcessCreate makes the run compensate: the sandbox server
// starts the command, but the worker never learns the process id, so the
// lease may hold an orphan and must not be reused (SandboxCleanupError →
// destroy the lease → AcquireFreshLease → run again).
func dropFirstProcessCreate() faultproxy.Rule {
	return faultproxy.Rule{
		Name:   faultRule,
		Method: http.MethodPost,
		Path:   "/sandboxes/*/processes",
		Times:  1,
		Fault:  faultproxy.DropResponse(),
	}
}

// compensatedRun is a finished run that compensated.
type compensatedRun struct {
	workflowID, runID string
	result            workflows.Result
}

// runCompensated starts RunCommand with m's command, waits for its result
// and checks that it compensated exactly once and printed m's output.
func runCompensated(ctx context.Context, s *stack.Stack, m marker) (compensatedRun, error) {
	req := workflows.Request{Command: sandbox.Command{Argv: m.command}}
	run, err := s.Client.ExecuteWorkflow(ctx,
		client.StartWorkflowOptions{ID: workflowID, TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, req)
	if err != nil {
		return compensatedRun{}, fmt.Errorf("start %s: %w", workflows.WorkflowName, err)
	}
	done := compensatedRun{workflowID: run.GetID(), runID: run.GetRunID()}
	if _, err := runresult.Get(ctx, s.Client, run, &done.result); err != nil {
		return done, fmt.Errorf("run %s failed: %w", run.GetID(), err)
	}
	if fired := s.Proxy.Fired(faultRule); fired != 1 {
		return done, fmt.Errorf("the fault proxy dropped %d process-create responses, want 1", fired)
	}
	if got := done.result.FreshLeases; got != 1 {
		return done, fmt.Errorf("run %s took %d fresh leases, want 1: it did not compensate as it should", run.GetID(), got)
	}
	if got := strings.TrimSpace(done.result.Stdout); got != m.output {
		return done, fmt.Errorf("run %s printed %q, want %q", run.GetID(), got, m.output)
	}
	return done, nil
}
