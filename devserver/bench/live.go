package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// liveLines is how many lines each live-output run prints, liveSpacing
// apart: spaced so that they fall at every phase of the worker's heartbeat
// throttle window (2 s), not in step with it.
const (
	liveLines   = 10
	liveSpacing = "0.37"
)

// liveScript prints liveLines lines "live <ns>", each stamped with the
// time (Unix nanoseconds) at which the sandbox printed it, and then waits
// for the file gate: the command runs on until the reader has seen the
// last line, so that every line travels live, none in the final Result.
func liveScript() sandbox.Command {
	return sandbox.Command{Argv: []string{"sh", "-c", fmt.Sprintf(
		`for i in $(seq %d); do echo "live $(date +%%s%%N)"; sleep %s; done; while [ ! -e gate ]; do sleep 0.05; done`,
		liveLines, liveSpacing)}}
}

// LiveOutput is the live-output latency: how long after the sandbox
// prints a line the line appears on the starter's stdout while the command
// runs — Execute's heartbeat (held back by the worker's heartbeat
// throttle), Temporal, and the starter's poll of the pending activity —
// beside the time it takes to reach an Observer of the direct provider,
// the stream without Temporal. Each run prints liveLines lines; runs of
// each path are interleaved. temporal is how the starter reaches the
// stack's Temporal server; the worker under test polls env.TaskQueue.
func LiveOutput(ctx context.Context, env *Env, temporal client.Options, runs int) ([]Row, error) {
	var viaStarter, direct []time.Duration
	for range runs {
		s, err := starterLatencies(ctx, env, temporal)
		if err != nil {
			return nil, fmt.Errorf("live output through the starter: %w", err)
		}
		d, err := observerLatencies(ctx, env)
		if err != nil {
			return nil, fmt.Errorf("live output, direct provider: %w", err)
		}
		viaStarter, direct = append(viaStarter, s...), append(direct, d...)
	}
	env.Logf("live output: %d lines, starter median %v (p95 %v), direct provider %v",
		len(viaStarter), Quantile(viaStarter, 0.5), Quantile(viaStarter, 0.95), Quantile(direct, 0.5))
	return []Row{
		{
			Name:   "Live output latency, median: a line printed in the sandbox → the starter's stdout",
			Figure: Millis(Quantile(viaStarter, 0.5)), FloorName: "the direct provider's Observer", Floor: Millis(Quantile(direct, 0.5)),
			Target: Target{MaxFigure: 2000},
		},
		{
			Name:   "Live output latency, p95: a line printed in the sandbox → the starter's stdout",
			Figure: Millis(Quantile(viaStarter, 0.95)), FloorName: "the direct provider's Observer", Floor: Millis(Quantile(direct, 0.95)),
		},
	}, nil
}

// starterLatencies runs liveScript through the starter and returns each
// line's latency to the starter's stdout.
func starterLatencies(ctx context.Context, env *Env, temporal client.Options) ([]time.Duration, error) {
	workflowID := env.workflowID("live")
	lines := newLineClock()
	var stderr bytes.Buffer
	code := make(chan int, 1)
	go func() {
		args := append([]string{"--task-queue", env.TaskQueue, "--workflow-id", workflowID, "--"}, liveScript().Argv...)
		code <- starterapp.Main(ctx, args, starterapp.IO{Stdin: strings.NewReader(""), Stdout: lines, Stderr: &stderr}, temporal, nil)
	}()
	select {
	case <-lines.all:
	case c := <-code:
		return nil, fmt.Errorf("the starter exited (%d) before printing every line: %s", c, strings.TrimSpace(stderr.String()))
	}
	if err := openGate(ctx, env, map[string]string{activities.LabelWorkflowID: workflowID}); err != nil {
		return nil, err
	}
	if c := <-code; c != 0 {
		return nil, fmt.Errorf("the starter exited %d: %s", c, strings.TrimSpace(stderr.String()))
	}
	if stderr.Len() > 0 {
		return nil, fmt.Errorf("the starter said: %s", strings.TrimSpace(stderr.String()))
	}
	return lines.latencies()
}

// observerLatencies runs liveScript through the provider directly, on a
// lease of its own, and returns each line's latency to the Observer.
func observerLatencies(ctx context.Context, env *Env) ([]time.Duration, error) {
	lease, err := env.Provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		return nil, fmt.Errorf("create lease: %w", err)
	}
	defer env.Provider.DestroyLease(context.WithoutCancel(ctx), lease.ID)
	lines := newLineClock()
	type outcome struct {
		res sandbox.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		o.res, o.err = env.Provider.Execute(ctx, lease, liveScript(), lineObserver{lines})
		done <- o
	}()
	select {
	case <-lines.all:
	case o := <-done:
		return nil, fmt.Errorf("the command ended before printing every line: %v (exit %d)", o.err, o.res.ShellExitCode())
	}
	if err := openGate(ctx, env, nil, lease); err != nil {
		return nil, err
	}
	if o := <-done; o.err != nil || !o.res.Succeeded() {
		return nil, fmt.Errorf("execute: %v (exit %d)", o.err, o.res.ShellExitCode())
	}
	return lines.latencies()
}

// openGate lets liveScript end: it creates the file gate in the lease
// given, or else in the one lease carrying labels.
func openGate(ctx context.Context, env *Env, labels map[string]string, given ...sandbox.Lease) error {
	leases := given
	if len(leases) == 0 {
		var err error
		if leases, err = env.Provider.ListLeases(ctx, labels); err != nil {
			return fmt.Errorf("find the run's lease: %w", err)
		}
	}
	if len(leases) != 1 {
		return fmt.Errorf("%d leases carry %v, want 1", len(leases), labels)
	}
	res, err := env.Provider.Execute(ctx, leases[0], sandbox.Command{Argv: []string{"touch", "gate"}}, nil)
	if err == nil && !res.Succeeded() {
		err = fmt.Errorf("exited %d", res.ShellExitCode())
	}
	if err != nil {
		return fmt.Errorf("open the gate: %w", err)
	}
	return nil
}

// lineClock is a writer of liveScript's output that notes when each of
// its lines arrives, and closes all once liveLines lines have.
type lineClock struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
	arrived []time.Time
	all     chan struct{}
}

func newLineClock() *lineClock { return &lineClock{all: make(chan struct{})} }

func (c *lineClock) Write(p []byte) (int, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.lines = append(c.lines, string(c.partial[:i]))
		c.arrived = append(c.arrived, now)
		c.partial = c.partial[i+1:]
		if len(c.lines) == liveLines {
			close(c.all)
		}
	}
	return len(p), nil
}

// latencies returns, for each line, how long after the time it is stamped
// with it arrived. Every line must have come once, in order.
func (c *lineClock) latencies() ([]time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lines) != liveLines || len(c.partial) > 0 {
		return nil, fmt.Errorf("%d lines (and %q) arrived, want %d", len(c.lines), c.partial, liveLines)
	}
	out := make([]time.Duration, len(c.lines))
	var previous int64
	for i, line := range c.lines {
		stamp, err := strconv.ParseInt(strings.TrimPrefix(line, "live "), 10, 64)
		if err != nil || !strings.HasPrefix(line, "live ") || stamp < previous {
			return nil, fmt.Errorf("line %d is %q: not the next line of the script", i+1, line)
		}
		previous = stamp
		out[i] = c.arrived[i].Sub(time.Unix(0, stamp))
	}
	return out, nil
}

// lineObserver hands a command's stdout to a lineClock as it arrives.
type lineObserver struct{ c *lineClock }

func (lineObserver) Started(sandbox.Process) error { return nil }

func (o lineObserver) Output(ch sandbox.Chunk) {
	if ch.Stream == sandbox.Stdout {
		io.WriteString(o.c, ch.Text)
	}
}
