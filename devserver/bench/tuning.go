package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// A Variant is one configuration of the Temporal client and worker: an
// Env of its own, whose client, worker and task queue are configured so.
type Variant struct {
	Name string
	Env  *Env
}

// Tuning is the A/B part: what each Temporal setting buys on this
// machine, measured in one run. Each round runs, through every variant in
// turn (the order rotating from round to round), RunCommand(`true`), a
// command (`true`) in a session of the variant's own and the no-op
// workflow (Temporal alone); the figures are the
// medians of each variant beside those of the first, the project as it
// was, and the CPU time (of this process and the sandbox processes) per
// RunCommand. Two rounds of warm-up are not counted.
func Tuning(ctx context.Context, variants []Variant, runs int) ([]Row, error) {
	const warmup = 2
	type samples struct {
		run, command, noop []time.Duration
		cpu                time.Duration // RunCommands only
	}
	got := make([]samples, len(variants))
	sessions := make([]*sandboxclient.SessionClient, len(variants))
	for i, v := range variants {
		s, err := sandboxclient.StartSession(ctx, v.Env.Client, v.Env.startOptions("ab-"+v.Name, v.Env.TaskQueue), workflows.SessionRequest{})
		if err != nil {
			return nil, fmt.Errorf("%s: start a session: %w", v.Name, err)
		}
		defer s.Close(context.WithoutCancel(ctx))
		sessions[i] = s
	}
	for round := range warmup + runs {
		for k := range variants {
			i := (round + k) % len(variants)
			env := variants[i].Env
			self, child := cpuTime()
			r, err := timed(func() error {
				_, err := env.runCommand(ctx, env.TaskQueue, "ab", workflows.Request{Command: trueCommand})
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", variants[i].Name, err)
			}
			self2, child2 := cpuTime()
			c, err := timed(func() error {
				res, err := sessions[i].Execute(ctx, workflows.SessionCommand{Command: trueCommand})
				if err == nil && !res.Succeeded() {
					err = fmt.Errorf("exited %d", res.ShellExitCode())
				}
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("%s: session command: %w", variants[i].Name, err)
			}
			n, err := timed(func() error {
				run, err := env.Client.ExecuteWorkflow(ctx, env.startOptions("ab-noop", env.TaskQueue), NoopWorkflowName)
				if err == nil {
					err = env.result(ctx, run, nil)
				}
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("%s: no-op workflow: %w", variants[i].Name, err)
			}
			if round >= warmup {
				s := &got[i]
				s.run, s.command, s.noop = append(s.run, r), append(s.command, c), append(s.noop, n)
				s.cpu += self2 - self + child2 - child
			}
		}
	}
	var rows []Row
	base := got[0]
	for i, v := range variants {
		s := got[i]
		variants[0].Env.Logf("A/B: %s: RunCommand median %v, session command median %v, no-op workflow median %v, CPU per RunCommand %v",
			v.Name, Quantile(s.run, 0.5), Quantile(s.command, 0.5), Quantile(s.noop, 0.5), s.cpu/time.Duration(runs))
		if i == 0 {
			continue
		}
		floor := variants[0].Name
		rows = append(rows,
			Row{Name: "A/B latency, median: RunCommand(`true`), " + v.Name,
				Figure: Millis(Quantile(s.run, 0.5)), FloorName: floor, Floor: Millis(Quantile(base.run, 0.5))},
			Row{Name: "A/B latency, median: a command (`true`) in an open session, " + v.Name,
				Figure: Millis(Quantile(s.command, 0.5)), FloorName: floor, Floor: Millis(Quantile(base.command, 0.5))},
			Row{Name: "A/B latency, median: no-op workflow of 3 activities, " + v.Name,
				Figure: Millis(Quantile(s.noop, 0.5)), FloorName: floor, Floor: Millis(Quantile(base.noop, 0.5))},
			Row{Name: "A/B CPU time per RunCommand(`true`), " + v.Name,
				Figure: Millis(s.cpu / time.Duration(runs)), FloorName: floor, Floor: Millis(base.cpu / time.Duration(runs))},
		)
	}
	return rows, nil
}
