package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// liveWorkflowID is the id of the run whose live output the check looks
// for on the pending-activities page.
const liveWorkflowID = "webuicheck-live"

// liveCommand prints m's output (computed, so it is in no input) and then
// runs until the file gate appears in its workspace: while it waits, the
// output is in Execute's heartbeat details, and nowhere else.
func liveCommand(m marker) sandbox.Command {
	script := m.command[len(m.command)-1] + "; while [ ! -e gate ]; do sleep 0.1; done"
	return sandbox.Command{Argv: []string{"sh", "-c", script}}
}

// liveRun is a run whose command runs, its output in the heartbeat of its
// pending Execute activity.
type liveRun struct {
	workflowID, runID string
	run               client.WorkflowRun
}

// startLive starts RunCommand with liveCommand(m) and returns once a
// heartbeat of its pending Execute, decoded as the worker encoded it,
// carries m's output.
func startLive(ctx context.Context, s *stack.Stack, m marker) (liveRun, error) {
	run, err := s.Client.ExecuteWorkflow(ctx,
		client.StartWorkflowOptions{ID: liveWorkflowID, TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, workflows.Request{Command: liveCommand(m)})
	if err != nil {
		return liveRun{}, fmt.Errorf("start %s: %w", workflows.WorkflowName, err)
	}
	live := liveRun{workflowID: run.GetID(), runID: run.GetRunID(), run: run}
	dc := s.DataConverter()
	// Nothing signals a heartbeat's arrival at the server: look again
	// until one carries the output.
	for {
		desc, err := s.Client.DescribeWorkflowExecution(ctx, live.workflowID, live.runID)
		if err != nil {
			return live, fmt.Errorf("describe %s: %w", live.workflowID, err)
		}
		for _, pa := range desc.GetPendingActivities() {
			var progress activities.ExecuteProgress
			if pa.GetActivityType().GetName() == activities.NameExecute && pa.GetHeartbeatDetails() != nil &&
				dc.FromPayloads(pa.GetHeartbeatDetails(), &progress) == nil && strings.Contains(progress.Stdout.Text, m.output) {
				return live, nil
			}
		}
		select {
		case <-ctx.Done():
			return live, fmt.Errorf("no heartbeat of %s's Execute carried %q: %w", live.workflowID, m.output, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkStoredHeartbeat checks whether m's output is readable in the
// pending Execute's heartbeat details as the server holds them, read by a
// client without the codec: it must not be when payloads are encrypted,
// and must be when they are not.
func checkStoredHeartbeat(ctx context.Context, s *stack.Stack, live liveRun, m marker, encrypted bool) error {
	c, err := client.DialContext(ctx, client.Options{HostPort: s.Temporal.FrontendHostPort(), Namespace: s.Temporal.Namespace()})
	if err != nil {
		return fmt.Errorf("connect a codec-less client: %w", err)
	}
	defer c.Close()
	desc, err := c.DescribeWorkflowExecution(ctx, live.workflowID, live.runID)
	if err != nil {
		return fmt.Errorf("describe %s: %w", live.workflowID, err)
	}
	var details []byte
	for _, pa := range desc.GetPendingActivities() {
		wire, err := proto.Marshal(pa.GetHeartbeatDetails())
		if err != nil {
			return err
		}
		details = append(details, wire...)
	}
	plain := bytes.Contains(details, []byte(m.output))
	switch {
	case len(details) == 0:
		return fmt.Errorf("%s has no pending activity with heartbeat details", live.workflowID)
	case encrypted && plain:
		return fmt.Errorf("payloads are encrypted, yet the heartbeat details of %s hold %q in plain text", live.workflowID, m.output)
	case !encrypted && !plain:
		return fmt.Errorf("the heartbeat details of %s do not hold %q although payloads are not encrypted: the check is broken", live.workflowID, m.output)
	}
	return nil
}

// finishLive lets the live run's command end (it creates the gate in the
// run's lease) and checks the run's result.
func finishLive(ctx context.Context, s *stack.Stack, live liveRun, m marker) error {
	direct, err := s.Provider(createos.Config{})
	if err != nil {
		return err
	}
	leases, err := direct.ListLeases(ctx, map[string]string{activities.LabelWorkflowID: live.workflowID})
	if err != nil || len(leases) != 1 {
		return fmt.Errorf("find the lease of %s: %d leases, %v", live.workflowID, len(leases), err)
	}
	if res, err := direct.Execute(ctx, leases[0], sandbox.Command{Argv: []string{"touch", "gate"}}, nil); err != nil || !res.Succeeded() {
		return fmt.Errorf("open the gate of %s: exit %d, %v", live.workflowID, res.ShellExitCode(), err)
	}
	var res workflows.Result
	if _, err := runresult.Get(ctx, s.Client, live.run, &res); err != nil {
		return fmt.Errorf("run %s failed: %w", live.workflowID, err)
	}
	if got := strings.TrimSpace(res.Stdout); got != m.output {
		return fmt.Errorf("run %s printed %q, want %q", live.workflowID, got, m.output)
	}
	return nil
}

// pendingActivitiesPage is the Web UI page of a run's pending activities.
func pendingActivitiesPage(s *stack.Stack, workflowID, runID string) string {
	return strings.TrimSuffix(s.Temporal.RunURL(workflowID, runID), "/history") + "/pending-activities"
}
