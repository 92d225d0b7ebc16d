// Command bench measures sandboxflow on this machine and prints a markdown
// table in which every figure stands beside a floor measured in the same
// run (see package devserver/bench). `make bench` runs it:
//
//	cd devserver && go run ./cmd/bench [flags]
//
// It boots the dev stack in this process (embedded Temporal server, local
// sandbox server, worker), builds the worker binary for the memory rows,
// and runs the library's testing.B benchmarks with `go test -bench`.
// Progress goes to stderr, the table to stdout. The P6 rows need bwrap
// (Debian's bubblewrap, which `make bench` installs), the P7 row root and
// slirp4netns (also installed by `make bench`): without them the program
// stops before measuring anything.
//
// Flags:
//
//	-quick            fewer, shorter runs (under a minute once built): for trying things out
//	-only LIST        comma-separated parts to run: p0,p1,p2,p3,p4,p5,p6,p7,live,ab,micro (default all)
//	-cost-runs N      P0 cost: runs counted of each path (default 5)
//	-runs N           P1, P5, P6 latency: rounds of each path (default 30)
//	-live-runs N      live output: runs of each path, 10 lines each (default 5)
//	-duration D       P2 throughput: time per concurrency and path (default 5s)
//	-concurrency L    P2 throughput: concurrencies (default 1,10,50)
//	-stream-mib N     P3 streaming: MiB of stdout (default 256)
//	-stream-runs N    P3 streaming: runs of each path (default 3)
//	-rss-mib L        P3 memory: MiB of stdout per worker process (default 1,64,256)
//	-recovery-runs N  P4 recovery: runs of each kind (default 5)
//	-fork-runs N      P6 fork: forks of a 100 MiB lease, and host copies (default 5)
//	-egress-runs N    P7 egress: 64 MiB transfers of each path (default 3)
//	-benchtime D      testing.B benchmarks: -benchtime (default 500ms)
//	-profile DIR      write CPU and allocation profiles of each part into DIR
//	-out FILE         also write the table to FILE
//
// It exits 1 if a part could not be measured (a run failed, say); a
// target that is not met is a result, reported in the table.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"google.golang.org/grpc"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/bench"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// Task queues of the workers in this process.
const (
	// benchQueue: the worker under test, with RunCommand and the no-op
	// workflow, straight to the sandbox server.
	benchQueue = "sandboxflow-bench"
	// recoveryQueue: the stack's own worker, which reaches the sandbox
	// server through a fault proxy (P4).
	recoveryQueue = "sandboxflow-bench-recovery"
)

// allParts are the parts of the table, in its order.
var allParts = []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "live", "ab", "micro"}

type config struct {
	parts        map[string]bool
	costRuns     int
	runs         int
	liveRuns     int
	duration     time.Duration
	concurrency  []int
	streamMiB    int
	streamRuns   int
	rssMiB       []int
	recoveryRuns int
	forkRuns     int
	egressRuns   int
	benchtime    string
	profile      string
	out          string
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, cfg))
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "fewer, shorter runs")
	only := fs.String("only", strings.Join(allParts, ","), "parts to run")
	cfg := config{}
	fs.IntVar(&cfg.costRuns, "cost-runs", 5, "P0: runs counted")
	fs.IntVar(&cfg.runs, "runs", 30, "P1: rounds")
	fs.IntVar(&cfg.liveRuns, "live-runs", 5, "live output: runs of each path")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "P2: time per concurrency and path")
	concurrency := fs.String("concurrency", "1,10,50", "P2: concurrencies")
	fs.IntVar(&cfg.streamMiB, "stream-mib", 256, "P3: MiB of stdout")
	fs.IntVar(&cfg.streamRuns, "stream-runs", 3, "P3: runs of each path")
	rss := fs.String("rss-mib", "1,64,256", "P3 memory: MiB of stdout per worker process")
	fs.IntVar(&cfg.recoveryRuns, "recovery-runs", 5, "P4: runs of each kind")
	fs.IntVar(&cfg.forkRuns, "fork-runs", 5, "P6: forks of a 100 MiB lease, and host copies")
	fs.IntVar(&cfg.egressRuns, "egress-runs", 3, "P7: 64 MiB transfers of each path")
	fs.StringVar(&cfg.benchtime, "benchtime", "500ms", "testing.B benchmarks: -benchtime")
	fs.StringVar(&cfg.profile, "profile", "", "write CPU and allocation profiles of each part into this directory")
	fs.StringVar(&cfg.out, "out", "", "also write the table to this file")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *quick {
		// Only what was not set explicitly.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["runs"] {
			cfg.runs = 8
		}
		if !set["live-runs"] {
			cfg.liveRuns = 2
		}
		if !set["duration"] {
			cfg.duration = 2 * time.Second
		}
		if !set["stream-runs"] {
			cfg.streamRuns = 1
		}
		if !set["recovery-runs"] {
			cfg.recoveryRuns = 2
		}
		if !set["fork-runs"] {
			cfg.forkRuns = 2
		}
		if !set["egress-runs"] {
			cfg.egressRuns = 1
		}
		if !set["benchtime"] {
			cfg.benchtime = "100ms"
		}
	}
	cfg.parts = map[string]bool{}
	for _, p := range strings.Split(*only, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(allParts, p) {
			return cfg, fmt.Errorf("-only: unknown part %q (want some of %s)", p, strings.Join(allParts, ", "))
		}
		cfg.parts[p] = true
	}
	var err error
	if cfg.concurrency, err = intList(*concurrency); err != nil {
		return cfg, fmt.Errorf("-concurrency: %w", err)
	}
	if cfg.rssMiB, err = intList(*rss); err != nil {
		return cfg, fmt.Errorf("-rss-mib: %w", err)
	}
	slices.Sort(cfg.rssMiB)
	if cfg.costRuns < 1 || cfg.runs < 1 || cfg.liveRuns < 1 || cfg.streamRuns < 1 || cfg.recoveryRuns < 1 || cfg.forkRuns < 1 || cfg.egressRuns < 1 || cfg.streamMiB < 1 || cfg.duration <= 0 {
		return cfg, errors.New("counts, sizes and durations must be positive")
	}
	return cfg, nil
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// run measures the parts of cfg and prints the table. It returns the exit
// code.
func run(ctx context.Context, cfg config) int {
	began := time.Now()
	report := bench.Report{Machine: bench.DescribeMachine(), Date: began}
	report.Machine.LoadBefore = bench.LoadAverage()
	var profiler *bench.Profiler
	if cfg.profile != "" {
		profiler = &bench.Profiler{Dir: cfg.profile}
	}
	failed := false
	rows := map[string][]bench.Row{}
	// part runs one part, profiled; a failure is noted and the other parts
	// still run.
	part := func(name string, measure func() ([]bench.Row, error)) {
		if !cfg.parts[name] || ctx.Err() != nil {
			return
		}
		logf("%s…", name)
		stop, err := profiler.Phase(name)
		if err != nil {
			logf("profile: %v", err)
			stop = func() error { return nil }
		}
		measured, err := measure()
		if perr := stop(); perr != nil {
			logf("profile: %v", perr)
		}
		if err != nil {
			failed = true
			logf("%s failed: %v", name, err)
			report.Notes = append(report.Notes, fmt.Sprintf("%s could not be measured: %v", name, err))
		}
		rows[name] = measured
	}

	// Before anything is measured, not after minutes of it.
	if cfg.parts["p6"] {
		if err := bench.CheckBwrap(); err != nil {
			logf("%v", err)
			return 1
		}
	}
	if cfg.parts["p7"] {
		if err := bench.CheckEgressPath(); err != nil {
			logf("%v", err)
			return 1
		}
	}
	moduleDir, err := libraryModuleDir(ctx)
	if err != nil {
		logf("%v", err)
		return 1
	}
	// The micro-benchmarks first: `go test` compiles, and the stack is not
	// up yet to be disturbed by it.
	part("micro", func() ([]bench.Row, error) { return bench.MicroBenchmarks(ctx, moduleDir, cfg.benchtime) })
	// P7 runs in a server of its own, made by the benchmark.
	part("p7", func() ([]bench.Row, error) { return bench.EgressThroughput(ctx, moduleDir, cfg.egressRuns) })

	if slices.ContainsFunc([]string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "live", "ab"}, func(p string) bool { return cfg.parts[p] }) {
		if err := withStack(ctx, func(s *stack.Stack, e *bench.Env) {
			defer func() {
				if n := e.LostWakeups(); n > 0 {
					report.Notes = append(report.Notes, fmt.Sprintf("The Temporal server lost the close notification of %d run(s): "+
						"a plain Get would have waited for its 20 s long poll to expire; they were read at most 1 s late (see bench.Env.result).", n))
				}
			}()
			part("p0", func() ([]bench.Row, error) { return bench.Cost(ctx, e, cfg.costRuns) })
			part("p1", func() ([]bench.Row, error) { return bench.Latency(ctx, e, cfg.runs) })
			part("p2", func() ([]bench.Row, error) { return bench.Throughput(ctx, e, cfg.concurrency, cfg.duration) })
			part("p3", func() ([]bench.Row, error) {
				rows, err := bench.Streaming(ctx, e, int64(cfg.streamMiB)*bench.MiB, cfg.streamRuns)
				if err != nil {
					return rows, err
				}
				rss, err := workerRSS(ctx, e, s, moduleDir, cfg.rssMiB)
				return append(rows, rss...), err
			})
			part("p4", func() ([]bench.Row, error) {
				logf("P4 loses process-create responses on purpose: the worker logs an activity error for each")
				return bench.Recovery(ctx, e, recoveryQueue, s.Proxy, cfg.recoveryRuns)
			})
			part("p5", func() ([]bench.Row, error) { return bench.SessionLatency(ctx, e, cfg.runs) })
			part("p6", func() ([]bench.Row, error) {
				api := bench.SandboxAPI{URL: s.SandboxURL, Key: s.SandboxAPIKey}
				return bench.LeaseMachine(ctx, e, api, cfg.runs, cfg.forkRuns)
			})
			part("live", func() ([]bench.Row, error) { return bench.LiveOutput(ctx, e, s.ClientOptions(), cfg.liveRuns) })
			part("ab", func() ([]bench.Row, error) {
				variants, stop, err := tuningVariants(ctx, s, e.Provider)
				defer stop()
				if err != nil {
					return nil, err
				}
				return bench.Tuning(ctx, variants, cfg.runs)
			})
		}); err != nil {
			logf("%v", err)
			return 1
		}
	}

	for _, name := range allParts {
		report.Rows = append(report.Rows, rows[name]...)
	}
	report.Machine.LoadAfter = bench.LoadAverage()
	report.Duration = time.Since(began)
	table := report.Markdown()
	fmt.Print(table)
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(table), 0o644); err != nil {
			logf("%v", err)
			return 1
		}
	}
	if failed || ctx.Err() != nil {
		return 1
	}
	return 0
}

// withStack boots the dev stack for the benchmarks, runs f and stops it.
// The stack's own worker polls recoveryQueue through a fault proxy; a
// second worker, built exactly as the stack builds its own but on a client
// of its own, polls benchQueue with the no-op workflow registered beside
// RunCommand. The Env's tallies count that client's RPCs and the sandbox
// requests of that worker and of the direct provider.
func withStack(ctx context.Context, f func(*stack.Stack, *bench.Env)) error {
	root, err := os.MkdirTemp("", "sandboxflow-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	s, err := stack.Start(ctx, stack.Options{
		Temporal:   temporalserver.Options{UIPort: temporalserver.NoUI},
		Sandbox:    localsandbox.Options{Root: root},
		Worker:     workerapp.Config{TaskQueue: recoveryQueue},
		FaultProxy: true,
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return fmt.Errorf("start the stack: %w", err)
	}
	defer s.Stop()
	if p := os.Getenv(localsandbox.InitProgramEnv); p != "" {
		fmt.Fprintf(os.Stderr, "bench: leases and managed processes run the init program %s\n", p)
	} else {
		fmt.Fprintf(os.Stderr, "bench: leases and managed processes re-execute this binary: $%s is not set (make bench sets it)\n", localsandbox.InitProgramEnv)
	}
	tallies := struct{ temporal, sandbox, direct bench.Tally }{}
	opts := s.ClientOptions()
	opts.ConnectionOptions.DialOptions = append(opts.ConnectionOptions.DialOptions,
		grpc.WithChainUnaryInterceptor(tallies.temporal.Interceptor()))
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return fmt.Errorf("connect to the stack's Temporal server: %w", err)
	}
	defer c.Close()
	counted := func(t *bench.Tally) createos.Config {
		return createos.Config{BaseURL: s.SandboxURL, APIKey: s.SandboxAPIKey,
			HTTPClient: &http.Client{Transport: t.Transport(http.DefaultTransport)}}
	}
	w, err := workerapp.New(c, workerapp.Config{TaskQueue: benchQueue, Sandbox: counted(&tallies.sandbox)})
	if err != nil {
		return err
	}
	bench.RegisterNoop(w)
	if err := w.Start(); err != nil {
		return fmt.Errorf("start the worker: %w", err)
	}
	defer w.Stop()
	provider, err := createos.New(counted(&tallies.direct))
	if err != nil {
		return err
	}
	e := bench.NewEnv(c, benchQueue, provider, logf)
	e.Temporal, e.Sandbox, e.Direct = &tallies.temporal, &tallies.sandbox, &tallies.direct
	e.EagerStart = true // as `devserver run` starts its runs
	f(s, e)
	return nil
}

// A tuning is one configuration of the Temporal client and worker that
// the A/B part compares.
type tuning struct {
	name string
	// gzip: the client compresses its requests (the SDK's default).
	gzip bool
	// eagerStart: workflows start with their first task in the answer.
	eagerStart bool
	// eagerActivities: the worker asks for its activities in the answer
	// to the workflow task that schedules them (the SDK's default).
	eagerActivities bool
	// searchAttributes: runs start with RunCommand's search attributes,
	// as the starter's do.
	searchAttributes bool
}

// tunings are the A/B part's variants; the first is the project as it
// was before it was tuned.
var tunings = []tuning{
	{name: "as before (gzip, eager activities)", gzip: true, eagerActivities: true},
	{name: "no gRPC compression", eagerActivities: true},
	{name: "no gRPC compression, eager start", eagerStart: true, eagerActivities: true},
	{name: "no gRPC compression, eager start, no eager activities", eagerStart: true},
	{name: "no gRPC compression, eager start, search attributes", eagerStart: true, eagerActivities: true, searchAttributes: true},
}

// tuningVariants starts, for each tuning, a client and a worker of its
// own on a task queue of its own. stop stops them all.
func tuningVariants(ctx context.Context, s *stack.Stack, provider *createos.Client) (_ []bench.Variant, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	var variants []bench.Variant
	for i, t := range tunings {
		opts := s.ClientOptions()
		opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
		if t.gzip {
			opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionGzip{}
		}
		c, err := client.DialContext(ctx, opts)
		if err != nil {
			return nil, stop, err
		}
		stops = append(stops, c.Close)
		queue := fmt.Sprintf("%s-ab-%d", benchQueue, i)
		w, err := workerapp.New(c, workerapp.Config{
			TaskQueue: queue,
			Sandbox:   createos.Config{BaseURL: s.SandboxURL, APIKey: s.SandboxAPIKey},
			Options:   worker.Options{DisableEagerActivities: !t.eagerActivities},
		})
		if err != nil {
			return nil, stop, err
		}
		bench.RegisterNoop(w)
		if err := w.Start(); err != nil {
			return nil, stop, err
		}
		stops = append(stops, w.Stop)
		e := bench.NewEnv(c, queue, provider, logf)
		e.EagerStart, e.SearchAttributes = t.eagerStart, t.searchAttributes
		variants = append(variants, bench.Variant{Name: t.name, Env: e})
	}
	return variants, stop, nil
}

// workerRSS builds the worker binary and measures its memory.
func workerRSS(ctx context.Context, env *bench.Env, s *stack.Stack, moduleDir string, mib []int) ([]bench.Row, error) {
	dir, err := os.MkdirTemp("", "sandboxflow-bench-worker-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "worker")
	logf("building ./cmd/worker…")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/worker")
	build.Dir = moduleDir
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/worker: %w\n%s", err, out)
	}
	sizes := make([]int64, len(mib))
	for i, m := range mib {
		sizes[i] = int64(m) * bench.MiB
	}
	return bench.WorkerRSS(ctx, env, bench.WorkerProcess{
		Binary:          bin,
		TemporalAddress: s.Temporal.FrontendHostPort(),
		Namespace:       s.Temporal.Namespace(),
		SandboxURL:      s.SandboxURL,
		SandboxAPIKey:   s.SandboxAPIKey,
	}, sizes)
}

// libraryModuleDir is the directory of the library module (the root of
// the repository), where the worker and the testing.B benchmarks live.
func libraryModuleDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/sandboxflow/sandboxflow").Output()
	if err != nil {
		return "", fmt.Errorf("find the library module (run from the devserver module): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
