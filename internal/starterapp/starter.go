// Package starter is the starter program: it starts a RunCommand workflow
// for a command line, shows its progress, prints the command's output and
// returns the command's exit code. The starter binary and `devserver run`
// both run it, so that they behave exactly alike.
package starterapp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Exit codes of the starter itself. Any other code is the command's.
const (
	// ExitUsage: the command line was wrong.
	ExitUsage = 2
	// ExitRunFailed: the run failed or could not start; the command's own
	// exit code is unknown. 125 as in `docker run`, because 1 and 2 are
	// common exit codes of commands.
	ExitRunFailed = 125
	// ExitInterrupted: the starter was interrupted (128+SIGINT).
	ExitInterrupted = 130
)

// IO is what the starter reads and writes.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Progress enables the live progress line on Stderr (when it is a
	// terminal).
	Progress bool
}

// Started, if not nil, learns the workflow run as soon as it has started.
type Started func(workflowID, runID string)

// Main runs the starter with args (without the program name) against the
// Temporal service that temporalOptions describe, and returns the exit code:
// the command's, or one of the Exit* codes.
//
// It prints the command's output and returns as soon as the command has
// ended (RunCommand's result Update), giving the run releaseGrace to
// release its lease; a run still releasing it then goes on alone, which a
// line on stderr says, naming the workflow. The exit code is the
// command's even if that release fails later. With --wait-release it
// returns only once the run has ended, and a run that fails after its
// command (its release failed) exits ExitRunFailed.
func Main(ctx context.Context, args []string, stdio IO, temporalOptions client.Options, started Started) int {
	opts, err := parseArgs(args, stdio.Stdin)
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: %v\n", err)
		return ExitUsage
	}
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := client.DialContext(dialCtx, temporalOptions)
	cancel()
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: cannot reach Temporal at %s: %v\n", hostPort(temporalOptions), oneLine(err))
		return ExitRunFailed
	}
	defer c.Close()
	return start(ctx, c, opts, stdio, temporalOptions, started, false)
}

// MainOn runs the starter as Main does, on c, a client of the caller's
// dialled with temporalOptions, which it does not close. It starts the
// run eagerly (client.StartWorkflowOptions.EnableEagerStart): when a
// worker on c in this process polls the run's task queue, as the one of
// `devserver run`'s stack does, the run's first workflow task comes back
// in the answer to the start and goes straight to that worker, without a
// trip through matching. Without such a worker the run starts as Main's.
func MainOn(ctx context.Context, c client.Client, args []string, stdio IO, temporalOptions client.Options, started Started) int {
	opts, err := parseArgs(args, stdio.Stdin)
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: %v\n", err)
		return ExitUsage
	}
	return start(ctx, c, opts, stdio, temporalOptions, started, true)
}

// start is Main on a client, once the command line is parsed.
func start(ctx context.Context, c client.Client, opts options, stdio IO, temporalOptions client.Options, started Started, eager bool) int {
	startOpts := client.StartWorkflowOptions{
		ID:               opts.workflowID,
		TaskQueue:        opts.taskQueue,
		EnableEagerStart: eager,
	}
	if searchAttributesRegistered(ctx, c, temporalOptions.Namespace) {
		startOpts.TypedSearchAttributes = temporal.NewSearchAttributes(
			temporal.NewSearchAttributeKeyKeyword(workflows.SearchAttributePhase).ValueSet("scheduled"))
	}
	if opts.session() {
		return runSession(ctx, c, temporalOptions.DataConverter, startOpts, opts, stdio, started)
	}
	run, err := c.ExecuteWorkflow(ctx, startOpts, workflows.WorkflowName, opts.request)
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: cannot start the run: %v\n", oneLine(err))
		return ExitRunFailed
	}
	if started != nil {
		started(run.GetID(), run.GetRunID())
	}
	if opts.detach {
		if opts.json {
			return writeJSON(stdio, jsonResult{WorkflowID: run.GetID(), RunID: run.GetRunID()})
		}
		fmt.Fprintf(stdio.Stdout, "%s %s\n", run.GetID(), run.GetRunID())
		return 0
	}

	var live *livePrinter
	if !opts.json { // --json prints one object, at the end
		live = newLivePrinter(stdio, temporalOptions.DataConverter)
	}
	printed := func(res workflows.Result) {
		if live != nil {
			printResult(stdio, live, res.Result, res.LeaseID, "the command", opts.request.Command.Timeout)
		}
	}
	end := wait(ctx, c, run, stdio, live, printed, opts.waitRelease)
	switch {
	case !end.known && end.interrupted && end.ended:
		fmt.Fprintln(stdio.Stderr, "starter: interrupted; the run was cancelled and its lease released")
		return ExitInterrupted
	case !end.known && end.interrupted:
		fmt.Fprintf(stdio.Stderr, "starter: interrupted; run %s is cancelled and goes on releasing its lease\n", run.GetID())
		return ExitInterrupted
	case !end.known:
		fmt.Fprintf(stdio.Stderr, "starter: run %s failed: %v\n", run.GetID(), describeFailure(end.err))
		return ExitRunFailed
	}
	code := end.result.ShellExitCode()
	switch {
	case !end.ended:
		// The command has ended; the run releases its lease without us.
		fmt.Fprintf(stdio.Stderr, "starter: run %s goes on %s; --wait-release waits for that\n", run.GetID(), cleanup(opts.request, end.result.LeaseID))
	case end.err != nil:
		fmt.Fprintf(stdio.Stderr, "starter: run %s failed after the command ended: %v\n", run.GetID(), describeFailure(end.err))
		if opts.waitRelease {
			code = ExitRunFailed
		}
	}
	if opts.json {
		line := newJSONResult(run.GetID(), run.GetRunID(), end.result.Result, end.result.LeaseID, end.result.FreshLeases)
		line.Releasing = !end.ended
		if failed := writeJSON(stdio, line); failed != 0 {
			return failed
		}
	}
	if end.interrupted {
		return ExitInterrupted
	}
	return code
}

// cleanup says what a run does after its command: release the lease, or,
// when the request keeps it, only sweep the run's orphans.
func cleanup(req workflows.Request, leaseID string) string {
	if req.KeepLease {
		return "sweeping orphan leases (lease " + leaseID + " is kept)"
	}
	return "releasing lease " + leaseID
}

// printResult prints a command's output (what live has not printed of it
// yet; the command ran on lease leaseID) and how it ended, and returns its
// shell exit code. what names the command in messages.
func printResult(stdio IO, live *livePrinter, res sandbox.Result, leaseID, what string, timeout time.Duration) int {
	live.finish(res, leaseID)
	switch {
	case res.TimedOut:
		fmt.Fprintf(stdio.Stderr, "starter: %s timed out after %s and was killed\n", what, timeout)
	case res.Signal != "":
		fmt.Fprintf(stdio.Stderr, "starter: %s was killed by %s\n", what, res.Signal)
	}
	if res.Truncated && !live.skipped && res.StdoutStart == 0 && res.StderrStart == 0 {
		// Both tails are whole, yet output is missing: it was lost before
		// it could be read (the printer names output it skipped itself).
		fmt.Fprintf(stdio.Stderr, "starter: some output of %s was lost before it could be read\n", what)
	}
	return res.ShellExitCode()
}

// jsonResult is the one object --json prints.
type jsonResult struct {
	WorkflowID  string `json:"workflowId"`
	RunID       string `json:"runId"`
	ExitCode    int    `json:"exitCode"`
	Signal      string `json:"signal,omitempty"`
	TimedOut    bool   `json:"timedOut"`
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	Truncated   bool   `json:"truncated"`
	LeaseID     string `json:"leaseId,omitempty"`
	FreshLeases int    `json:"freshLeases"`
	// Releasing is set when the starter printed the result while the run
	// was still releasing its lease (it did not wait: no --wait-release).
	Releasing bool `json:"releasing,omitempty"`
}

func newJSONResult(workflowID, runID string, res sandbox.Result, leaseID string, freshLeases int) jsonResult {
	return jsonResult{
		WorkflowID: workflowID, RunID: runID,
		ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut,
		Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated,
		LeaseID: leaseID, FreshLeases: freshLeases,
	}
}

func writeJSON(stdio IO, r any) int {
	if err := json.NewEncoder(stdio.Stdout).Encode(r); err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: %v\n", err)
		return ExitRunFailed
	}
	return 0
}

// releaseGrace is how long the starter waits, once the command's Result
// is known, for the run to release its lease before it leaves the run to
// finish alone and says so: long enough for a release that goes well, so
// that a run normally ends with nothing left and nothing more said; short
// enough that a release that keeps failing does not keep the caller.
const releaseGrace = 2 * time.Second

// runEnd is where a run stood when the starter stopped waiting for it.
type runEnd struct {
	// result is the command's Result, when known.
	result workflows.Result
	known  bool
	// err is the run's failure, if it ended failed: before the command's
	// Result was known, or after it (its release failed).
	err error
	// ended is set when the run has ended: otherwise it goes on releasing
	// its lease, or on being cancelled.
	ended bool
	// interrupted is set when the user interrupted the starter.
	interrupted bool
}

// wait follows the run until the command's Result is known and then its
// lease released (or, unless waitRelease, releaseGrace has passed). It
// shows progress if asked and the command's output as it runs if live is
// not nil, and calls printed with the command's Result as soon as it is
// known: from RunCommand's result Update, or from the run's end when that
// comes first.
//
// An interrupt (SIGINT) before the Result is known cancels the run and
// waits for it to release its lease; a second one stops waiting. An
// interrupt once the Result is known stops waiting.
func wait(ctx context.Context, c client.Client, run client.WorkflowRun, stdio IO, live *livePrinter,
	printed func(workflows.Result), waitRelease bool) runEnd {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	interrupts := make(chan os.Signal, 2)
	signal.Notify(interrupts, os.Interrupt)
	defer signal.Stop(interrupts)

	type outcome struct {
		result workflows.Result
		err    error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		_, o.err = runresult.Get(ctx, c, run, &o.result)
		done <- o
	}()
	results := make(chan workflows.Result, 1)
	go func() {
		// An error means no Result: the run's end says how it went.
		if res, err := sandboxclient.CommandResult(ctx, c, run.GetID(), run.GetRunID()); err == nil {
			results <- res
		}
	}()

	var ticks <-chan time.Time
	if stdio.Progress || live != nil {
		ticker := time.NewTicker(livePollInterval)
		defer ticker.Stop()
		ticks = ticker.C
	}
	progress := progressLine{w: stdio.Stderr}
	defer progress.clear()
	if live != nil {
		live.beforePrint = progress.clear
	}
	var end runEnd
	known := func(res workflows.Result) {
		end.result, end.known = res, true
		progress.clear()
		printed(res)
		live = nil // printed to the end
	}
	var graceOver <-chan time.Time
	for {
		select {
		case o := <-done:
			end.ended, end.err = true, o.err
			if !end.known && o.err == nil && !end.interrupted {
				known(o.result)
			}
			return end
		case res := <-results:
			if end.interrupted {
				continue // the run is being cancelled: its end tells
			}
			known(res)
			if !waitRelease {
				graceOver = time.After(releaseGrace)
			}
		case <-graceOver:
			return end
		case <-interrupts:
			if end.known || end.interrupted {
				end.interrupted = true
				return end
			}
			end.interrupted = true
			progress.clear()
			fmt.Fprintln(stdio.Stderr, "starter: cancelling the run (interrupt again to stop waiting)")
			if err := c.CancelWorkflow(ctx, run.GetID(), run.GetRunID()); err != nil {
				fmt.Fprintf(stdio.Stderr, "starter: cannot cancel the run: %v\n", oneLine(err))
			}
		case <-ticks:
			if live != nil {
				live.poll(ctx, c, run.GetID(), run.GetRunID())
			}
			if !stdio.Progress {
				continue
			}
			queryCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			value, err := c.QueryWorkflow(queryCtx, run.GetID(), run.GetRunID(), workflows.StateQuery)
			cancel()
			var state workflows.State
			if err == nil && value.Get(&state) == nil {
				progress.show(state)
			}
		}
	}
}

// progressLine keeps one status line on a terminal.
type progressLine struct {
	w     io.Writer
	shown bool
}

func (p *progressLine) show(s workflows.State) {
	line := fmt.Sprintf("sandboxflow: %s", s.Phase)
	if s.LeaseID != "" {
		line += " · lease " + s.LeaseID
	}
	if s.FreshLeases > 0 {
		line += fmt.Sprintf(" · compensations %d/%d", s.FreshLeases, s.MaxFreshLeases)
	}
	fmt.Fprintf(p.w, "\r\033[K%s", line)
	p.shown = true
}

func (p *progressLine) clear() {
	if p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// searchAttributesRegistered reports whether the namespace has both of
// RunCommand's search attributes, so that the run may carry them.
func searchAttributesRegistered(ctx context.Context, c client.Client, namespace string) bool {
	if namespace == "" {
		namespace = client.DefaultNamespace
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return false
	}
	for _, name := range []string{workflows.SearchAttributeLeaseID, workflows.SearchAttributePhase} {
		if resp.GetCustomAttributes()[name] != enums.INDEXED_VALUE_TYPE_KEYWORD {
			return false
		}
	}
	return true
}

// describeFailure renders a run's failure as "Type: message" of its root
// ApplicationError, the part a user can act on.
func describeFailure(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return fmt.Sprintf("%s: %s", appErr.Type(), strings.Join(strings.Fields(appErr.Message()), " "))
	}
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) {
		return "canceled"
	}
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) {
		return "timed out: " + oneLine(timeout)
	}
	return oneLine(err)
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

func hostPort(o client.Options) string {
	if o.HostPort == "" {
		return client.DefaultHostPort
	}
	return o.HostPort
}

func newWorkflowID() string { return "sandboxflow-" + strings.ToLower(rand.Text()[:12]) }

// IsTerminal reports whether f is a terminal, where a progress line helps.
func IsTerminal(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
