package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxtest"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// A worker that runs RunCommand, sessions and their activities against a
// CreateOS-compatible sandbox service (the hosted one, or sandboxd), and a
// workflow of your own. (Runnable examples against a real local sandbox
// server are in localsandbox/localsandboxtest.)
func ExampleRegister() {
	c, err := client.Dial(client.Options{}) // TEMPORAL_ADDRESS etc.: see go.temporal.io/sdk/contrib/envconfig
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	provider, err := createos.New(createos.Config{
		BaseURL: os.Getenv("SANDBOX_API_URL"), // e.g. http://127.0.0.1:7575 for sandboxd
		APIKey:  os.Getenv("SANDBOX_API_KEY"),
	})
	if err != nil {
		log.Fatal(err)
	}
	w := worker.New(c, "sandboxflow", worker.Options{})
	workflows.Register(w, provider)
	w.RegisterWorkflow(Release)
	if err := w.Run(worker.InterruptCh()); err != nil {
		log.Fatal(err)
	}
}

// Release is a workflow of your own that runs a command in a sandbox as a
// child workflow: the command gets its own workflow (its own history, its
// own page in the Web UI, cancellable on its own). ParentClosePolicy
// REQUEST_CANCEL lets the child release its lease when the parent goes
// away; with the SDKs' default, TERMINATE, the child is killed before it
// can, and its lease waits for the reaper.
func Release(ctx workflow.Context, version string) (string, error) {
	ctx = workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:        workflow.GetInfo(ctx).WorkflowExecution.ID + "/build",
		StaticSummary:     "build " + version,
		ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL,
	})
	var build workflows.Result
	err := workflow.ExecuteChildWorkflow(ctx, workflows.WorkflowName, workflows.Request{
		Command: sandbox.Command{
			Argv:    []string{"sh", "-c", `echo "building $VERSION"`},
			Env:     map[string]string{"VERSION": version},
			Timeout: time.Minute,
		},
	}).Get(ctx, &build)
	if err != nil {
		return "", err
	}
	if !build.Succeeded() {
		return "", fmt.Errorf("build exited with %d: %s", build.ShellExitCode(), build.Stderr)
	}
	return build.Stdout, nil
}

// A parent workflow runs RunCommand as a child workflow.
func ExampleRunCommand_childWorkflow() {
	c, err := client.Dial(client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: "sandboxflow"}, Release, "v1.2.3")
	if err != nil {
		log.Fatal(err)
	}
	var out string
	if err := run.Get(context.Background(), &out); err != nil {
		log.Fatal(err)
	}
	fmt.Print(out)
}

// Check is a workflow of your own that runs two commands inline: their
// activities are recorded in Check's own history, one after the other,
// each on a lease of its own.
func Check(ctx workflow.Context) ([]string, error) {
	var outputs []string
	for _, script := range []string{"echo vet ok", "echo tests ok"} {
		res, err := workflows.Run(ctx, workflows.Request{Command: sandbox.Command{Argv: []string{"sh", "-c", script}}})
		if err != nil {
			return nil, err
		}
		outputs = append(outputs, strings.TrimSpace(res.Stdout))
	}
	return outputs, nil
}

// A workflow runs commands inline with Run, in its own history: register
// Check on the worker of ExampleRegister and start it.
func ExampleRun() {
	c, err := client.Dial(client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: "sandboxflow"}, Check)
	if err != nil {
		log.Fatal(err)
	}
	var outputs []string
	if err := run.Get(context.Background(), &outputs); err != nil {
		log.Fatal(err)
	}
	fmt.Println(outputs)
}

// RunCommand in a unit test: sandboxtest wires it and its activities into
// the Temporal SDK's test environment over any sandbox.Provider — here an
// in-memory stand-in that runs only echo. In production a client starts
// workflows.WorkflowName on a worker of ExampleRegister with the same
// Request, from Go or any language (docs/POLYGLOT.md).
func ExampleRunCommand() {
	env := sandboxtest.NewWorkflowEnvironment(newEchoSandbox())
	env.ExecuteWorkflow(workflows.WorkflowName, workflows.Request{
		Command: sandbox.Command{Argv: []string{"echo", "hello,", "sandbox"}, Timeout: 10 * time.Second},
	})
	var res workflows.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d on %s, destroyed %v: %s", res.ExitCode, res.LeaseID, res.DestroyedLeases, res.Stdout)
	// Output: exit 0 on sb-1, destroyed [sb-1]: hello, sandbox
}

// Bad input fails typed, before a lease is created: SandboxInvalidInput,
// whose details name the field by its JSON path.
func ExampleRunCommand_invalidInput() {
	env := sandboxtest.NewWorkflowEnvironment(newEchoSandbox())
	env.ExecuteWorkflow(workflows.WorkflowName, workflows.Request{Command: sandbox.Command{Argv: []string{""}}})
	var appErr *temporal.ApplicationError
	if errors.As(env.GetWorkflowError(), &appErr) {
		var details sandbox.FailureDetails
		_ = appErr.Details(&details)
		fmt.Println(appErr.Type(), details.Field, details.Reason)
	}
	// Output: SandboxInvalidInput command.argv a command needs a program name
}
