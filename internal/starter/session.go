package starter

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/workflows"
)

// jsonSessionResult is the line --json prints for each command of a
// session.
type jsonSessionResult struct {
	jsonResult
	Seq            int  `json:"seq"`
	WorkspaceReset bool `json:"workspaceReset"`
}

// runSession runs the command line's commands one after the other in one
// session, printing each one's output as it ends. It stops at the first
// command that does not succeed, and returns that command's exit code (or
// the last one's). The session is closed at the end, and cancelled when
// the starter is interrupted: either way its lease is destroyed.
func runSession(ctx context.Context, c client.Client, startOpts client.StartWorkflowOptions, opts options, stdio IO, started Started) int {
	sess, err := workflows.StartSession(ctx, c, startOpts, workflows.SessionRequest{
		Lease:          opts.request.Lease,
		MaxFreshLeases: opts.request.MaxFreshLeases,
	})
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: cannot start the session: %v\n", oneLine(err))
		return ExitRunFailed
	}
	if started != nil {
		started(sess.ID(), sess.FirstRunID())
	}

	interrupts := make(chan os.Signal, 1)
	signal.Notify(interrupts, os.Interrupt)
	defer signal.Stop(interrupts)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	interrupted := make(chan struct{})
	go func() {
		select {
		case <-interrupts:
			close(interrupted)
			cancel()
		case <-runCtx.Done():
		}
	}()

	code := 0
	for i, cmd := range opts.commands() {
		res, err := sess.Execute(runCtx, workflows.SessionCommand{Command: cmd, SecretEnv: opts.request.SecretEnv})
		select {
		case <-interrupted:
			return cancelSession(c, sess, stdio)
		default:
		}
		if err != nil {
			fmt.Fprintf(stdio.Stderr, "starter: command %d (%s) failed in session %s: %v\n", i+1, cmd, sess.ID(), describeFailure(err))
			code = ExitRunFailed
			break
		}
		if res.WorkspaceReset {
			fmt.Fprintf(stdio.Stderr, "starter: the session's lease was replaced before command %d: its workspace was reset\n", res.Seq)
		}
		if code = printSessionResult(stdio, opts, sess.ID(), res); code != 0 {
			break
		}
	}

	closeCtx, cancelClose := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancelClose()
	if _, err := sess.Close(closeCtx); err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: cannot close session %s: %v\n", sess.ID(), describeFailure(err))
		return ExitRunFailed
	}
	return code
}

// printSessionResult prints one command's result and returns its shell
// exit code.
func printSessionResult(stdio IO, opts options, sessionID string, res workflows.SessionResult) int {
	if opts.json {
		if code := writeJSON(stdio, jsonSessionResult{
			jsonResult: jsonResult{
				WorkflowID: sessionID, ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut,
				Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated,
				LeaseID: res.LeaseID, FreshLeases: res.FreshLeases,
			},
			Seq: res.Seq, WorkspaceReset: res.WorkspaceReset,
		}); code != 0 {
			return code
		}
		return res.ShellExitCode()
	}
	io.WriteString(stdio.Stdout, res.Stdout)
	io.WriteString(stdio.Stderr, res.Stderr)
	switch {
	case res.TimedOut:
		fmt.Fprintf(stdio.Stderr, "starter: command %d timed out and was killed\n", res.Seq)
	case res.Signal != "":
		fmt.Fprintf(stdio.Stderr, "starter: command %d was killed by %s\n", res.Seq, res.Signal)
	}
	if res.Truncated {
		fmt.Fprintf(stdio.Stderr, "starter: output of command %d truncated: only the end of each stream is shown\n", res.Seq)
	}
	return res.ShellExitCode()
}

// cancelSession cancels an interrupted session, which destroys its lease.
func cancelSession(c client.Client, sess *workflows.SessionClient, stdio IO) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.CancelWorkflow(ctx, sess.ID(), ""); err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: cannot cancel session %s: %v\n", sess.ID(), oneLine(err))
	} else {
		fmt.Fprintln(stdio.Stderr, "starter: interrupted; the session was cancelled and its lease released")
	}
	return ExitInterrupted
}
