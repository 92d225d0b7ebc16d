// Command devserver runs the whole sandboxflow stack in one process: an
// embedded Temporal server (SQLite) with its Web UI, the local sandbox
// server and a worker.
//
//	devserver dev [flags]                       everything up until Ctrl-C
//	devserver run [flags] [starter flags] -- cmd [args...]
//	                                            boot, run one command exactly as
//	                                            the starter does, print the Web UI
//	                                            link to the run
//
// Flags (both subcommands):
//
//	--ip 127.0.0.1        address of the Temporal frontend and Web UI
//	--port 7233           Temporal frontend port
//	--ui-port 8233        Web UI port (-1: no UI)
//	--db FILE             keep workflows in this SQLite file (default: in memory)
//	--namespace default
//	--sandbox-port 7575   port of the in-process sandbox server (always on loopback)
//	--sandbox-url URL     use this sandbox server instead (key: --sandbox-api-key
//	                      or SANDBOX_API_KEY)
//	--log-level LEVEL     default info for dev, warn for run
//	--encrypt             encrypt every payload (see package codec): with the key
//	                      ring of SANDBOXFLOW_CODEC_KEYS or SANDBOXFLOW_CODEC_KEYS_FILE,
//	                      else a fresh one that lives as long as the process. Either
//	                      variable alone turns encryption on too. The Web UI decodes
//	                      through the stack's codec server.
//	--metrics-listen ADDR serve the worker's Prometheus metrics at ADDR/metrics
//	                      (default: none)
//
// dev only: --no-worker. run only: --linger (keep serving the Web UI after the
// run until Ctrl-C; the default when stderr is a terminal).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/starter"
	"github.com/sandboxflow/sandboxflow/workflows"
)

const usage = `usage:
  devserver dev [flags]
  devserver run [flags] [starter flags] -- cmd [args...]`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(starter.ExitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var code int
	switch os.Args[1] {
	case "dev":
		code = dev(ctx, os.Args[2:])
	case "run":
		code = run(ctx, stop, os.Args[2:])
	case "-h", "--help", "help":
		fmt.Println(usage)
	default:
		fmt.Fprintf(os.Stderr, "devserver: unknown subcommand %q\n%s\n", os.Args[1], usage)
		code = starter.ExitUsage
	}
	os.Exit(code)
}

// serverFlags are the flags of both subcommands.
type serverFlags struct {
	opts     stack.Options
	logLevel string
	encrypt  bool
}

func newFlagSet(name, defaultLogLevel string) (*flag.FlagSet, *serverFlags) {
	fs := flag.NewFlagSet("devserver "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := &serverFlags{opts: stack.Options{Temporal: temporalserver.DefaultOptions(), SandboxPort: stack.DefaultSandboxPort}}
	t := &f.opts.Temporal
	fs.StringVar(&t.IP, "ip", t.IP, "address of the Temporal frontend and Web UI")
	fs.IntVar(&t.FrontendPort, "port", t.FrontendPort, "Temporal frontend port")
	fs.IntVar(&t.UIPort, "ui-port", t.UIPort, "Web UI port (-1: no UI)")
	fs.StringVar(&t.DBFile, "db", "", "SQLite file to keep workflows in (default: in memory)")
	fs.StringVar(&t.Namespace, "namespace", t.Namespace, "Temporal namespace")
	fs.IntVar(&f.opts.SandboxPort, "sandbox-port", f.opts.SandboxPort, "port of the in-process sandbox server")
	fs.StringVar(&f.opts.SandboxURL, "sandbox-url", "", "use this sandbox server instead of the in-process one")
	fs.StringVar(&f.opts.SandboxAPIKey, "sandbox-api-key", os.Getenv("SANDBOX_API_KEY"), "API key of --sandbox-url (default: SANDBOX_API_KEY)")
	fs.StringVar(&f.opts.Worker.TaskQueue, "task-queue", workflows.DefaultTaskQueue, "task queue of the worker")
	fs.StringVar(&f.logLevel, "log-level", defaultLogLevel, "debug, info, warn or error")
	fs.BoolVar(&f.encrypt, "encrypt", false, "encrypt every payload (keys: SANDBOXFLOW_CODEC_KEYS[_FILE], else a fresh dev ring)")
	fs.StringVar(&f.opts.Worker.MetricsListen, "metrics-listen", "", "serve the worker's Prometheus metrics on this address at /metrics")
	return fs, f
}

// devKeyID names the key ring that --encrypt makes when the environment
// has none: the time tells an operator which run's histories it encrypted.
func devKeyID(now time.Time) string { return "dev-" + now.UTC().Format("20060102T150405Z") }

// loadCodec returns the stack's key ring: the environment's (encryption
// on whenever it has one, as for the worker and the starter), else with
// --encrypt a fresh one, else none.
func loadCodec(encrypt bool, getenv func(string) string, now time.Time) (keys *codec.Keys, generated bool, err error) {
	keys, err = codec.LoadKeys(getenv)
	if err != nil || keys != nil || !encrypt {
		return keys, false, err
	}
	keys, err = codec.GenerateKeys(devKeyID(now))
	return keys, err == nil, err
}

// boot starts the stack, or explains in one line why it cannot.
func (f *serverFlags) boot(ctx context.Context) (*stack.Stack, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %v", err)
	}
	f.opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	keys, generated, err := loadCodec(f.encrypt, os.Getenv, time.Now())
	if err != nil {
		return nil, err
	}
	if generated && f.opts.Temporal.DBFile != "" {
		f.opts.Logger.Warn("payloads are encrypted with a key ring that ends with this process: the next run cannot read these histories; set SANDBOXFLOW_CODEC_KEYS to keep them readable",
			"keyId", keys.Current(), "db", f.opts.Temporal.DBFile)
	}
	f.opts.Codec = keys
	return stack.Start(ctx, f.opts)
}

func dev(ctx context.Context, args []string) int {
	fs, f := newFlagSet("dev", "info")
	fs.BoolVar(&f.opts.NoWorker, "no-worker", false, "start no worker (run your own)")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(os.Stderr, "devserver dev: %v\n%s\n", err, usage)
		return starter.ExitUsage
	}
	s, err := f.boot(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "devserver: %v\n", err)
		return starter.ExitRunFailed
	}
	fmt.Printf("Temporal:  %s (namespace %s)\n", s.Temporal.FrontendHostPort(), s.Temporal.Namespace())
	if ui := s.Temporal.UIURL(); ui != "" {
		fmt.Printf("Web UI:    %s\n", ui)
	}
	fmt.Printf("Sandbox:   %s", s.SandboxURL)
	if s.Sandbox != nil {
		fmt.Printf(" (in-process, isolation %s; API key %s)", s.Sandbox.Isolation(), s.SandboxAPIKey)
	}
	fmt.Println()
	if s.Worker != nil {
		fmt.Printf("Worker:    task queue %s\n", f.opts.Worker.TaskQueue)
	}
	if s.CodecURL != "" {
		fmt.Printf("Codec:     %s (payloads encrypted, key id %s; the Web UI decodes through it)\n", s.CodecURL, f.opts.Codec.Current())
	}
	if s.MetricsURL != "" {
		fmt.Printf("Metrics:   %s\n", s.MetricsURL)
	}
	fmt.Println("Ctrl-C stops everything.")
	<-ctx.Done()
	if err := s.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "devserver: stop: %v\n", err)
		return 1
	}
	return 0
}

func run(ctx context.Context, stopSignals context.CancelFunc, args []string) int {
	fs, f := newFlagSet("run", "warn")
	linger := fs.Bool("linger", starter.IsTerminal(os.Stderr), "keep serving the Web UI after the run until Ctrl-C")
	ours, starterArgs := splitArgs(args, fs)
	if err := fs.Parse(ours); err != nil {
		fmt.Fprintf(os.Stderr, "devserver run: %v\n%s\n", err, usage)
		return starter.ExitUsage
	}
	s, err := f.boot(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "devserver: %v\n", err)
		return starter.ExitRunFailed
	}
	defer s.Stop()

	var runURL string
	started := func(workflowID, runID string) { runURL = s.Temporal.RunURL(workflowID, runID) }
	// The starter handles Ctrl-C itself (it cancels the run); ours would
	// stop the stack under it.
	stopSignals()
	stdio := starter.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Progress: starter.IsTerminal(os.Stderr)}
	// The stack's options: with --encrypt, the starter encrypts the command
	// and decrypts its result as the worker does.
	code := starter.Main(context.Background(), starterArgs, stdio, s.ClientOptions(), started)
	if runURL == "" {
		return code
	}
	if !*linger {
		fmt.Fprintf(os.Stderr, "Web UI: %s\n", runURL)
		return code
	}
	fmt.Fprintf(os.Stderr, "Web UI: %s (served until Ctrl-C)\n", runURL)
	wait, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	<-wait.Done()
	return code
}

// splitArgs separates devserver's flags (those fs defines) from the
// starter's: everything from `--` on, and every flag fs does not know, go
// to the starter. --task-queue goes to both: the worker polls the queue the
// run is started on.
func splitArgs(args []string, fs *flag.FlagSet) (ours, theirs []string) {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return ours, append(theirs, args[i:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		f := fs.Lookup(name)
		if !strings.HasPrefix(arg, "-") || f == nil {
			theirs = append(theirs, arg)
			continue
		}
		taken := []string{arg}
		if isBool, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && isBool.IsBoolFlag()) && i+1 < len(args) {
			i++
			taken = append(taken, args[i])
		}
		ours = append(ours, taken...)
		if name == "task-queue" {
			theirs = append(theirs, taken...)
		}
	}
	return ours, theirs
}
