// Command chaos is a soak test of sandboxflow under random faults: it boots
// the development stack (embedded Temporal, the local sandbox server, a
// worker), puts a faultproxy.Proxy between the worker and the sandbox
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
// With -hosts N it soaks a fleet instead (stack.Host): N sandbox hosts on
// one Temporal server, each a sandbox server of its own behind a fault
// proxy of its own, and a worker in host mode; with -kill-every D, one
// host at a time is killed D after the last one came back (cut off, its
// server keeping what it holds), and stays down until the runs on it have
// lost it (hostDown), so that they compensate on the other hosts:
//
//	cd devserver && go run ./cmd/chaos -hosts 3 -kill-every 30s -runs 300 -fault-rate 0.1
//
// The exit status is 1 when a lease or a process leaked (on any host,
// once every host is back and has swept), when a run's result was lost (it
// neither completed nor failed with an error of the taxonomy), or when a
// run that completed returned the wrong output.
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
	hosts := flag.Int("hosts", 0, "soak a fleet of this many sandbox hosts (0: one sandbox server and a plain worker)")
	capacity := flag.Int("host-capacity", 0, "with -hosts: the leases each host holds at most (0: enough for -concurrency on all but one host)")
	killEvery := flag.Duration("kill-every", 0, "with -hosts: kill a host this long after the last one came back; it stays down until its runs have lost it (0: never)")
	flag.Parse()
	if *runs < 1 || *concurrency < 1 || *rate < 0 || *rate > 1 || *hosts < 0 || (*killEvery > 0 && *hosts < 2) {
		fmt.Fprintln(os.Stderr, "chaos: -runs and -concurrency must be positive, -fault-rate between 0 and 1; -kill-every needs -hosts 2 or more")
		os.Exit(2)
	}
	if *capacity == 0 && *hosts > 1 {
		*capacity = (*concurrency + *hosts - 2) / (*hosts - 1) // one host may be down
	}
	code, err := soak(context.Background(), config{
		runs: *runs, rate: *rate, concurrency: *concurrency, seed: *seed,
		runTimeout: *runTimeout, verbose: *verbose,
		hosts: *hosts, capacity: max(*capacity, 1), killEvery: *killEvery,
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
	// hosts > 0 soaks a fleet (fleet.go).
	hosts, capacity int
	killEvery       time.Duration
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

	sandboxOpts := localsandbox.Options{
		Root:        root,
		HistorySize: 100 * cfg.runs, // every process of every run, to count the runs
	}
	workerCfg := workerapp.Config{
		Sandbox:           createos.Config{OperationTimeout: operationTimeout},
		HeartbeatInterval: time.Second,
	}
	var w *world
	if cfg.hosts > 0 {
		w, err = startFleet(ctx, cfg, sandboxOpts, workerCfg, logger)
	} else {
		w, err = startStack(ctx, cfg, sandboxOpts, workerCfg, logger)
	}
	if err != nil {
		return 0, err
	}
	defer w.stack.Stop()
	for _, proxy := range w.proxies {
		addFaults(proxy, faultKinds(4*operationTimeout), cfg.rate)
	}

	fmt.Fprintf(os.Stderr, "chaos: %d runs, fault rate %.2f, %d at once, seed %d%s\n", cfg.runs, cfg.rate, cfg.concurrency, cfg.seed, w.describe(cfg))
	began := time.Now()
	stopKilling := w.killHosts(cfg)
	outcomes := runAll(ctx, w.stack.Client, cfg)
	if err := stopKilling(ctx); err != nil {
		return 0, err
	}
	wall := time.Since(began)

	r, err := analyse(ctx, w, outcomes)
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
		ActivityOptions: fastActivities(cfg.hosts > 0),
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

// On a fleet, a host that takes no work on its leases for hostStart counts
// as lost, and so does a command whose worker misses its heartbeats for
// hostHeartbeat: a run finds its host lost within their sum.
const (
	hostStart     = 10 * time.Second
	hostHeartbeat = 10 * time.Second
)

// fastActivities keeps the documented retry counts with short intervals,
// so that a soak of hundreds of runs takes minutes; on a fleet, a run
// finds its host lost within hostStart + hostHeartbeat.
func fastActivities(fleet bool) *workflows.ActivityOverrides {
	retry := func(attempts int32) *temporal.RetryPolicy {
		return &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 2 * time.Second, MaximumAttempts: attempts}
	}
	var onHostStart time.Duration
	executeHeartbeat := 20 * time.Second
	if fleet {
		onHostStart, executeHeartbeat = hostStart, hostHeartbeat
	}
	lease := &workflows.ActivityOptions{StartToCloseTimeout: 2 * time.Minute, HeartbeatTimeout: 20 * time.Second, RetryPolicy: retry(5)}
	return &workflows.ActivityOverrides{
		CreateLease:       lease,
		AcquireFreshLease: lease,
		Execute:           &workflows.ActivityOptions{StartToCloseTimeout: 3 * time.Minute, HeartbeatTimeout: executeHeartbeat, RetryPolicy: retry(4), ScheduleToStartTimeout: onHostStart},
		DestroyLease:      &workflows.ActivityOptions{StartToCloseTimeout: time.Minute, HeartbeatTimeout: 20 * time.Second, RetryPolicy: retry(0), ScheduleToStartTimeout: onHostStart},
	}
}
