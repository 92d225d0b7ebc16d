// Command chaos is a soak test of sandboxflow under random faults: it boots
// the development stack (embedded Temporal, the local sandbox server, a
// worker), puts a testsuite.FaultProxy between the worker and the sandbox
// server that breaks a share of all requests in the ways the network and
// the server really fail, runs many RunCommand workflows at once, and
// prints a markdown table of what became of them:
//
//	cd devserver && go run ./cmd/chaos -runs 500 -fault-rate 0.2
//
// Each command prints a unique marker first, so that the sandbox server's
// process history tells how many times each really ran. Duplicate runs are
// classified: a compensation after an unconfirmed kill and a retry after
// the output connection was exhausted are the documented prices of those
// failures; anything else is unexplained.
//
// The exit status is 1 when a lease or a process leaked, when a run's
// result was lost (it neither completed nor failed with an error of the
// taxonomy), or when a run that completed returned the wrong output.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// operationTimeout is the worker's createos OperationTimeout: short, so
// that a stalled request costs little.
const operationTimeout = 5 * time.Second

func main() {
	runs := flag.Int("runs", 100, "number of RunCommand workflows")
	rate := flag.Float64("fault-rate", 0.1, "share of the requests of each kind that a fault breaks (0 to 1)")
	concurrency := flag.Int("concurrency", 16, "workflows running at once")
	seed := flag.Uint64("seed", 1, "seed of the fault proxy's random choices")
	runTimeout := flag.Duration("run-timeout", 5*time.Minute, "a workflow still running after this long is lost")
	verbose := flag.Bool("v", false, "show the stack's warnings and list the typed failures")
	flag.Parse()
	if *runs < 1 || *concurrency < 1 || *rate < 0 || *rate > 1 {
		fmt.Fprintln(os.Stderr, "chaos: -runs and -concurrency must be positive, -fault-rate between 0 and 1")
		os.Exit(2)
	}
	code, err := soak(context.Background(), config{
		runs: *runs, rate: *rate, concurrency: *concurrency, seed: *seed,
		runTimeout: *runTimeout, verbose: *verbose,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

type config struct {
	runs, concurrency int
	rate              float64
	seed              uint64
	runTimeout        time.Duration
	verbose           bool
}

// soak runs the soak and prints its report; the code is the exit status.
func soak(ctx context.Context, cfg config) (int, error) {
	logOut := io.Discard
	if cfg.verbose {
		logOut = os.Stderr
	}
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	root, err := os.MkdirTemp("", "sandboxflow-chaos-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(root)

	s, err := stack.Start(ctx, stack.Options{
		Temporal: temporalserver.Options{UIPort: temporalserver.NoUI, Logger: logger, LogLevel: slog.LevelError},
		Sandbox: localsandbox.Options{
			Root:        root,
			HistorySize: 100 * cfg.runs, // every process of every run, to count the runs
		},
		FaultProxy:     true,
		FaultProxySeed: cfg.seed,
		Worker: workerapp.Config{
			Sandbox:           createos.Config{OperationTimeout: operationTimeout},
			HeartbeatInterval: time.Second,
		},
		Logger: logger,
	})
	if err != nil {
		return 0, err
	}
	defer s.Stop()
	proxy := s.Proxy
	addFaults(proxy, faultKinds(4*operationTimeout), cfg.rate)

	fmt.Fprintf(os.Stderr, "chaos: %d runs, fault rate %.2f, %d at once, seed %d\n", cfg.runs, cfg.rate, cfg.concurrency, cfg.seed)
	began := time.Now()
	outcomes := runAll(ctx, s.Client, cfg)
	wall := time.Since(began)

	r, err := analyse(ctx, s, proxy, outcomes)
	if err != nil {
		return 0, err
	}
	r.wall = wall
	r.print(os.Stdout, cfg)
	if r.failed() {
		return 1, nil
	}
	return 0, nil
}

// outcome is what became of one run.
type outcome struct {
	marker   string
	expected string // the command's stdout
	run      client.WorkflowRun
	result   workflows.Result
	err      error
}

// runAll runs cfg.runs workflows, cfg.concurrency at a time.
func runAll(ctx context.Context, c client.Client, cfg config) []*outcome {
	outcomes := make([]*outcome, cfg.runs)
	slots := make(chan struct{}, cfg.concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for i := range outcomes {
		slots <- struct{}{}
		o := &outcome{marker: "RAN-" + rand.Text()[:16]}
		outcomes[i] = o
		wg.Go(func() {
			defer func() { <-slots }()
			runOne(ctx, c, cfg, i, o)
			mu.Lock()
			done++
			if done%max(cfg.runs/10, 1) == 0 {
				fmt.Fprintf(os.Stderr, "chaos: %d/%d runs ended\n", done, cfg.runs)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return outcomes
}

// runOne starts a workflow and waits for its end.
func runOne(ctx context.Context, c client.Client, cfg config, i int, o *outcome) {
	var want strings.Builder
	want.WriteString(o.marker + "\n")
	for line := 1; line <= 5; line++ {
		fmt.Fprintf(&want, "line %d\n", line)
	}
	o.expected = want.String()
	script := "echo " + o.marker + "; for i in 1 2 3 4 5; do echo line $i; sleep 0.02; done; echo to stderr >&2"
	req := workflows.Request{
		Command:         sandbox.Command{Argv: []string{"sh", "-c", script}},
		ActivityOptions: fastActivities(),
	}
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       fmt.Sprintf("chaos-%d-%s", i, o.marker),
		TaskQueue:                workflows.DefaultTaskQueue,
		WorkflowExecutionTimeout: cfg.runTimeout,
	}, workflows.WorkflowName, req)
	if err != nil {
		o.err = err
		return
	}
	o.run = run
	_, o.err = runresult.Get(ctx, c, run, &o.result)
}

// fastActivities keeps the documented retry counts with short intervals,
// so that a soak of hundreds of runs takes minutes.
func fastActivities() *workflows.ActivityOverrides {
	retry := func(attempts int32) *temporal.RetryPolicy {
		return &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 2 * time.Second, MaximumAttempts: attempts}
	}
	lease := &workflows.ActivityOptions{StartToCloseTimeout: 2 * time.Minute, HeartbeatTimeout: 20 * time.Second, RetryPolicy: retry(5)}
	return &workflows.ActivityOverrides{
		CreateLease:       lease,
		AcquireFreshLease: lease,
		Execute:           &workflows.ActivityOptions{StartToCloseTimeout: 3 * time.Minute, HeartbeatTimeout: 20 * time.Second, RetryPolicy: retry(4)},
		DestroyLease:      &workflows.ActivityOptions{StartToCloseTimeout: time.Minute, HeartbeatTimeout: 20 * time.Second, RetryPolicy: retry(0)},
	}
}
