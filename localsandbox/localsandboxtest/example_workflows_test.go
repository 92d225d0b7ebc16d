//go:build linux

package localsandboxtest_test

import (
	"fmt"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	sdktestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/localsandbox/localsandboxtest"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxtest"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Release is a workflow of your own that runs a command in a sandbox as a
// child workflow: the command gets its own workflow (its own history, its
// own page in the Web UI, cancellable on its own).
func Release(ctx workflow.Context, version string) (string, error) {
	ctx = workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:        workflow.GetInfo(ctx).WorkflowExecution.ID + "/build",
		StaticSummary:     "build " + version,
		ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL, // a cancelled child releases its lease; a terminated one leaves it to the reaper
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

// A parent workflow runs RunCommand as a child workflow, here in the SDK's
// test environment with a real local sandbox server; a worker registers
// Release and calls workflows.Register the same way.
func ExampleNewLocalSandbox_childWorkflow() {
	ls, err := localsandboxtest.NewLocalSandbox(localsandbox.Options{})
	if err != nil {
		panic(err)
	}
	defer ls.Close()
	provider, err := ls.Provider(createos.Config{})
	if err != nil {
		panic(err)
	}
	env := sandboxtest.NewWorkflowEnvironment(provider)
	env.RegisterWorkflow(Release)

	env.ExecuteWorkflow(Release, "v1.2.3")
	var out string
	if err := env.GetWorkflowResult(&out); err != nil {
		fmt.Println("failed:", err)
		return
	}
	fmt.Print(out)
	// Output: building v1.2.3
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

// A workflow runs commands inline with Run, in its own history.
func ExampleNewLocalSandbox_inline() {
	ls, err := localsandboxtest.NewLocalSandbox(localsandbox.Options{})
	if err != nil {
		panic(err)
	}
	defer ls.Close()
	provider, err := ls.Provider(createos.Config{})
	if err != nil {
		panic(err)
	}
	env := sandboxtest.NewWorkflowEnvironment(provider)
	env.RegisterWorkflow(Check)

	env.ExecuteWorkflow(Check)
	var outputs []string
	if err := env.GetWorkflowResult(&outputs); err != nil {
		fmt.Println("failed:", err)
		return
	}
	fmt.Println(outputs)
	// Output: [vet ok tests ok]
}

// A session in the SDK's test environment, with a real local sandbox
// server: two commands, sent as Updates, share one workspace; close
// destroys the lease. (A real client sends them with SessionClient, a
// workflow with OpenSession.)
func ExampleNewLocalSandbox_session() {
	ls, err := localsandboxtest.NewLocalSandbox(localsandbox.Options{})
	if err != nil {
		panic(err)
	}
	defer ls.Close()
	provider, err := ls.Provider(createos.Config{})
	if err != nil {
		panic(err)
	}
	env := sandboxtest.NewWorkflowEnvironment(provider)
	show := &sdktestsuite.TestUpdateCallback{
		OnAccept: func() {},
		OnReject: func(err error) { fmt.Println("rejected:", err) },
		OnComplete: func(value any, err error) {
			if res, ok := value.(workflows.SessionResult); ok {
				fmt.Printf("%d: %s", res.Seq, res.Stdout)
			}
		},
	}
	env.RegisterDelayedCallback(func() {
		for i, script := range []string{"echo kept > f; echo wrote f", "cat f"} {
			env.UpdateWorkflow(workflows.UpdateExecute, fmt.Sprint("command-", i), show,
				workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", script}}})
		}
		env.UpdateWorkflow(workflows.UpdateClose, "close", show)
	}, time.Second)
	env.ExecuteWorkflow(workflows.SessionWorkflow, workflows.SessionRequest{})
	var summary workflows.SessionSummary
	if err := env.GetWorkflowResult(&summary); err != nil {
		fmt.Println("failed:", err)
		return
	}
	fmt.Println("commands:", summary.Commands, "leases destroyed:", len(summary.DestroyedLeases))
	// Output:
	// 1: wrote f
	// 2: kept
	// commands: 2 leases destroyed: 1
}
