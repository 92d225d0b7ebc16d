//go:build linux

package localsandboxtest_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/localsandbox/localsandboxtest"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxtest"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// A workflow test with the real local sandbox server behind the SDK's test
// environment: the command really runs, in a real sandbox.
func ExampleNewLocalSandbox() {
	ls, err := localsandboxtest.NewLocalSandbox(localsandbox.Options{}) // in a test: StartLocalSandbox(t, …)
	if err != nil {
		panic(err)
	}
	defer ls.Close()

	provider, err := ls.Provider(createos.Config{})
	if err != nil {
		panic(err)
	}
	env := sandboxtest.NewWorkflowEnvironment(provider)
	env.ExecuteWorkflow(workflows.RunCommand, workflows.Request{
		Command: sandbox.Command{Argv: []string{"sh", "-c", "echo hello from $(hostname | cut -c1-3)"}},
	})

	var res workflows.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		fmt.Println("failed:", err)
		return
	}
	fmt.Print(res.Stdout)
	// Output: hello from sb-
}

// Break the first process creation's response on its way back: the server
// created the process, the client cannot know it.
func ExampleLocalSandbox_faultProxy() {
	ls, err := localsandboxtest.NewLocalSandbox(localsandbox.Options{})
	if err != nil {
		panic(err)
	}
	defer ls.Close()
	proxy, err := faultproxy.New(ls.URL, 1)
	if err != nil {
		panic(err)
	}
	defer proxy.Close()
	proxy.AddRule(faultproxy.Rule{
		Name:   "lost create response",
		Method: http.MethodPost,
		Path:   "/sandboxes/*/processes",
		Times:  1,
		Fault:  faultproxy.DropResponse(),
	})

	provider, err := ls.ProviderVia(proxy.URL(), createos.Config{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	lease, err := provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		panic(err)
	}
	defer provider.DestroyLease(ctx, lease.ID)
	_, err = provider.Execute(ctx, lease, sandbox.Command{Argv: []string{"true"}}, nil)
	fmt.Println(sandbox.ErrorType(err))
	fmt.Println(proxy.Log()[0].Fault)
	// Output:
	// SandboxCleanupError
	// forward, then drop the response
}
