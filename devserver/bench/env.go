package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync/atomic"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Env is what the measurements run against: a running stack and a worker
// polling TaskQueue with RunCommand and the no-op workflow registered
// (RegisterNoop).
type Env struct {
	// Client is connected to the stack's Temporal server.
	Client client.Client
	// TaskQueue is polled by the worker under test.
	TaskQueue string
	// Provider is a client of the stack's sandbox server, configured as
	// the worker's provider is, for the runs without Temporal.
	Provider *createos.Client
	// Logf reports progress (to stderr).
	Logf func(format string, args ...any)
	// Temporal counts the RPCs of Client and of the worker on it; Sandbox
	// the worker's requests to the sandbox server, Direct Provider's.
	Temporal, Sandbox, Direct *Tally
	// EagerStart starts workflows eagerly: the worker polling TaskQueue
	// must run on Client, in this process.
	EagerStart bool
	// SearchAttributes starts workflows with RunCommand's search
	// attributes, as the starter does when the namespace has them: the
	// runs then keep them current.
	SearchAttributes bool

	prefix string
	ids    atomic.Int64
	// lostWakeups counts the results that Get did not deliver although
	// the run had closed (see result).
	lostWakeups atomic.Int64
}

// NewEnv returns an Env; see its fields. A nil logf reports nothing.
func NewEnv(c client.Client, taskQueue string, provider *createos.Client, logf func(string, ...any)) *Env {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Env{Client: c, TaskQueue: taskQueue, Provider: provider, Logf: logf, prefix: "bench-" + rand.Text()[:6]}
}

// LostWakeups is how many results Temporal failed to deliver to a waiting
// Get so far; result read them at most runresult.CheckInterval late.
func (e *Env) LostWakeups() int64 { return e.lostWakeups.Load() }

// workflowID returns a new workflow id of this run of the benchmarks.
func (e *Env) workflowID(what string) string {
	return fmt.Sprintf("%s-%s-%d", e.prefix, what, e.ids.Add(1))
}

// startOptions are the options of a new workflow of this run of the
// benchmarks on queue.
func (e *Env) startOptions(what, queue string) client.StartWorkflowOptions {
	opts := client.StartWorkflowOptions{ID: e.workflowID(what), TaskQueue: queue, EnableEagerStart: e.EagerStart && queue == e.TaskQueue}
	if e.SearchAttributes {
		withSearchAttributes(&opts)
	}
	return opts
}

// withSearchAttributes gives a run RunCommand's search attributes, as the
// starter does when the namespace has them.
func withSearchAttributes(opts *client.StartWorkflowOptions) {
	opts.TypedSearchAttributes = temporal.NewSearchAttributes(
		temporal.NewSearchAttributeKeyKeyword(workflows.SearchAttributePhase).ValueSet("scheduled"))
}

// noopRun runs the no-op workflow of three activities to its end.
func (e *Env) noopRun(ctx context.Context) error {
	run, err := e.Client.ExecuteWorkflow(ctx, e.startOptions("noop", e.TaskQueue), NoopWorkflowName)
	if err != nil {
		return err
	}
	return e.result(ctx, run, nil)
}

// startRun starts RunCommand on queue.
func (e *Env) startRun(ctx context.Context, queue, what string, req workflows.Request) (client.WorkflowRun, error) {
	run, err := e.Client.ExecuteWorkflow(ctx, e.startOptions(what, queue), workflows.WorkflowName, req)
	if err != nil {
		return nil, fmt.Errorf("start RunCommand: %w", err)
	}
	return run, nil
}

// runCommand runs RunCommand on queue and waits for its result. A run
// that fails, or whose command did not exit 0, is an error: a benchmark
// must not time failures.
func (e *Env) runCommand(ctx context.Context, queue, what string, req workflows.Request) (workflows.Result, error) {
	run, err := e.startRun(ctx, queue, what, req)
	if err != nil {
		return workflows.Result{}, err
	}
	var res workflows.Result
	if err := e.result(ctx, run, &res); err != nil {
		return workflows.Result{}, fmt.Errorf("RunCommand %s: %w", run.GetID(), err)
	}
	if !res.Succeeded() {
		return res, fmt.Errorf("RunCommand %s: the command did not succeed (exit %d, signal %q, timed out %v)",
			run.GetID(), res.ExitCode, res.Signal, res.TimedOut)
	}
	return res, nil
}

// result waits for the run's result as any client does, but without
// timing the Temporal server's lost close notifications (see package
// runresult): a benchmark of sandboxflow must not measure those. The
// ones it met are counted in LostWakeups.
func (e *Env) result(ctx context.Context, run client.WorkflowRun, out any) error {
	lost, err := runresult.Get(ctx, e.Client, run, out)
	if lost {
		e.lostWakeups.Add(1)
	}
	return err
}
