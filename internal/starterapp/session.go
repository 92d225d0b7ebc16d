package starterapp

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// jsonSessionResult is the line --json prints for each command of a
// session.
type jsonSessionResult struct {
	jsonResult
	Seq            int  `json:"seq"`
	WorkspaceReset bool `json:"workspaceReset"`
}

// sessionRequest is the session of the command line: its lease, its image
// (--rootfs or --dockerfile) and its compensation.
func (o options) sessionRequest() workflows.SessionRequest {
	return workflows.SessionRequest{
		Lease:          o.request.Lease,
		Image:          o.request.Image,
		MaxFreshLeases: o.request.MaxFreshLeases,
	}
}

// runSession runs the command line's commands one after the other in one
// session, printing each one's output as it ends. It stops at the first
// command that does not succeed, and returns that command's exit code (or
// the last one's). The session is closed at the end, and cancelled when
// the starter is interrupted: either way its lease is destroyed. The first
// command goes with the session's start, in one request
// (sandboxclient.StartSessionWith).
func runSession(ctx context.Context, c client.Client, dc converter.DataConverter, startOpts client.StartWorkflowOptions, opts options, stdio IO, started Started) int {
	commands := opts.commands()
	command := func(i int) workflows.SessionCommand {
		return workflows.SessionCommand{Command: commands[i], SecretEnv: opts.request.SecretEnv}
	}
	startOpts.EnableEagerStart = false // not with update-with-start
	sess, first, err := sandboxclient.StartSessionWith(ctx, c, startOpts, opts.sessionRequest(), command(0))
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
	followed := "" // the process of the command before
	for i, cmd := range commands {
		var live *livePrinter
		if !opts.json {
			live = newLivePrinter(stdio, dc)
			live.ignore = followed
		}
		stopLive := follow(runCtx, c, sess.ID(), live)
		var res workflows.SessionResult
		if i == 0 {
			res, err = first.Get(runCtx)
		} else {
			res, err = sess.Execute(runCtx, command(i))
		}
		stopLive()
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
		if code = printSessionResult(stdio, live, opts, sess.ID(), res); code != 0 {
			break
		}
		if live != nil {
			followed = live.process
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
func printSessionResult(stdio IO, live *livePrinter, opts options, sessionID string, res workflows.SessionResult) int {
	if !opts.json {
		return printResult(stdio, live, res.Result, res.LeaseID, fmt.Sprintf("command %d", res.Seq), opts.request.Command.Timeout)
	}
	line := jsonSessionResult{
		jsonResult: newJSONResult(sessionID, "", res.Result, res.LeaseID, res.FreshLeases),
		Seq:        res.Seq, WorkspaceReset: res.WorkspaceReset,
	}
	if code := writeJSON(stdio, line); code != 0 {
		return code
	}
	return res.ShellExitCode()
}

// cancelSession cancels an interrupted session, which destroys its lease.
func cancelSession(c client.Client, sess *sandboxclient.SessionClient, stdio IO) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.CancelWorkflow(ctx, sess.ID(), ""); err != nil {
		fmt.Fprintf(stdio.Stderr, "starter: cannot cancel session %s: %v\n", sess.ID(), oneLine(err))
	} else {
		fmt.Fprintln(stdio.Stderr, "starter: interrupted; the session was cancelled and its lease released")
	}
	return ExitInterrupted
}
