// Command histories records RunCommand histories from real runs on the dev
// stack, for the replay test of the workflows package
// (workflows/testdata/*.json): if a change to the workflow code breaks
// determinism, replaying these fails CI. A scenario's workflow id is
// "history-<name>", which the replay uses too (a forked session's id
// derives from it).
//
//	cd devserver && go run ./cmd/histories -out ../workflows/testdata -only NAME
//
// Run it again only to add a scenario (-only records just that one), never
// to "fix" a failing replay: a failing replay means running workflows would
// break.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/temporalproto"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// scenario is one recorded run.
type scenario struct {
	name    string
	request workflows.Request
	rule    *faultproxy.Rule // a fault on the worker's way to the sandbox
	cancel  bool             // cancel once the command runs
	// askResult sends the result Update (sandboxclient.CommandResult) as soon
	// as the run has started.
	askResult bool
	// session, when set, records a SessionWorkflow instead, driven by it.
	session func(context.Context, *sandboxclient.SessionClient) error
	// searchAttributes starts the run with RunCommand's search
	// attributes, as the starter does: the run keeps them current.
	searchAttributes bool
}

func scenarios() []scenario {
	shell := func(script string) sandbox.Command { return sandbox.Command{Argv: []string{"sh", "-c", script}} }
	return []scenario{
		{name: "completed", request: workflows.Request{Command: shell("echo hello; echo oops >&2; exit 3")}},
		{name: "timed_out", request: workflows.Request{Command: sandbox.Command{Argv: []string{"sleep", "60"}, Timeout: time.Second}}},
		{name: "compensated", request: workflows.Request{Command: shell("echo once")},
			rule: &faultproxy.Rule{Method: http.MethodPost, Path: "/sandboxes/*/processes", Times: 1, Fault: faultproxy.DropResponse()}},
		{name: "compensation_exhausted", request: workflows.Request{Command: shell("true"), MaxFreshLeases: 1},
			rule: &faultproxy.Rule{Method: http.MethodPost, Path: "/sandboxes/*/processes", Fault: faultproxy.Status(502)}},
		{name: "kept_lease", request: workflows.Request{Command: shell("true"), KeepLease: true}},
		{name: "canceled", request: workflows.Request{Command: sandbox.Command{Argv: []string{"sleep", "60"}}}, cancel: true},
		// The result Update is answered while the lease's DELETE fails
		// twice; and a run that fails before its command answers it with
		// its failure.
		{name: "result_first", request: workflows.Request{Command: shell("echo hello; exit 3")}, askResult: true,
			rule: &faultproxy.Rule{Method: http.MethodDelete, Path: "/sandboxes/*", Times: 2, Fault: faultproxy.Status(503)}},
		{name: "result_of_failed_run", request: workflows.Request{Command: shell("true"), Lease: sandbox.LeaseSpec{Shape: "s-no-such-shape"}}, askResult: true},
		// A session: a command, a second whose create response is lost
		// (compensated on a fresh lease), a rejected one, pause, a third
		// command that resumes the lease, close.
		{name: "session", session: driveSession,
			rule: &faultproxy.Rule{Method: http.MethodPost, Path: "/sandboxes/*/processes", After: 1, Times: 1, Fault: faultproxy.DropResponse()}},
		// A session that changes its egress, forks (a command and close in
		// the fork), and goes on on its own lease.
		{name: "session_fork", session: driveSessionFork},
		// A session started as the starter starts it, with the search
		// attributes: two commands, close.
		{name: "session_search_attributes", session: driveTwoCommands, searchAttributes: true},
	}
}

func driveTwoCommands(ctx context.Context, sess *sandboxclient.SessionClient) error {
	for _, script := range []string{"echo one > f", "cat f"} {
		if _, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", script}}}); err != nil {
			return err
		}
	}
	_, err := sess.Close(ctx)
	return err
}

func driveSessionFork(ctx context.Context, sess *sandboxclient.SessionClient) error {
	shell := func(script string) workflows.SessionCommand {
		return workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", script}}}
	}
	if _, err := sess.Execute(ctx, shell("echo one > f")); err != nil {
		return err
	}
	if _, err := sess.SetEgress(ctx, []string{"*"}); err != nil {
		return err
	}
	forked, err := sess.Fork(ctx)
	if err != nil {
		return err
	}
	if _, err := forked.Execute(ctx, shell("cat f")); err != nil {
		return err
	}
	if _, err := forked.Close(ctx); err != nil {
		return err
	}
	if _, err := sess.Execute(ctx, shell("cat f")); err != nil {
		return err
	}
	_, err = sess.Close(ctx)
	return err
}

func driveSession(ctx context.Context, sess *sandboxclient.SessionClient) error {
	shell := func(script string) workflows.SessionCommand {
		return workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", script}}}
	}
	for _, script := range []string{"echo one > f", "cat f || echo reset"} {
		if _, err := sess.Execute(ctx, shell(script)); err != nil {
			return err
		}
	}
	if _, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{""}}}); err == nil {
		return errors.New("an invalid command was accepted")
	}
	if _, err := sess.Pause(ctx); err != nil {
		return err
	}
	if _, err := sess.Execute(ctx, shell("echo three")); err != nil {
		return err
	}
	_, err := sess.Close(ctx)
	return err
}

func main() {
	out := flag.String("out", "../workflows/testdata", "directory to write <scenario>.json into")
	only := flag.String("only", "", "record only this scenario")
	flag.Parse()
	if err := record(context.Background(), *out, *only); err != nil {
		fmt.Fprintln(os.Stderr, "histories:", err)
		os.Exit(1)
	}
}

func record(ctx context.Context, out, only string) error {
	s, err := stack.Start(ctx, stack.Options{
		Temporal:   temporalserver.Options{UIPort: temporalserver.NoUI},
		FaultProxy: true,
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return err
	}
	defer s.Stop()
	proxy := s.Proxy

	for _, sc := range scenarios() {
		if only != "" && sc.name != only {
			continue
		}
		proxy.ClearRules()
		if sc.rule != nil {
			proxy.AddRule(*sc.rule)
		}
		if err := recordOne(ctx, s, sc, filepath.Join(out, sc.name+".json")); err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		fmt.Println("recorded", sc.name)
	}
	return nil
}

func recordOne(ctx context.Context, s *stack.Stack, sc scenario, path string) error {
	opts := client.StartWorkflowOptions{ID: "history-" + sc.name, TaskQueue: workflows.DefaultTaskQueue}
	if sc.searchAttributes {
		opts.TypedSearchAttributes = temporal.NewSearchAttributes(
			temporal.NewSearchAttributeKeyKeyword(workflows.SearchAttributePhase).ValueSet("scheduled"))
	}
	if sc.session != nil {
		sess, err := sandboxclient.StartSession(ctx, s.Client, opts, workflows.SessionRequest{})
		if err != nil {
			return err
		}
		if err := sc.session(ctx, sess); err != nil {
			return err
		}
		return writeHistory(ctx, s, sess.ID(), sess.FirstRunID(), path)
	}
	run, err := s.Client.ExecuteWorkflow(ctx, opts, workflows.WorkflowName, sc.request)
	if err != nil {
		return err
	}
	if sc.askResult {
		_, _ = sandboxclient.CommandResult(ctx, s.Client, run.GetID(), run.GetRunID()) // a failure is a scenario too
	}
	if sc.cancel {
		if err := waitForAProcess(ctx, s); err != nil {
			return err
		}
		if err := s.Client.CancelWorkflow(ctx, run.GetID(), run.GetRunID()); err != nil {
			return err
		}
	}
	_ = run.Get(ctx, nil) // failures are scenarios too
	return writeHistory(ctx, s, run.GetID(), run.GetRunID(), path)
}

// writeHistory writes a run's whole history as JSON.
func writeHistory(ctx context.Context, s *stack.Stack, workflowID, runID, path string) error {
	history := &historypb.History{}
	iter := s.Client.GetWorkflowHistory(ctx, workflowID, runID, false, 0)
	for iter.HasNext() {
		event, err := iter.Next()
		if err != nil {
			return err
		}
		history.Events = append(history.Events, event)
	}
	data, err := temporalproto.CustomJSONMarshalOptions{Indent: "  "}.Marshal(history)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// waitForAProcess returns once a command runs on the sandbox server.
func waitForAProcess(ctx context.Context, s *stack.Stack) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if stats, err := s.Sandbox.Stats(); err == nil && stats.Processes > 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("no process started")
}
