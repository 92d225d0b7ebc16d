package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// TestMain lets the tests run this test binary as devserver itself: with
// runAsDevserver set, it is main, with the real standard streams.
func TestMain(m *testing.M) {
	if os.Getenv(runAsDevserver) == "1" {
		main()
	}
	os.Exit(m.Run())
}

const runAsDevserver = "SANDBOXFLOW_TEST_RUN_AS_DEVSERVER"

// devserver is a command that runs devserver with args, its stack's
// directory in a temporary directory of t. Unset streams are /dev/null.
func devserver(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runAsDevserver+"=1", "TMPDIR="+t.TempDir())
	return cmd
}

// exitCode runs cmd to its end, within ctx, and returns its exit code.
func exitCode(t *testing.T, ctx context.Context, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "devserver %s did not exit on its own", strings.Join(cmd.Args[1:], " "))
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// runOnFreePorts are the arguments of devserver run with args, on ports
// the kernel picks.
func runOnFreePorts(args ...string) []string {
	return append([]string{"run", "--port", "0", "--ui-port", "0", "--sandbox-port", "0"}, args...)
}

// busyPort holds a loopback port until the end of t.
func busyPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func TestRunExitsWhenNoStreamIsATerminal(t *testing.T) {
	// /dev/null is a character device, as a terminal is: taken for one,
	// run kept serving the Web UI until a Ctrl-C that never comes.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	require.NoError(t, err)
	defer null.Close()
	var stdout bytes.Buffer
	cmd := devserver(ctx, t, runOnFreePorts("--json", "--", "sh", "-c", "exit 3")...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, &stdout, null

	require.Equal(t, 3, exitCode(t, ctx, cmd), "the command's exit code")
	var res struct{ ExitCode int }
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &res), stdout.String())
	assert.Equal(t, 3, res.ExitCode)
}

func TestRunPrintsTheOutputAndTheLinkAndNothingElse(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := devserver(ctx, t, runOnFreePorts("--", "sh", "-c", "echo out; echo err >&2; exit 3")...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr

	require.Equal(t, 3, exitCode(t, ctx, cmd), stderr.String())
	assert.Equal(t, "out\n", stdout.String())
	assert.Regexp(t, `^err\nWeb UI: http://127\.0\.0\.1:\d+/namespaces/default/workflows/sandboxflow-\w+/[-\w]+/history\n$`, stderr.String(),
		"the command's stderr and the link: no log line of the stack (the sandbox's unenforced limits are dev's to report)")
}

func TestFailedStartPrintsItsOneErrorThenTheLog(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	port := busyPort(t)
	var stderr bytes.Buffer
	// The Temporal server is up when the sandbox server cannot listen:
	// stopping it logs errors, which are the log file's.
	cmd := devserver(ctx, t, "run", "--port", "0", "--ui-port", "0", "--sandbox-port", fmt.Sprint(port), "--", "true")
	cmd.Stderr = &stderr

	require.Equal(t, 125, exitCode(t, ctx, cmd))
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	require.Len(t, lines, 2, "the error and the log's path, nothing else:\n%s", stderr.String())
	assert.Equal(t, fmt.Sprintf("devserver: sandbox server: port %d is in use (127.0.0.1:%d)", port, port), lines[0])
	path, ok := strings.CutPrefix(lines[1], "devserver: log: ")
	require.True(t, ok, lines[1])
	assert.FileExists(t, path)
}

func TestHelpListsTheFlagsOfEachSubcommandWithTheirDefaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	help := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := devserver(ctx, t, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.Equal(t, 0, exitCode(t, ctx, cmd), "devserver %v: %s", args, stderr.String())
		require.Empty(t, stderr.String(), "devserver %v", args)
		return stdout.String()
	}

	top := help("--help")
	assert.Contains(t, top, "devserver dev [flags]")
	assert.Contains(t, top, "devserver run [flags] [starter flags] -- cmd [args...]")

	dev := help("dev", "--help")
	assert.Regexp(t, `(?m)^usage: devserver dev \[flags\]$`, dev)
	assert.Regexp(t, `-port int\n\s+Temporal frontend port \(default 7233\)`, dev)
	assert.Regexp(t, `-log-level string\n\s+.*\(default "info"\)`, dev)
	assert.Contains(t, dev, "-no-worker")
	assert.Regexp(t, `-egress POLICY\n\s+.*off \(loopback only\), allowlist .* or any.*\(default off\)`, dev)
	assert.NotContains(t, dev, "-linger")

	// A stack that started would fail on the port in use: --help starts
	// nothing, wherever it stands.
	port := fmt.Sprint(busyPort(t))
	for _, args := range [][]string{
		{"run", "--port", port, "--help"},
		{"run", "--json", "-h", "--", "echo", "hi"},
	} {
		run := help(args...)
		assert.Regexp(t, `(?m)^usage: devserver run \[flags\] \[starter flags\] -- cmd \[args\.\.\.\]$`, run, args)
		assert.Regexp(t, `-log-level string\n\s+.*\(default "warn"\)`, run, args)
		assert.Contains(t, run, "-linger", args)
		assert.Contains(t, run, "-verbose", args)
		starterFlags := run[strings.Index(run, "starter flags (passed on to the starter):"):]
		assert.Regexp(t, `-then LINE\n`, starterFlags, args)
		assert.Regexp(t, `-task-queue string\n\s+.*\(default "sandboxflow"\)`, starterFlags, args)
		assert.Contains(t, starterFlags, "-json", args)
		assert.Regexp(t, `-egress POLICY\n\s+.*\(default off\)`, run[:len(run)-len(starterFlags)], args)
		assert.Regexp(t, `-egress RULE\n`, starterFlags, args)
		assert.Contains(t, starterFlags, "--egress with any other value is the\nstarter's, a rule of the run's lease", args)
	}

	shell := help("shell", "--help")
	assert.Regexp(t, `(?m)^usage: devserver shell \[--sandbox-url URL\]`, shell)
	assert.Regexp(t, `-sandbox-url string\n\s+.*\(default "http://127\.0\.0\.1:\d+"\)`, shell)
	assert.Contains(t, shell, "-lease ID")

	// A flag dev and shell do not have: the error, every subcommand's usage, ExitUsage.
	for _, sub := range []string{"dev", "shell"} { // run gives flags not its own to the starter
		var stderr bytes.Buffer
		cmd := devserver(ctx, t, sub, "--no-such-flag")
		cmd.Stderr = &stderr
		require.Equal(t, starterapp.ExitUsage, exitCode(t, ctx, cmd), sub)
		assert.Contains(t, stderr.String(), "devserver "+sub+": flag provided but not defined: -no-such-flag\n", sub)
		assert.Contains(t, stderr.String(), "devserver shell [--sandbox-url URL]", sub)
	}
}

func TestSplitArgsSeparatesDevserverAndStarterFlags(t *testing.T) {
	fs, _ := newFlagSet("run", "warn")
	fs.Bool("linger", false, "")
	ours, theirs := splitArgs([]string{
		"--port", "17233", "--json", "--db=x.db", "--linger", "--task-queue", "q", "--timeout", "5s",
		"--", "sh", "-c", "echo --port 1",
	}, fs)
	assert.Equal(t, []string{"--port", "17233", "--db=x.db", "--linger", "--task-queue", "q"}, ours)
	assert.Equal(t, []string{"--json", "--task-queue", "q", "--timeout", "5s", "--", "sh", "-c", "echo --port 1"}, theirs,
		"the starter gets its own flags, the task queue the worker polls, and the command untouched")

	ours, theirs = splitArgs([]string{"--json", "--help", "--", "sh", "--help"}, fs)
	assert.Equal(t, []string{"--help"}, ours, "help is devserver run's, which lists the starter's flags too")
	assert.Equal(t, []string{"--json", "--", "sh", "--help"}, theirs)
}

func TestSplitArgsGivesEgressPoliciesToTheStackAndRulesToTheRun(t *testing.T) {
	fs, _ := newFlagSet("run", "warn")
	ours, theirs := splitArgs([]string{
		"--egress", "allowlist", "--egress", "pypi.org:443", "--egress=*", "--egress=any", "--", "pip", "--egress", "off",
	}, fs)
	assert.Equal(t, []string{"--egress", "allowlist", "--egress=any"}, ours)
	assert.Equal(t, []string{"--egress", "pypi.org:443", "--egress=*", "--", "pip", "--egress", "off"}, theirs)
}

func TestEgressPolicyFlagIsCheckedAtParse(t *testing.T) {
	fs, f := newFlagSet("dev", "info")
	require.NoError(t, fs.Parse(nil))
	assert.Equal(t, localsandbox.EgressOff, f.opts.Sandbox.Egress, "off by default")

	fs, f = newFlagSet("dev", "info")
	require.NoError(t, fs.Parse([]string{"--egress", "any"}))
	assert.Equal(t, localsandbox.EgressAny, f.opts.Sandbox.Egress)

	fs, f = newFlagSet("dev", "info")
	require.NoError(t, fs.Parse([]string{"--egress", "allowlist", "--egress-allow", "pypi.org:443, 10.0.0.0/8"}))
	assert.Equal(t, []string{"pypi.org:443", "10.0.0.0/8"}, f.opts.Sandbox.EgressAllow, "the operator's allowlist")

	fs, _ = newFlagSet("dev", "info")
	err := fs.Parse([]string{"--egress", "everything"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `want off, allowlist or any, not "everything"`)
}

func TestRunRefusesEgressRulesWhenTheStacksEgressIsOff(t *testing.T) {
	// The in-process server drops the rules of an off policy: the run had
	// no network and no word why.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := devserver(ctx, t, runOnFreePorts("--egress=pypi.org:443", "--", "true")...)
	cmd.Stderr = &stderr
	require.Equal(t, starterapp.ExitUsage, exitCode(t, ctx, cmd), stderr.String())
	assert.Equal(t, "devserver run: --egress pypi.org:443 asks for a network, but the stack's egress is off: add --egress allowlist or --egress any\n", stderr.String())

	rule, ok := egressRule([]string{"--json", "--egress", "*", "--", "sh", "--egress", "x"})
	assert.True(t, ok)
	assert.Equal(t, "*", rule)
	_, ok = egressRule([]string{"--json", "--", "sh", "--egress", "x"})
	assert.False(t, ok, "the command's own arguments are not the starter's")
}
