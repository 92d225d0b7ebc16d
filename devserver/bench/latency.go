package bench

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// trueCommand is the command of the latency benchmarks: it does nothing,
// so that what is timed is the machinery around it.
var trueCommand = sandbox.Command{Argv: []string{"true"}}

// Latency is P1: the time of RunCommand(`true`) through the full stack
// (client → Temporal → worker → sandbox server and back), beside the same
// create, execute and destroy made directly through the createos provider
// without Temporal, a plain fork/exec of true, and the no-op workflow of
// three activities. The four are interleaved, one of each per round, so
// that drift hits them alike; two rounds of warm-up are not counted.
//
// The direct provider's time plus the no-op workflow's is the least a
// RunCommand can take (it makes the same requests, in the same three
// activities, with the same workflow tasks and events: see P0), so the
// ratio of that sum to the direct provider is the best P1 ratio this
// machine allows.
func Latency(ctx context.Context, env *Env, runs int) ([]Row, error) {
	const warmup = 2
	var stack, direct, fork, noop []time.Duration
	for i := range warmup + runs {
		s, err := timed(func() error {
			_, err := env.runCommand(ctx, env.TaskQueue, "p1", workflows.Request{Command: trueCommand})
			return err
		})
		if err != nil {
			return nil, err
		}
		d, err := timed(func() error { return directRun(ctx, env, trueCommand) })
		if err != nil {
			return nil, err
		}
		f, err := timed(func() error { return exec.CommandContext(ctx, "true").Run() })
		if err != nil {
			return nil, fmt.Errorf("fork/exec true: %w", err)
		}
		n, err := timed(func() error { return env.noopRun(ctx) })
		if err != nil {
			return nil, err
		}
		if i >= warmup {
			stack, direct, fork, noop = append(stack, s), append(direct, d), append(fork, f), append(noop, n)
		}
	}
	env.Logf("P1: full stack median %v, direct provider %v, fork/exec %v, no-op workflow %v",
		Quantile(stack, 0.5), Quantile(direct, 0.5), Quantile(fork, 0.5), Quantile(noop, 0.5))
	least := Quantile(direct, 0.5) + Quantile(noop, 0.5)
	return []Row{
		{
			Name:   "P1 latency, median: RunCommand(`true`), full stack",
			Figure: Millis(Quantile(stack, 0.5)), FloorName: "direct provider", Floor: Millis(Quantile(direct, 0.5)),
			Target: Target{MaxRatio: 1.3},
		},
		{
			Name:   "P1 latency, median: the least RunCommand(`true`) can take, direct provider + no-op workflow of 3 activities",
			Figure: Millis(least), FloorName: "direct provider", Floor: Millis(Quantile(direct, 0.5)),
		},
		{
			Name:   "P1 latency, median: RunCommand(`true`), full stack, beside the least it can take",
			Figure: Millis(Quantile(stack, 0.5)), FloorName: "direct provider + no-op workflow", Floor: Millis(least),
		},
		{
			Name:   "P1 latency, p95: RunCommand(`true`), full stack",
			Figure: Millis(Quantile(stack, 0.95)), FloorName: "direct provider", Floor: Millis(Quantile(direct, 0.95)),
			Target: Target{MaxRatio: 2},
		},
		{
			Name:   "P1 latency, median: create/execute/destroy, direct provider",
			Figure: Millis(Quantile(direct, 0.5)), FloorName: "fork/exec of `true`", Floor: Millis(Quantile(fork, 0.5)),
		},
	}, nil
}

// directRun is what RunCommand does for cmd, made directly through the
// provider: create a lease, execute, destroy.
func directRun(ctx context.Context, env *Env, cmd sandbox.Command) error {
	lease, err := env.Provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		return fmt.Errorf("direct provider: create lease: %w", err)
	}
	res, err := env.Provider.Execute(ctx, lease, cmd, nil)
	if derr := env.Provider.DestroyLease(ctx, lease.ID); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("direct provider: %w", err)
	}
	if !res.Succeeded() {
		return fmt.Errorf("direct provider: %s did not succeed (exit %d)", cmd, res.ExitCode)
	}
	return nil
}

// timed runs f and returns how long it took.
func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}
