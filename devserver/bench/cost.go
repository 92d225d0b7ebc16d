package bench

import (
	"context"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Cost is P0: what one run costs, in things counted rather than timed, so
// that the figures do not depend on the machine's load — the Temporal
// RPCs of the client and the worker, the workflow tasks and the history
// events of the run, and the requests to the sandbox server:
//
//   - RunCommand(`true`), beside the no-op workflow of three activities
//     (Temporal) and beside the same create, execute and destroy made
//     directly through the provider (sandbox requests); and started with
//     the search attributes, which it then keeps current, beside without;
//   - a command (`true`) in an open session, beside RunCommand (Temporal)
//     and beside Execute on a lease through the provider (sandbox).
//
// Each figure is the mean over runs sequential runs, after one of warm-up;
// the breakdown by kind goes to env.Logf.
func Cost(ctx context.Context, env *Env, runs int) ([]Row, error) {
	runCommand := func(ctx context.Context) (client.WorkflowRun, error) {
		return env.startRun(ctx, env.TaskQueue, "p0", workflows.Request{Command: trueCommand})
	}
	noop := func(ctx context.Context) (client.WorkflowRun, error) {
		return env.Client.ExecuteWorkflow(ctx, env.startOptions("p0-noop", env.TaskQueue), NoopWorkflowName)
	}
	rc, err := costOfRuns(ctx, env, runs, runCommand)
	if err != nil {
		return nil, fmt.Errorf("RunCommand: %w", err)
	}
	withSA, err := costOfRuns(ctx, env, runs, func(ctx context.Context) (client.WorkflowRun, error) {
		opts := env.startOptions("p0-sa", env.TaskQueue)
		withSearchAttributes(&opts)
		return env.Client.ExecuteWorkflow(ctx, opts, workflows.WorkflowName, workflows.Request{Command: trueCommand})
	})
	if err != nil {
		return nil, fmt.Errorf("RunCommand with search attributes: %w", err)
	}
	floor, err := costOfRuns(ctx, env, runs, noop)
	if err != nil {
		return nil, fmt.Errorf("no-op workflow: %w", err)
	}
	direct, err := costOfDirect(ctx, env, runs, func(ctx context.Context) error { return directRun(ctx, env, trueCommand) })
	if err != nil {
		return nil, err
	}
	sess, err := costOfSessionCommands(ctx, env, runs)
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	lease, err := env.Provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		return nil, fmt.Errorf("direct provider: create lease: %w", err)
	}
	defer env.Provider.DestroyLease(context.WithoutCancel(ctx), lease.ID)
	execute, err := costOfDirect(ctx, env, runs, func(ctx context.Context) error {
		return mustSucceed(env.Provider.Execute(ctx, lease, trueCommand, nil))
	})
	if err != nil {
		return nil, err
	}

	for _, c := range []struct {
		what string
		cost cost
	}{{"RunCommand", rc}, {"no-op workflow", floor}, {"session command", sess}} {
		env.Logf("P0: %s: Temporal RPCs %s; sandbox requests %s", c.what, c.cost.rpcs.per(runs), c.cost.sandbox.per(runs))
	}
	env.Logf("P0: direct provider: create/execute/destroy %s; execute %s", direct.per(runs), execute.per(runs))

	n := float64(runs)
	count := func(c int, unit string) Value { return Value{float64(c) / n, unit} }
	const rcName, sessName = "RunCommand(`true`)", "a command (`true`) in an open session"
	return []Row{
		{Name: "P0 per run: Temporal RPCs of client and worker, " + rcName,
			Figure: count(rc.rpcs.total(), "RPCs"), FloorName: "no-op workflow of 3 activities", Floor: count(floor.rpcs.total(), "RPCs")},
		{Name: "P0 per run: workflow tasks, " + rcName,
			Figure: count(rc.workflowTasks, "tasks"), FloorName: "no-op workflow of 3 activities", Floor: count(floor.workflowTasks, "tasks")},
		{Name: "P0 per run: history events, " + rcName,
			Figure: count(rc.events, "events"), FloorName: "no-op workflow of 3 activities", Floor: count(floor.events, "events")},
		{Name: "P0 per run: workflow tasks, " + rcName + " started with the search attributes (as the starter starts it)",
			Figure: count(withSA.workflowTasks, "tasks"), FloorName: "without", Floor: count(rc.workflowTasks, "tasks")},
		{Name: "P0 per run: history events, " + rcName + " started with the search attributes",
			Figure: count(withSA.events, "events"), FloorName: "without", Floor: count(rc.events, "events")},
		{Name: "P0 per run: sandbox requests, " + rcName,
			Figure: count(rc.sandbox.total(), "requests"), FloorName: "create/execute/destroy, direct provider", Floor: count(direct.total(), "requests")},
		{Name: "P0 per command: Temporal RPCs of client and worker, " + sessName,
			Figure: count(sess.rpcs.total(), "RPCs"), FloorName: rcName, Floor: count(rc.rpcs.total(), "RPCs")},
		{Name: "P0 per command: workflow tasks, " + sessName,
			Figure: count(sess.workflowTasks, "tasks"), FloorName: rcName, Floor: count(rc.workflowTasks, "tasks")},
		{Name: "P0 per command: history events, " + sessName,
			Figure: count(sess.events, "events"), FloorName: rcName, Floor: count(rc.events, "events")},
		{Name: "P0 per command: sandbox requests, " + sessName,
			Figure: count(sess.sandbox.total(), "requests"), FloorName: "Execute on a lease, direct provider", Floor: count(execute.total(), "requests")},
	}, nil
}

// cost is what runs of a workflow cost in all.
type cost struct {
	rpcs, sandbox         tallied
	workflowTasks, events int
}

// costOfRuns runs start's workflow runs times, one after the other, and
// counts what they cost.
func costOfRuns(ctx context.Context, env *Env, runs int, start func(context.Context) (client.WorkflowRun, error)) (cost, error) {
	var (
		c        cost
		rpcs, sb map[string]int
		counted  []client.WorkflowRun
	)
	for i := range 1 + runs {
		if i == 1 { // after the warm-up
			rpcs, sb = env.Temporal.Snapshot(), env.Sandbox.Snapshot()
		}
		run, err := start(ctx)
		if err != nil {
			return cost{}, err
		}
		if err := env.result(ctx, run, nil); err != nil {
			return cost{}, err
		}
		if i > 0 {
			counted = append(counted, run)
		}
	}
	c.rpcs, c.sandbox = since(rpcs, env.Temporal.Snapshot()), since(sb, env.Sandbox.Snapshot())
	// Env.result's check for a lost close notification, once a second
	// while a run lasts, counts the machine's load, not the run's work.
	delete(c.rpcs, "DescribeWorkflowExecution")
	for _, run := range counted {
		if err := env.countHistory(ctx, run.GetID(), run.GetRunID(), 0, &c); err != nil {
			return cost{}, err
		}
	}
	return c, nil
}

// costOfSessionCommands runs runs commands in a session (after one of
// warm-up) and counts what they cost.
func costOfSessionCommands(ctx context.Context, env *Env, runs int) (cost, error) {
	sess, err := sandboxclient.StartSession(ctx, env.Client, env.startOptions("p0-session", env.TaskQueue), workflows.SessionRequest{})
	if err != nil {
		return cost{}, err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	execute := func() error {
		res, err := sess.Execute(ctx, workflows.SessionCommand{Command: trueCommand})
		if err == nil && !res.Succeeded() {
			err = fmt.Errorf("exited %d", res.ShellExitCode())
		}
		return err
	}
	if err := execute(); err != nil {
		return cost{}, err
	}
	historyLength := func() (int64, error) {
		desc, err := env.Client.DescribeWorkflowExecution(ctx, sess.ID(), sess.FirstRunID())
		return desc.GetWorkflowExecutionInfo().GetHistoryLength(), err
	}
	first, err := historyLength()
	if err != nil {
		return cost{}, err
	}
	rpcs, sb := env.Temporal.Snapshot(), env.Sandbox.Snapshot()
	for range runs {
		if err := execute(); err != nil {
			return cost{}, err
		}
	}
	c := cost{rpcs: since(rpcs, env.Temporal.Snapshot()), sandbox: since(sb, env.Sandbox.Snapshot())}
	delete(c.rpcs, "DescribeWorkflowExecution")
	err = env.countHistory(ctx, sess.ID(), sess.FirstRunID(), first, &c)
	return c, err
}

// costOfDirect counts the sandbox requests of runs calls of one, after
// one of warm-up.
func costOfDirect(ctx context.Context, env *Env, runs int, one func(context.Context) error) (tallied, error) {
	if err := one(ctx); err != nil {
		return nil, err
	}
	before := env.Direct.Snapshot()
	for range runs {
		if err := one(ctx); err != nil {
			return nil, err
		}
	}
	return since(before, env.Direct.Snapshot()), nil
}

// countHistory adds the events of a run's history after the event with id
// after, and its completed workflow tasks, to c.
func (e *Env) countHistory(ctx context.Context, workflowID, runID string, after int64, c *cost) error {
	it := e.Client.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return err
		}
		if ev.GetEventId() <= after {
			continue
		}
		c.events++
		if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			c.workflowTasks++
		}
	}
	return nil
}
