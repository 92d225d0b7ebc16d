//go:build linux

package localsandboxtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// LocalSandbox is a local sandbox server on a loopback port, with a random
// API key, for a test or an example.
type LocalSandbox struct {
	Server *localsandbox.Server
	// URL and APIKey reach it.
	URL, APIKey string

	served  chan error
	tempDir string // removed by Close, when the root was ours
}

// NewLocalSandbox starts a local sandbox server on a loopback port with a
// random API key and, unless opts sets one, a root directory of its own.
// Close it when done. In a test, StartLocalSandbox does both.
func NewLocalSandbox(opts localsandbox.Options) (*LocalSandbox, error) {
	ls := &LocalSandbox{served: make(chan error, 1)}
	if opts.Root == "" {
		dir, err := os.MkdirTemp("", "sandboxflow-test-")
		if err != nil {
			return nil, err
		}
		opts.Root, ls.tempDir = dir, dir
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	opts.APIKey = rand.Text()
	opts.InsecureNoAuth = false
	srv, err := localsandbox.New(opts)
	if err != nil {
		os.RemoveAll(ls.tempDir)
		return nil, fmt.Errorf("start the local sandbox server: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Shutdown(context.Background())
		os.RemoveAll(ls.tempDir)
		return nil, err
	}
	go func() { ls.served <- srv.Serve(ln) }()
	ls.Server, ls.URL, ls.APIKey = srv, "http://"+ln.Addr().String(), opts.APIKey
	return ls, nil
}

// Close shuts the server down, killing whatever it still runs, and reports
// an error if any process of its sandboxes is alive afterwards.
func (ls *LocalSandbox) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := []error{ls.Server.Shutdown(ctx)}
	if err := <-ls.served; err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, err)
	}
	if pids, err := localsandbox.SandboxProcesses(ls.Server.Root()); err != nil || len(pids) > 0 {
		errs = append(errs, fmt.Errorf("sandbox processes left after shutdown: %v %v", pids, err))
	}
	if ls.tempDir != "" {
		errs = append(errs, os.RemoveAll(ls.tempDir))
	}
	return errors.Join(errs...)
}

// T is the part of testing.TB that StartLocalSandbox uses.
type T interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// StartLocalSandbox starts a local sandbox server (see NewLocalSandbox) for
// the duration of t. At the end of the test it closes it and fails the
// test if any process of its sandboxes is still alive.
func StartLocalSandbox(t T, opts localsandbox.Options) *LocalSandbox {
	t.Helper()
	ls, err := NewLocalSandbox(opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := ls.Close(); err != nil {
			t.Errorf("local sandbox server: %v", err)
		}
	})
	return ls
}

// Provider returns a client of the server, configured by cfg apart from
// its URL and key.
func (ls *LocalSandbox) Provider(cfg createos.Config) (*createos.Client, error) {
	return ls.ProviderVia(ls.URL, cfg)
}

// ProviderVia returns a client that reaches the server through url, for
// example a FaultProxy's.
func (ls *LocalSandbox) ProviderVia(url string, cfg createos.Config) (*createos.Client, error) {
	cfg.BaseURL, cfg.APIKey = url, ls.APIKey
	return createos.New(cfg)
}

// CheckNothingLeaked reports an error if the server holds a lease or a
// live process, or if any process of its sandboxes is alive on the machine.
func (ls *LocalSandbox) CheckNothingLeaked() error { return CheckNothingLeaked(ls.Server) }

// CheckNothingLeaked reports an error if srv holds a lease or a live
// process, or if any process of its sandboxes (by its root) is alive on
// the machine: what every test that ran commands should end with.
func CheckNothingLeaked(srv *localsandbox.Server) error {
	stats, err := srv.Stats()
	if err != nil {
		return err
	}
	if stats.Leases != 0 || stats.Processes != 0 {
		return fmt.Errorf("the sandbox server still holds %d leases and %d processes", stats.Leases, stats.Processes)
	}
	if pids, err := localsandbox.SandboxProcesses(srv.Root()); err != nil || len(pids) > 0 {
		return fmt.Errorf("sandbox processes alive on the machine: %v %v", pids, err)
	}
	return nil
}
