package testsuite_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/testsuite"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// A workflow test with the real local sandbox server behind the SDK's test
// environment: the command really runs, in a real sandbox.
func ExampleNewWorkflowEnvironment() {
	t := newExampleT() // in a test: the test's own *testing.T
	defer t.finish()
	ls := testsuite.StartLocalSandbox(t, localsandbox.Options{})

	env := testsuite.NewWorkflowEnvironment(ls.Provider(t, createos.Config{}))
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
func ExampleFaultProxy() {
	t := newExampleT()
	defer t.finish()
	ls := testsuite.StartLocalSandbox(t, localsandbox.Options{})
	proxy, err := testsuite.NewFaultProxy(ls.URL, 1)
	if err != nil {
		panic(err)
	}
	defer proxy.Close()
	proxy.AddRule(testsuite.Rule{
		Name:   "lost create response",
		Method: http.MethodPost,
		Path:   "/sandboxes/*/processes",
		Times:  1,
		Fault:  testsuite.DropResponse(),
	})

	provider := ls.ProviderVia(t, proxy.URL(), createos.Config{})
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

// exampleT stands in for a test's *testing.T in these examples.
type exampleT struct{ cleanups []func() }

func newExampleT() *exampleT                          { return &exampleT{} }
func (t *exampleT) Helper()                           {}
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Errorf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleT) TempDir() string {
	dir, err := os.MkdirTemp("", "example-")
	if err != nil {
		panic(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// finish runs the cleanups, last registered first, as testing does.
func (t *exampleT) finish() {
	for _, f := range slices.Backward(t.cleanups) {
		f()
	}
}
