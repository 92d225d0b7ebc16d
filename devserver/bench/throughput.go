package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/workflows"
)

// Names of the no-op workflows: the floors of the benchmarks that time
// Temporal's share of a run (P1, P2) and of a session command (P5).
const (
	NoopWorkflowName        = "bench.NoopWorkflow"
	NoopActivityName        = "bench.Noop"
	NoopSessionWorkflowName = "bench.NoopSession"
	// noopUpdateName is the no-op session's Update, and closeSignalName the
	// signal that ends it.
	noopUpdateName  = "noop"
	closeSignalName = "close"
)

// Registry is where the no-op workflow is registered: a worker.Worker.
type Registry interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// RegisterNoop registers the no-op workflows and their activity. Register
// them on the worker that runs RunCommand, so that they share a worker.
func RegisterNoop(r Registry) {
	r.RegisterWorkflowWithOptions(noopWorkflow, workflow.RegisterOptions{Name: NoopWorkflowName})
	r.RegisterWorkflowWithOptions(noopSessionWorkflow, workflow.RegisterOptions{Name: NoopSessionWorkflowName})
	r.RegisterActivityWithOptions(noopActivity, activity.RegisterOptions{Name: NoopActivityName})
}

// noopWorkflow runs three activities that do nothing, one after the other,
// as RunCommand runs create, execute and destroy: what Temporal and the
// worker cost without a sandbox.
func noopWorkflow(ctx workflow.Context) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	for range 3 {
		if err := workflow.ExecuteActivity(ctx, NoopActivityName).Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

func noopActivity(context.Context) error { return nil }

// noopSessionWorkflow answers each Update by running one activity that
// does nothing, as a session answers an execute Update by running Execute:
// what Temporal and the worker cost a session command without a sandbox.
// It ends on the close signal.
func noopSessionWorkflow(ctx workflow.Context) error {
	if err := workflow.SetUpdateHandler(ctx, noopUpdateName, func(ctx workflow.Context) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
		return workflow.ExecuteActivity(ctx, NoopActivityName).Get(ctx, nil)
	}); err != nil {
		return err
	}
	workflow.GetSignalChannel(ctx, closeSignalName).Receive(ctx, nil)
	return nil
}

// Throughput is P2: RunCommand(`true`) completed per second by a closed
// loop of c clients, each starting the next run when its last one ended,
// for d at each concurrency, beside the no-op workflow run the same way
// on the same worker. Each measurement follows a warm-up round of c runs.
// The target (at concurrency 50) is at least 50 runs/s and 60% of the
// floor.
func Throughput(ctx context.Context, env *Env, concurrencies []int, d time.Duration) ([]Row, error) {
	runCommand := func(ctx context.Context) error {
		_, err := env.runCommand(ctx, env.TaskQueue, "p2", workflows.Request{Command: trueCommand})
		return err
	}
	noop := env.noopRun
	var rows []Row
	var rc, floor loopResult
	for _, c := range concurrencies {
		var err error
		if rc, err = closedLoop(ctx, c, d, runCommand); err != nil {
			return nil, fmt.Errorf("RunCommand at concurrency %d: %w", c, err)
		}
		if floor, err = closedLoop(ctx, c, d, noop); err != nil {
			return nil, fmt.Errorf("no-op workflow at concurrency %d: %w", c, err)
		}
		env.Logf("P2: concurrency %d: RunCommand %.1f/s (CPU each: %v, of which sandbox processes %v), no-op workflow %.1f/s (CPU each: %v)",
			c, rc.perSecond, rc.cpuPerCall, rc.childCPUPerCall, floor.perSecond, floor.cpuPerCall)
		row := Row{
			Name:      fmt.Sprintf("P2 throughput, concurrency %d: RunCommand(`true`)", c),
			Figure:    Value{rc.perSecond, "runs/s"},
			FloorName: "no-op workflow of 3 activities",
			Floor:     Value{floor.perSecond, "runs/s"},
		}
		if c == 50 {
			row.Target = Target{MinRatio: 0.6, MinFigure: 50}
		}
		rows = append(rows, row)
	}
	// What a run costs, whatever the machine's load: the ceiling of the
	// throughput is the number of cores over this.
	rows = append(rows, Row{
		Name:      fmt.Sprintf("P2 CPU time per run, concurrency %d: RunCommand(`true`), stack and sandbox processes", concurrencies[len(concurrencies)-1]),
		Figure:    Millis(rc.cpuPerCall),
		FloorName: "no-op workflow of 3 activities",
		Floor:     Millis(floor.cpuPerCall),
	})
	// A CPU-bound run adds the CPU of its sandbox processes (lease init,
	// supervisor, the command) to what the no-op workflow costs; with the
	// machine as busy as under the floor, that alone bounds the throughput
	// (the sandbox server's own CPU, in this process, would lower it more).
	ceiling := floor.perSecond * float64(floor.cpuPerCall) / float64(floor.cpuPerCall+rc.childCPUPerCall)
	rows = append(rows, Row{
		Name:      fmt.Sprintf("P2 throughput ceiling, concurrency %d: the floor × its CPU per run ÷ (that + RunCommand's sandbox processes' CPU per run)", concurrencies[len(concurrencies)-1]),
		Figure:    Value{ceiling, "runs/s"},
		FloorName: "no-op workflow of 3 activities",
		Floor:     Value{floor.perSecond, "runs/s"},
	})
	return rows, nil
}

// loopResult is what a closed loop achieved.
type loopResult struct {
	perSecond float64
	// cpuPerCall is the CPU time (user and system) of this process and of
	// the children it waited for, per call; childCPUPerCall the children's
	// part: the sandbox processes and their commands.
	cpuPerCall, childCPUPerCall time.Duration
}

// closedLoop runs one in c loops until d has passed (after a warm-up of
// one call per loop) and returns the calls completed per second and the
// CPU time each took. Calls in flight at the end are waited for and
// counted.
func closedLoop(ctx context.Context, c int, d time.Duration, one func(context.Context) error) (loopResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// loops runs the c loops until until and returns the calls completed.
	loops := func(until time.Time) (int64, error) {
		var done atomic.Int64
		var wg sync.WaitGroup
		for range c {
			wg.Go(func() {
				for {
					if err := one(ctx); err != nil {
						cancel(err)
						return
					}
					done.Add(1)
					if !time.Now().Before(until) {
						return
					}
				}
			})
		}
		wg.Wait()
		return done.Load(), context.Cause(ctx)
	}
	if _, err := loops(time.Time{}); err != nil { // warm-up: one call each
		return loopResult{}, err
	}
	selfBefore, childBefore := cpuTime()
	start := time.Now()
	n, err := loops(start.Add(d))
	if err != nil {
		return loopResult{}, err
	}
	elapsed := time.Since(start)
	if n == 0 {
		return loopResult{}, errors.New("nothing completed")
	}
	self, child := cpuTime()
	self, child = self-selfBefore, child-childBefore
	return loopResult{
		perSecond:       float64(n) / elapsed.Seconds(),
		cpuPerCall:      (self + child) / time.Duration(n),
		childCPUPerCall: child / time.Duration(n),
	}, nil
}

// cpuTime is the CPU time, user and system, of this process and of its
// descendants: the children it waited for (with their own children's),
// and its live children with the children they waited for. The sandbox
// server's lease inits are children of its spawner, a live child of this
// process (localsandbox/internal/leaseinit/spawner.go), which reaps them:
// getrusage of this process's children alone never sees them.
func cpuTime() (self, descendants time.Duration) {
	usage := func(who int) time.Duration {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) != nil {
			return 0
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return usage(syscall.RUSAGE_SELF), usage(syscall.RUSAGE_CHILDREN) + LiveChildrenCPU(os.Getpid())
}

// LiveChildrenCPU is the CPU time of parent's live children and of the
// children they waited for, from /proc/PID/stat: with the CPU of parent
// and of the children it waited for, that of a sandbox server and its
// sandboxes. A child reaped between
// two calls moves from here to getrusage's RUSAGE_CHILDREN with all it
// had: the sum counts it once.
func LiveChildrenCPU(parent int) time.Duration {
	entries, _ := os.ReadDir("/proc")
	var sum time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == parent {
			continue
		}
		if ppid, cpu, ok := procStat(pid); ok && ppid == parent {
			sum += cpu
		}
	}
	return sum
}

// ProcCPU is the CPU time of process pid and of the children it waited
// for, from /proc/PID/stat (0 once it is gone).
func ProcCPU(pid int) time.Duration {
	_, cpu, _ := procStat(pid)
	return cpu
}

// procStat reads /proc/PID/stat: the process's parent, and its CPU time
// with that of the children it waited for.
func procStat(pid int) (ppid int, cpu time.Duration, ok bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false // gone meanwhile
	}
	// pid (comm) state ppid … utime stime cutime cstime (fields 14–17)
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	var ticks int64
	for _, v := range f[11:15] {
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return ppid, time.Duration(ticks) * time.Second / clockTicks, true
}

// clockTicks is the kernel's USER_HZ, which /proc/PID/stat counts in.
const clockTicks = 100
