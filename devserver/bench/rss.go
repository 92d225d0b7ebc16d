package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/workflows"
)

// WorkerProcess says how to run the worker binary (./cmd/worker) against the
// stack, as its own process.
type WorkerProcess struct {
	// Binary is the built worker.
	Binary string
	// TemporalAddress and Namespace reach the stack's Temporal server.
	TemporalAddress, Namespace string
	// SandboxURL and SandboxAPIKey reach its sandbox server.
	SandboxURL, SandboxAPIKey string
}

// WorkerRSS is P3's memory: the peak resident set (VmHWM) of a worker
// process that ran RunCommand of a command writing n bytes to stdout, for
// each n of sizes (smallest first), each in a fresh worker on a task queue
// of its own. The first size's floor is the same worker's peak after a
// run of `true` just before: the fixed cost of streaming any output
// (buffers, and the garbage collector's headroom). The larger sizes' floor
// is the first size's peak, and their target a flat RSS: at most 1.25×
// it, however much more output.
func WorkerRSS(ctx context.Context, env *Env, wp WorkerProcess, sizes []int64) ([]Row, error) {
	var rows []Row
	var first float64
	for i, n := range sizes {
		floor, peak, err := workerPeaks(ctx, env, wp, n)
		if err != nil {
			return nil, fmt.Errorf("worker process, %d MiB: %w", n/MiB, err)
		}
		env.Logf("P3: worker process: VmHWM %.1f MiB after `true`, %.1f MiB after %d MiB of output", floor, peak, n/MiB)
		row := Row{
			Name:      fmt.Sprintf("P3 worker peak RSS: %d MiB of stdout (worker process)", n/MiB),
			Figure:    Value{peak, "MiB"},
			FloorName: "same worker after `true`",
			Floor:     Value{floor, "MiB"},
		}
		if i == 0 {
			first = peak
		} else {
			row.FloorName = fmt.Sprintf("peak at %d MiB", sizes[0]/MiB)
			row.Floor = Value{first, "MiB"}
			row.Target = Target{MaxRatio: 1.25}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// workerPeaks starts a worker, runs `true` and then the n-byte command on
// it, and returns its VmHWM in MiB after each.
func workerPeaks(ctx context.Context, env *Env, wp WorkerProcess, n int64) (floor, peak float64, err error) {
	queue := env.workflowID("rss-queue")
	cmd := exec.Command(wp.Binary, "--task-queue", queue, "--log-level", "error", "--stop-timeout", "5s")
	// Only what the worker needs: nothing of this environment's own
	// Temporal or sandbox settings.
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"TEMPORAL_ADDRESS=" + wp.TemporalAddress,
		"TEMPORAL_NAMESPACE=" + wp.Namespace,
		"SANDBOX_API_URL=" + wp.SandboxURL,
		"SANDBOX_API_KEY=" + wp.SandboxAPIKey,
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	// The runs end early if the worker does.
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		cancel(fmt.Errorf("the worker process exited: %v", err))
		close(exited)
	}()
	defer stopProcess(cmd, exited)
	run := func(req workflows.Request) (workflows.Result, error) {
		res, err := env.runCommand(runCtx, queue, "p3-rss", req)
		if err != nil && runCtx.Err() != nil {
			err = context.Cause(runCtx)
		}
		return res, err
	}

	if _, err := run(workflows.Request{Command: trueCommand}); err != nil {
		return 0, 0, err
	}
	if floor, err = vmHWM(cmd.Process.Pid); err != nil {
		return 0, 0, err
	}
	res, err := run(workflows.Request{Command: outputCommand(n)})
	if err != nil {
		return 0, 0, err
	}
	if err := checkOutputResult(res, n); err != nil {
		return 0, 0, err
	}
	peak, err = vmHWM(cmd.Process.Pid)
	return floor, peak, err
}

// stopProcess stops a worker as its operator would (SIGTERM), and kills it
// if it is still there after a while.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// vmHWM reads a process's peak resident set size, in MiB.
func vmHWM(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
			if err != nil {
				return 0, fmt.Errorf("VmHWM of %d: %w", pid, err)
			}
			return kb / 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no VmHWM in /proc/<pid>/status")
}
