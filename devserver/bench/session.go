package bench

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// SessionLatency is P5: the time of one command (`true`) in an open
// session — an execute Update through Temporal to the worker, Execute on
// the session's lease, and back — beside the same Execute made directly
// through the provider on a lease of its own, and beside a whole
// RunCommand(`true`), which creates and destroys a lease every time, and
// beside an Update of the no-op session, which runs one activity that does
// nothing. The four are interleaved, one of each per round, after two
// rounds of warm-up.
//
// The direct Execute's time plus the no-op Update's is the least a session
// command can take, so the ratio of that sum to the direct Execute is the
// best ratio this machine allows the session command.
func SessionLatency(ctx context.Context, env *Env, runs int) ([]Row, error) {
	const warmup = 2
	sess, err := sandboxclient.StartSession(ctx, env.Client, env.startOptions("p5", env.TaskQueue), workflows.SessionRequest{})
	if err != nil {
		return nil, fmt.Errorf("start a session: %w", err)
	}
	defer sess.Close(context.WithoutCancel(ctx))
	noopSession, err := env.Client.ExecuteWorkflow(ctx, env.startOptions("p5-noop", env.TaskQueue), NoopSessionWorkflowName)
	if err != nil {
		return nil, fmt.Errorf("start the no-op session: %w", err)
	}
	defer env.Client.SignalWorkflow(context.WithoutCancel(ctx), noopSession.GetID(), noopSession.GetRunID(), closeSignalName, nil)
	lease, err := env.Provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		return nil, fmt.Errorf("direct provider: create lease: %w", err)
	}
	defer env.Provider.DestroyLease(context.WithoutCancel(ctx), lease.ID)

	var inSession, direct, whole, noop []time.Duration
	for i := range warmup + runs {
		s, err := timed(func() error {
			res, err := sess.Execute(ctx, workflows.SessionCommand{Command: trueCommand})
			if err == nil && !res.Succeeded() {
				err = fmt.Errorf("exited %d", res.ShellExitCode())
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("session command: %w", err)
		}
		d, err := timed(func() error {
			_, err := env.Provider.Execute(ctx, lease, trueCommand, nil)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("direct provider: execute: %w", err)
		}
		w, err := timed(func() error {
			_, err := env.runCommand(ctx, env.TaskQueue, "p5-run", workflows.Request{Command: trueCommand})
			return err
		})
		if err != nil {
			return nil, err
		}
		n, err := timed(func() error {
			handle, err := env.Client.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
				WorkflowID: noopSession.GetID(), RunID: noopSession.GetRunID(),
				UpdateName: noopUpdateName, WaitForStage: client.WorkflowUpdateStageCompleted,
			})
			if err == nil {
				err = handle.Get(ctx, nil)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("no-op session: %w", err)
		}
		if i >= warmup {
			inSession, direct, whole, noop = append(inSession, s), append(direct, d), append(whole, w), append(noop, n)
		}
	}
	env.Logf("P5: session command median %v, direct execute %v, RunCommand %v, no-op Update %v",
		Quantile(inSession, 0.5), Quantile(direct, 0.5), Quantile(whole, 0.5), Quantile(noop, 0.5))
	least := Quantile(direct, 0.5) + Quantile(noop, 0.5)
	withStart, startThen, err := openSessionRounds(ctx, env, min(runs, 10))
	if err != nil {
		return nil, err
	}
	env.Logf("P5: a session and its first command: update-with-start median %v, start then Update %v",
		Quantile(withStart, 0.5), Quantile(startThen, 0.5))
	return []Row{
		{
			Name:      "P5 latency, median: a session opened with its first command (`true`), update-with-start",
			Figure:    Millis(Quantile(withStart, 0.5)),
			FloorName: "a session started, then its first command", Floor: Millis(Quantile(startThen, 0.5)),
		},
		{
			Name:   "P5 latency, median: a command (`true`) in an open session",
			Figure: Millis(Quantile(inSession, 0.5)), FloorName: "Execute on a lease, direct provider", Floor: Millis(Quantile(direct, 0.5)),
			Target: Target{MaxRatio: 1.3},
		},
		{
			Name:   "P5 latency, median: the least a session command can take, direct Execute + an Update running one no-op activity",
			Figure: Millis(least), FloorName: "Execute on a lease, direct provider", Floor: Millis(Quantile(direct, 0.5)),
		},
		{
			Name:   "P5 latency, median: a command (`true`) in an open session, beside the least it can take",
			Figure: Millis(Quantile(inSession, 0.5)), FloorName: "direct Execute + no-op Update", Floor: Millis(least),
		},
		{
			Name:   "P5 latency, median: RunCommand(`true`), a lease of its own",
			Figure: Millis(Quantile(whole, 0.5)), FloorName: "a command in an open session", Floor: Millis(Quantile(inSession, 0.5)),
		},
	}, nil
}

// openSessionRounds times, runs times each and interleaved, a session
// opened and its first command (`true`) answered: by one update-with-start
// (sandboxclient.StartSessionWith), and by StartSession, then an execute
// Update. Each round's sessions are closed after its timing.
func openSessionRounds(ctx context.Context, env *Env, runs int) (withStart, startThen []time.Duration, err error) {
	first := workflows.SessionCommand{Command: trueCommand}
	var sessions []*sandboxclient.SessionClient
	closeAll := func() {
		for _, s := range sessions {
			s.Close(context.WithoutCancel(ctx))
		}
		sessions = nil
	}
	defer closeAll()
	opts := func() client.StartWorkflowOptions {
		o := env.startOptions("p5-open", env.TaskQueue)
		o.EnableEagerStart = false // as StartSessionWith must
		return o
	}
	for range runs {
		w, err := timed(func() error {
			s, pending, err := sandboxclient.StartSessionWith(ctx, env.Client, opts(), workflows.SessionRequest{}, first)
			if err != nil {
				return err
			}
			sessions = append(sessions, s)
			return mustSucceed(sessionResult(pending.Get(ctx)))
		})
		if err != nil {
			return nil, nil, fmt.Errorf("update-with-start: %w", err)
		}
		t, err := timed(func() error {
			s, err := sandboxclient.StartSession(ctx, env.Client, opts(), workflows.SessionRequest{})
			if err != nil {
				return err
			}
			sessions = append(sessions, s)
			return mustSucceed(sessionResult(s.Execute(ctx, first)))
		})
		if err != nil {
			return nil, nil, fmt.Errorf("start, then Update: %w", err)
		}
		withStart, startThen = append(withStart, w), append(startThen, t)
		closeAll()
	}
	return withStart, startThen, nil
}

// sessionResult is a session command's outcome as a sandbox.Result's.
func sessionResult(res workflows.SessionResult, err error) (sandbox.Result, error) {
	return res.Result, err
}
