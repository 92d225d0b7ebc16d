package sandboxclient_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Start RunCommand on the workers' task queue and take the command's
// result as soon as it ended, before its lease is released.
func ExampleCommandResult() {
	ctx := context.Background()
	c, err := client.Dial(client.Options{}) // TEMPORAL_ADDRESS etc.: see go.temporal.io/sdk/contrib/envconfig
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue}, workflows.WorkflowName,
		workflows.Request{Command: sandbox.Command{Argv: []string{"make", "test"}, Timeout: 10 * time.Minute}})
	if err != nil {
		log.Fatal(err)
	}
	res, err := sandboxclient.CommandResult(ctx, c, run.GetID(), run.GetRunID())
	if err != nil {
		log.Fatal(err) // a typed failure: sandbox.Is… tells which
	}
	fmt.Printf("exit %d\n%s", res.ShellExitCode(), res.Stdout)
}

// A session runs many commands on one lease: files the first command
// writes are there for the next. Close destroys the lease.
func ExampleStartSession() {
	ctx := context.Background()
	c, err := client.Dial(client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	session, err := sandboxclient.StartSession(ctx, c, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{IdleTimeout: 5 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	for _, argv := range [][]string{{"git", "clone", "https://example.com/repo", "."}, {"make", "test"}} {
		res, err := session.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: argv}})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d: exit %d\n", res.Seq, res.ExitCode)
	}
	summary, err := session.Close(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(summary.Commands, "commands, leases destroyed:", summary.DestroyedLeases)
}
