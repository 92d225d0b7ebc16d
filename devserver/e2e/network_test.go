package e2e

import (
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// needLeaseNetworks skips a test that needs lease network namespaces (a
// sandbox server running as root), and with slirp an outward path too
// (slirp4netns), unless under CI, where their absence fails it (.ci/run
// installs slirp4netns).
func needLeaseNetworks(t *testing.T, slirp bool) {
	t.Helper()
	testenv.RequireRoot(t, "lease networks need a sandbox server running as root")
	if slirp {
		testenv.RequireCommand(t, "slirp4netns")
	}
}

// hostHTTPServer serves 200 on the host's 127.0.0.1 and returns its port,
// which a lease reaches as 10.0.2.2:<port> with EgressHostLoopback.
func hostHTTPServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// fetchArgv prints the status of GET http://10.0.2.2:port/, docs/NETWORK.md's
// make run example.
func fetchArgv(port int) []string {
	return []string{"python3", "-c",
		fmt.Sprintf(`import urllib.request; print(urllib.request.urlopen("http://10.0.2.2:%d/", timeout=30).status)`, port)}
}

func TestNetworkEgressAnyReachesAHostServer(t *testing.T) {
	needLeaseNetworks(t, true)
	s, _ := startOwnStack(t, stack.Options{
		Sandbox: localsandbox.Options{Egress: localsandbox.EgressAny, EgressHostLoopback: true},
	})
	port := hostHTTPServer(t)

	// As `make run ARGS="--egress any --egress '*'"` does it.
	code, stdout, stderr, _, _ := runStarterOn(t, s, "", append([]string{"--egress", "*", "--"}, fetchArgv(port)...)...)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "200\n", stdout)
}

func TestNetworkEgressOffFailsTheCommandWithANetworkError(t *testing.T) {
	needLeaseNetworks(t, false)
	s := stackOf(t) // TestMain's: egress off, the stack's default
	t.Cleanup(func() { assertNothingLeaked(t) })
	port := hostHTTPServer(t)

	run, err := s.Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, workflows.Request{
			Command: sandbox.Command{Argv: fetchArgv(port)},
			Lease:   sandbox.LeaseSpec{Egress: []string{"*"}},
		})
	require.NoError(t, err)
	var res workflows.Result
	// The run itself succeeds: the command ran and failed, which is its
	// result, not the workflow's failure.
	require.NoError(t, run.Get(t.Context(), &res))
	assert.Equal(t, 1, res.ExitCode, "python's exit code for an uncaught URLError")
	assert.Contains(t, res.Stderr, "urllib.error.URLError")
	assert.Contains(t, res.Stderr, "Network is unreachable")
	assert.Empty(t, res.Stdout)
}
