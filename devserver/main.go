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
//	                      through the stack's codec server. The worker then refuses
//	                      workflow and Update input that arrived unencrypted, unless
//	                      --allow-plaintext-input (SANDBOXFLOW_ALLOW_PLAINTEXT=1).
//	--metrics-listen ADDR serve the worker's Prometheus metrics at ADDR/metrics
//	                      (default: none)
//	--egress off          the leases' outward network (the in-process sandbox
//	                      server's policy): off (loopback only), allowlist (only
//	                      the run's egress rules) or any; other than off needs
//	                      root and slirp4netns
//
// dev only: --no-worker (start neither a worker nor a sandbox server: run
// your own). run only: --linger (keep serving the Web UI after the run until
// Ctrl-C; the default when stderr is a terminal) and --verbose (print the
// log file's path and the stack's warnings). For run, --egress with a
// policy (off, allowlist, any) is the stack's; --egress with anything else
// is a rule of the run's lease, the starter's flag:
//
//	devserver run --egress any -- python3 -c '…urlopen("http://192.0.2.2:8000")…'
//	devserver run --egress allowlist --egress pypi.org:443 -- pip download six
//
//	devserver shell [--sandbox-url URL] [--sandbox-api-key KEY] [--lease ID] [-- cmd [args...]]
//	                                            a terminal in a lease of a running
//	                                            `devserver dev`'s sandbox server: the
//	                                            image's shell (or cmd) with this
//	                                            terminal raw, its exit code ours
//
// `devserver dev --help`, `devserver run --help` and
// `devserver shell --help` list every flag with its default.
//
// Each stack has its own directory, so stacks on different ports run side
// by side: $TMPDIR/sandboxflow-<uid>/stack-<ip>-<port> holds the sandbox
// server's root and stack.log, where the embedded Temporal server logs (and,
// for run, every part: a run prints the command's output, its result and the
// Web UI link, and nothing else). dev prints the path; a stack that fails
// to start prints its one error, then the path.
package main

import (
	"context"
	"errors"
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
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
	"golang.org/x/term"
)

const (
	devUsage = "devserver dev [flags]"
	runUsage = "devserver run [flags] [starter flags] -- cmd [args...]"
	usage    = "usage:\n  " + devUsage + "   the whole stack until Ctrl-C\n  " + runUsage +
		"\n      boot the stack, run one command as the starter does, print its Web UI link\n  " + shellUsage +
		"\n      a terminal in a lease of the dev stack's sandbox server\n" +
		"`devserver dev --help`, `devserver run --help`, `devserver shell --help`: their flags"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(starterapp.ExitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var code int
	switch os.Args[1] {
	case "dev":
		code = dev(ctx, os.Args[2:])
	case "run":
		code = run(ctx, stop, os.Args[2:])
	case "shell":
		// A terminal in raw mode sends Ctrl-C to the lease as a key. A
		// SIGINT that comes all the same (stdin not a terminal, kill -INT)
		// ends the shell as SIGTERM and SIGHUP do: with its lease destroyed.
		stop()
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
		code = shell(ctx, os.Args[2:])
		stop()
	case "-h", "--help", "help":
		fmt.Println(usage)
	default:
		fmt.Fprintf(os.Stderr, "devserver: unknown subcommand %q\n%s\n", os.Args[1], usage)
		code = starterapp.ExitUsage
	}
	os.Exit(code)
}

// serverFlags are the flags of both subcommands.
type serverFlags struct {
	opts     stack.Options
	logLevel string
	encrypt  bool
}

// isTerminal reports whether f is a terminal: not merely a character
// device, which /dev/null is too.
func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// parseFlags parses a subcommand's args into fs. Unless ok, the
// subcommand ends with code: 0 after --help, which prints its usage line,
// its flags and more's text (more may be nil), or ExitUsage after a bad
// flag, which prints the error and the usage of every subcommand.
func parseFlags(fs *flag.FlagSet, args []string, usageLine string, more func()) (code int, ok bool) {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printHelp(os.Stdout, usageLine, fs)
		if more != nil {
			more()
		}
		return 0, false
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: %v\n%s\n", fs.Name(), err, usage)
		return starterapp.ExitUsage, false
	}
	return 0, true
}

// printHelp writes a subcommand's usage and flags with their defaults.
func printHelp(w io.Writer, usage string, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\nflags:\n", usage)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
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
	fs.BoolVar(&f.opts.Worker.AllowPlaintextInput, "allow-plaintext-input", os.Getenv(codec.EnvAllowPlaintext) == "1",
		"with --encrypt, let the worker take workflow and Update input that arrived unencrypted ("+codec.EnvAllowPlaintext+"=1)")
	fs.StringVar(&f.opts.Worker.MetricsListen, "metrics-listen", "", "serve the worker's Prometheus metrics on this address at /metrics")
	f.opts.Sandbox.Egress = localsandbox.EgressOff
	fs.Var(egressPolicyFlag{&f.opts.Sandbox.Egress}, "egress", "the leases' outward network, a `POLICY`: off (loopback only), allowlist (only the run's egress rules) or any; other than off needs root and slirp4netns")
	fs.Func("egress-allow", "with --egress allowlist: comma-separated `RULES` the run's egress rules must stay within; a run asking for everything gets them (as sandboxd's --egress-allow)", func(v string) error {
		f.opts.Sandbox.EgressAllow = localsandbox.SplitList(v)
		return nil
	})
	return fs, f
}

// egressPolicyFlag is --egress: the in-process sandbox server's policy,
// checked as the flag is parsed.
type egressPolicyFlag struct{ p *localsandbox.EgressPolicy }

func (e egressPolicyFlag) String() string {
	if e.p == nil {
		return ""
	}
	return string(*e.p)
}

func (e egressPolicyFlag) Set(v string) error {
	if !isEgressPolicy(v) {
		return fmt.Errorf("want off, allowlist or any, not %q", v)
	}
	*e.p = localsandbox.EgressPolicy(v)
	return nil
}

// isEgressPolicy reports whether v names a policy, not an egress rule.
func isEgressPolicy(v string) bool {
	switch localsandbox.EgressPolicy(v) {
	case localsandbox.EgressOff, localsandbox.EgressAllowlist, localsandbox.EgressAny:
		return true
	}
	return false
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

// boot starts the stack, logging to its log file and, if toStderr, to
// stderr at --log-level; or it prints in one line why it cannot, then
// where the log is.
func (f *serverFlags) boot(ctx context.Context, toStderr bool) (*stack.Stack, bool) {
	s, err := f.start(ctx, toStderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "devserver: %v\n", err)
		if se := (*stack.StartError)(nil); errors.As(err, &se) {
			fmt.Fprintf(os.Stderr, "devserver: log: %s\n", se.LogPath)
		}
		return nil, false
	}
	return s, true
}

func (f *serverFlags) start(ctx context.Context, toStderr bool) (*stack.Stack, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %v", err)
	}
	f.opts.LogFile = true
	f.opts.LogLevel = min(level, slog.LevelInfo)
	stderr := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if toStderr {
		f.opts.Logger = stderr
	}
	keys, generated, err := loadCodec(f.encrypt, os.Getenv, time.Now())
	if err != nil {
		return nil, err
	}
	if generated && f.opts.Temporal.DBFile != "" {
		stderr.Warn("payloads are encrypted with a key ring that ends with this process: the next run cannot read these histories; set SANDBOXFLOW_CODEC_KEYS to keep them readable",
			"keyId", keys.Current(), "db", f.opts.Temporal.DBFile)
	}
	f.opts.Codec = keys
	return stack.Start(ctx, f.opts)
}

func dev(ctx context.Context, args []string) int {
	fs, f := newFlagSet("dev", "info")
	fs.BoolVar(&f.opts.NoWorker, "no-worker", false, "start neither a worker nor a sandbox server (run your own)")
	if code, ok := parseFlags(fs, args, devUsage, nil); !ok {
		return code
	}
	f.opts.NoSandbox = f.opts.NoWorker
	// The stack's own logs are for the developer watching; the Temporal
	// server's go to the log file only.
	s, ok := f.boot(ctx, true)
	if !ok {
		return starterapp.ExitRunFailed
	}
	fmt.Printf("Temporal:  %s (namespace %s)\n", s.Temporal.FrontendHostPort(), s.Temporal.Namespace())
	if ui := s.Temporal.UIURL(); ui != "" {
		fmt.Printf("Web UI:    %s\n", ui)
	}
	switch {
	case s.Sandbox != nil:
		fmt.Printf("Sandbox:   %s (in-process, isolation %s, egress %s; API key %s)\n", s.SandboxURL, s.Sandbox.Isolation(), f.opts.Sandbox.Egress, s.SandboxAPIKey)
	case s.SandboxURL != "":
		fmt.Printf("Sandbox:   %s\n", s.SandboxURL)
	default:
		fmt.Println("Sandbox:   none (--no-worker: your worker brings its sandbox server)")
	}
	if s.Worker != nil {
		fmt.Printf("Worker:    task queue %s\n", f.opts.Worker.TaskQueue)
	}
	if s.CodecURL != "" {
		fmt.Printf("Codec:     %s (payloads encrypted, key id %s; the Web UI decodes through it)\n", s.CodecURL, f.opts.Codec.Current())
	}
	if s.MetricsURL != "" {
		fmt.Printf("Metrics:   %s\n", s.MetricsURL)
	}
	fmt.Printf("Log:       %s\n", s.LogPath)
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
	linger := fs.Bool("linger", isTerminal(os.Stderr), "keep serving the Web UI after the run until Ctrl-C (default: whether stderr is a terminal)")
	verbose := fs.Bool("verbose", false, "print the log file's path, and the stack's logs at --log-level on stderr")
	ours, starterArgs := splitArgs(args, fs)
	if code, ok := parseFlags(fs, ours, runUsage, func() {
		fmt.Println("\nstarter flags (passed on to the starter):")
		starterapp.PrintFlags(os.Stdout)
		fmt.Println("\n--egress off|allowlist|any sets the stack's policy; --egress with any other value is the\nstarter's, a rule of the run's lease: --egress allowlist --egress pypi.org:443")
	}); !ok {
		return code
	}
	if rule, ok := egressRule(starterArgs); ok && f.opts.SandboxURL == "" && f.opts.Sandbox.Egress == localsandbox.EgressOff {
		// The in-process server would drop the rule without a word.
		fmt.Fprintf(os.Stderr, "devserver run: --egress %s asks for a network, but the stack's egress is off: add --egress allowlist or --egress any\n", rule)
		return starterapp.ExitUsage
	}
	s, ok := f.boot(ctx, *verbose)
	if !ok {
		return starterapp.ExitRunFailed
	}
	defer s.Stop()
	if *verbose {
		fmt.Fprintf(os.Stderr, "devserver: log: %s\n", s.LogPath)
	}

	var runURL string
	started := func(workflowID, runID string) { runURL = s.Temporal.RunURL(workflowID, runID) }
	// The starter handles Ctrl-C itself (it cancels the run); ours would
	// stop the stack under it.
	stopSignals()
	stdio := starterapp.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Progress: isTerminal(os.Stderr)}
	// The stack's client: with --encrypt, the starter encrypts the command
	// and decrypts its result as the worker does, and the run starts
	// eagerly, to the stack's worker on the same client. --wait-release:
	// the stack stops when we return, so the run must have released its
	// lease.
	code := starterapp.MainOn(context.Background(), s.Client, append([]string{"--wait-release"}, starterArgs...), stdio, s.ClientOptions(), started)
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
// run is started on. --egress is ours with a policy (off, allowlist, any)
// and the starter's, an egress rule, with anything else.
func splitArgs(args []string, fs *flag.FlagSet) (ours, theirs []string) {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return ours, append(theirs, args[i:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if name == "h" || name == "help" {
			// Help is for devserver run, which lists the starter's flags too.
			ours = append(ours, arg)
			continue
		}
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
		if name == "egress" && !isEgressPolicy(flagValue(taken)) {
			theirs = append(theirs, taken...)
			continue
		}
		ours = append(ours, taken...)
		if name == "task-queue" {
			theirs = append(theirs, taken...)
		}
	}
	return ours, theirs
}

// egressRule returns the first egress rule among the starter's flags.
func egressRule(starterArgs []string) (string, bool) {
	for i, arg := range starterArgs {
		if arg == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || name != "egress" {
			continue
		}
		if !hasValue && i+1 < len(starterArgs) {
			value = starterArgs[i+1]
		}
		return value, true
	}
	return "", false
}

// flagValue is the value of a flag taken as `--name=value` or `--name value`.
func flagValue(taken []string) string {
	if len(taken) == 2 {
		return taken[1]
	}
	_, v, _ := strings.Cut(taken[0], "=")
	return v
}
