package testsuite

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	sdklog "go.temporal.io/sdk/log"
	sdktestsuite "go.temporal.io/sdk/testsuite"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// T is the part of testing.TB that the helpers use; *testing.T and
// *testing.B satisfy it.
type T interface {
	Helper()
	Cleanup(func())
	TempDir() string
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// LocalSandbox is a local sandbox server started for one test.
type LocalSandbox struct {
	Server *localsandbox.Server
	// URL and APIKey reach it.
	URL, APIKey string
}

// StartLocalSandbox starts a local sandbox server on a loopback port for
// the duration of t, with a random API key and a root directory of its own
// (unless opts sets one). At the end of the test it shuts the server down
// and fails the test if any process of its sandboxes is still alive.
func StartLocalSandbox(t T, opts localsandbox.Options) *LocalSandbox {
	t.Helper()
	if opts.Root == "" {
		opts.Root = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	opts.APIKey = rand.Text()
	opts.InsecureNoAuth = false
	srv, err := localsandbox.New(opts)
	if err != nil {
		t.Fatalf("start the local sandbox server: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ls := &LocalSandbox{Server: srv, URL: "http://" + ln.Addr().String(), APIKey: opts.APIKey}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shut the local sandbox server down: %v", err)
		}
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			t.Errorf("local sandbox server: %v", err)
		}
		if pids, err := localsandbox.SandboxProcesses(srv.Root()); err != nil || len(pids) > 0 {
			t.Errorf("sandbox processes left after shutdown: %v %v", pids, err)
		}
	})
	return ls
}

// Provider returns a client of the server, configured by cfg apart from
// its URL and key. Point it elsewhere (a FaultProxy) with ProviderVia.
func (ls *LocalSandbox) Provider(t T, cfg createos.Config) *createos.Client {
	t.Helper()
	return ls.ProviderVia(t, ls.URL, cfg)
}

// ProviderVia returns a client that reaches the server through url, for
// example a FaultProxy's.
func (ls *LocalSandbox) ProviderVia(t T, url string, cfg createos.Config) *createos.Client {
	t.Helper()
	cfg.BaseURL, cfg.APIKey = url, ls.APIKey
	c, err := createos.New(cfg)
	if err != nil {
		t.Fatalf("sandbox client: %v", err)
	}
	return c
}

// AssertNothingLeaked fails the test if the server holds a lease or a live
// process, or if any process of its sandboxes is alive on the machine.
func (ls *LocalSandbox) AssertNothingLeaked(t T) {
	t.Helper()
	stats, err := ls.Server.Stats()
	if err != nil {
		t.Fatalf("sandbox stats: %v", err)
	}
	if stats.Leases != 0 || stats.Processes != 0 {
		t.Errorf("the sandbox server still holds %d leases and %d processes", stats.Leases, stats.Processes)
	}
	if pids, err := localsandbox.SandboxProcesses(ls.Server.Root()); err != nil || len(pids) > 0 {
		t.Errorf("sandbox processes alive on the machine: %v %v", pids, err)
	}
}

// NewWorkflowEnvironment returns a test workflow environment of the
// Temporal SDK with RunCommand and its activities over provider
// registered, logging warnings and errors only (to stderr): unit tests of
// workflows that run commands, with a fake, mocked or real provider. To
// configure the environment yourself, call workflows.Register on your own.
func NewWorkflowEnvironment(provider sandbox.Provider) *sdktestsuite.TestWorkflowEnvironment {
	var suite sdktestsuite.WorkflowTestSuite
	suite.SetLogger(sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	env := suite.NewTestWorkflowEnvironment()
	workflows.Register(env, provider)
	return env
}
