package starterapp

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

const usage = "usage: starter [flags] -- cmd [args...]  (or: starter [flags] --script FILE)"

// options is a parsed command line.
type options struct {
	request    workflows.Request
	workflowID string
	taskQueue  string
	detach     bool
	json       bool
	// waitRelease waits for the run to release its lease before exiting,
	// rather than exiting as soon as the command's Result is known.
	waitRelease bool
	// then are the commands to run after the first, in the same session:
	// shell lines, each run as `sh -c LINE`. With any of them the starter
	// opens a session instead of starting RunCommand.
	then []string
}

// session reports whether the command line asks for several commands in
// one session.
func (o options) session() bool { return len(o.then) > 0 }

// commands are the commands of a session, in order. Every one has the
// first command's cwd, environment and timeout; only the first gets stdin.
func (o options) commands() []sandbox.Command {
	var cmds []sandbox.Command
	if len(o.request.Command.Argv) > 0 {
		cmds = append(cmds, o.request.Command)
	}
	for _, line := range o.then {
		cmd := o.request.Command
		cmd.Argv = []string{"sh", "-c", line}
		if len(cmds) > 0 {
			cmd.Stdin = nil
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}

// parseArgs reads the command line. Errors are one line, fit for a user.
func parseArgs(args []string, stdin io.Reader) (options, error) {
	var o options
	flagArgs, command := args, []string(nil)
	if dash := slices.Index(args, "--"); dash >= 0 {
		flagArgs, command = args[:dash], args[dash+1:]
		if len(command) == 0 {
			return o, fmt.Errorf("no command after `--` (%s)", usage)
		}
	}

	var (
		env, secretEnv keyValues
		stdinPath      string
		script         string
	)
	fs := newFlagSet(&o, &env, &secretEnv, &stdinPath, &script)
	if err := fs.Parse(flagArgs); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, fmt.Errorf("%s; flags: %s", usage, flagNames(fs))
		}
		for _, kv := range []*keyValues{&env, &secretEnv} {
			if kv.malformed {
				// The flag package's message would echo the value, which may be a secret.
				return o, fmt.Errorf("%s takes K=V (%s)", kv.flag, usage)
			}
		}
		return o, fmt.Errorf("%v (%s)", err, usage)
	}
	if fs.NArg() > 0 {
		if command == nil {
			return o, fmt.Errorf("missing `--` before the command (%s)", usage)
		}
		return o, fmt.Errorf("unexpected argument %q before `--` (%s)", fs.Arg(0), usage)
	}
	if script != "" {
		lines, err := readScript(script)
		if err != nil {
			return o, err
		}
		o.then = append(o.then, lines...)
	}
	if command == nil && len(o.then) == 0 {
		return o, fmt.Errorf("missing `--` before the command (%s)", usage)
	}
	if o.session() && (o.detach || o.request.KeepLease) {
		return o, errors.New("--detach and --keep-lease run one command; a session (--then, --script) ends with its lease")
	}

	o.request.Command.Argv = command
	o.request.Command.Env = env.m
	o.request.SecretEnv = secretEnv.m
	if o.workflowID == "" {
		o.workflowID = newWorkflowID()
	}
	if stdinPath != "" {
		data, err := readStdin(stdinPath, stdin)
		if err != nil {
			return o, err
		}
		o.request.Command.Stdin = data
	}
	if o.request.Command.Timeout < 0 {
		return o, errors.New("--timeout must not be negative")
	}
	for _, cmd := range o.commands() {
		req := o.request
		req.Command = cmd
		if err := req.Validate(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// newFlagSet defines the starter's flags, bound to o and the other
// destinations parseArgs reads.
func newFlagSet(o *options, env, secretEnv *keyValues, stdinPath, script *string) *flag.FlagSet {
	fs := flag.NewFlagSet("starter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.request.Command.Cwd, "cwd", "", "working directory (relative to the lease's workspace)")
	env.flag, secretEnv.flag = "--env", "--secret-env"
	fs.Var(env, "env", "environment variable `K=V` (repeatable)")
	fs.Var(secretEnv, "secret-env", "secret environment variable `K=SECRET`, resolved on the worker (repeatable)")
	fs.StringVar(stdinPath, "stdin", "", "`FILE` to use as standard input, or - for this program's")
	fs.DurationVar(&o.request.Command.Timeout, "timeout", 0, "kill the command after this long (0: no limit)")
	fs.StringVar(&o.request.Lease.Shape, "shape", "", "sandbox shape")
	fs.StringVar(&o.request.Lease.Rootfs, "rootfs", "", "the lease's root filesystem: an image or template `NAME` the sandbox server lists in GET /v1/rootfs (default: the server's default image)")
	fs.Func("dockerfile", "build the lease's root filesystem from this Dockerfile `FILE` first, once per content (instead of --rootfs)", func(path string) error {
		data, err := readDockerfile(path)
		o.request.Dockerfile = data
		return err
	})
	fs.Func("egress", "let the lease reach `RULE`: * (everything), host, host:port, IP or CIDR[:port] (repeatable; the sandbox server's policy caps it)", func(rule string) error {
		o.request.Lease.Egress = append(o.request.Lease.Egress, rule)
		return nil
	})
	fs.StringVar(&o.workflowID, "workflow-id", "", "workflow id (default: a new random one)")
	fs.StringVar(&o.taskQueue, "task-queue", workflows.DefaultTaskQueue, "task queue of the worker")
	fs.BoolVar(&o.request.KeepLease, "keep-lease", false, "keep the lease after the command (you then own it)")
	fs.IntVar(&o.request.MaxFreshLeases, "max-fresh-leases", 0, "compensations allowed (0: the default, 2; negative: none)")
	fs.BoolVar(&o.detach, "detach", false, "print the workflow id and run id and exit without waiting")
	fs.BoolVar(&o.json, "json", false, "print one JSON object with the result on stdout (one line per command in a session)")
	fs.BoolVar(&o.waitRelease, "wait-release", false, "exit only once the run has released its lease (a failed release then exits 125), not as soon as the command has ended (no effect with --detach)")
	fs.Func("then", "run this shell `LINE` next, in the same session and workspace (repeatable)", func(line string) error {
		o.then = append(o.then, line)
		return nil
	})
	fs.StringVar(script, "script", "", "run each line of `FILE` as a shell command, in order, in one session (# starts a comment)")
	return fs
}

// PrintFlags writes the starter's flags and their defaults to w, as
// flag.PrintDefaults does: for programs that pass them on (`devserver run
// --help`).
func PrintFlags(w io.Writer) {
	var (
		o              options
		env, secretEnv keyValues
		stdinPath      string
		script         string
	)
	fs := newFlagSet(&o, &env, &secretEnv, &stdinPath, &script)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// readScript reads the commands of a --script file: its lines, without
// blank lines and comments.
func readScript(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--script: %v", err)
	}
	var lines []string
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("--script: %s holds no command", path)
	}
	return lines, nil
}

func flagNames(fs *flag.FlagSet) string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
	return strings.Join(names, " ")
}

// keyValues is a repeatable K=V flag.
type keyValues struct {
	flag      string
	m         map[string]string
	malformed bool
}

func (kv *keyValues) String() string { return "" }

func (kv *keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		kv.malformed = true
		return errors.New("not K=V")
	}
	if kv.m == nil {
		kv.m = map[string]string{}
	}
	kv.m[k] = v
	return nil
}

// readDockerfile reads a --dockerfile, refusing one over
// sandbox.MaxDockerfileBytes without reading it whole.
func readDockerfile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, sandbox.MaxDockerfileBytes+1))
	switch {
	case err != nil:
		return "", err
	case len(data) > sandbox.MaxDockerfileBytes:
		return "", fmt.Errorf("%s is over %d bytes", path, sandbox.MaxDockerfileBytes)
	}
	return string(data), nil
}

// readStdin reads the --stdin input, "-" being r, up to
// sandbox.MaxStdinBytes: stdin travels in workflow history, so a larger
// one is refused (sandbox.StdinTooLarge) without being read whole — a
// file by its size, a pipe after the limit and one byte more.
func readStdin(name string, r io.Reader) ([]byte, error) {
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--stdin: %v", err)
		}
		defer f.Close()
		if info, err := f.Stat(); err == nil && info.Mode().IsRegular() && info.Size() > sandbox.MaxStdinBytes {
			return nil, sandbox.StdinTooLarge(info.Size())
		}
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, sandbox.MaxStdinBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read --stdin: %v", err)
	}
	if len(data) > sandbox.MaxStdinBytes {
		return nil, sandbox.StdinTooLarge(-1)
	}
	return data, nil
}
