// Package stack boots the whole sandboxflow development stack in one
// process: an embedded Temporal server with its Web UI, the local sandbox
// server, and a worker. `devserver dev`, `devserver run`, the end-to-end
// tests and the reliability matrix all start it the same way.
//
// With Options.Codec the stack is encrypted end to end: its client and
// worker encrypt every payload, the Temporal server stores ciphertext, and
// the Web UI decodes what it shows through the stack's codec server
// (Stack.CodecURL). With Options.Worker.MetricsListen it serves the
// worker's metrics (Stack.MetricsURL).
package stack

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// DefaultSandboxPort is where the in-process sandbox server listens unless
// told otherwise: sandboxd's default port.
const DefaultSandboxPort = 7575

// Options configure a Stack.
type Options struct {
	// Temporal configures the embedded Temporal server. Its search
	// attributes always include RunCommand's.
	Temporal temporalserver.Options

	// SandboxURL and SandboxAPIKey point the worker at another sandbox
	// server; empty SandboxURL runs the local sandbox server in-process.
	SandboxURL    string
	SandboxAPIKey string
	// SandboxPort is the in-process sandbox server's port on 127.0.0.1
	// (it only ever listens on loopback); 0 picks a free one.
	SandboxPort int
	// Sandbox configures the in-process sandbox server. Its API key is
	// always a fresh random one. Its Root defaults to a directory of this
	// stack's own (see LogFile), so that stacks run side by side.
	//
	// Its network options are the leases' network (localsandbox/NETWORK.md):
	// Sandbox.Egress caps their outward network (EgressOff, the default:
	// loopback only; EgressAllowlist; EgressAny; other than off needs root
	// and slirp4netns), and the run asks within it (Request.Lease.Egress,
	// the starter's --egress). Sandbox.EgressHostLoopback, for tests only,
	// lets a lease reach the host's 127.0.0.1 at 10.0.2.2 — the stack's
	// Temporal frontend included, which takes no key.
	Sandbox localsandbox.Options
	// NoSandbox starts no sandbox server (and with an empty SandboxURL,
	// Stack.SandboxURL stays empty): for a stack without a worker, whose
	// user brings both. A worker needs SandboxURL then.
	NoSandbox bool

	// FaultProxy puts a faultproxy.Proxy (seeded with FaultProxySeed)
	// between the worker and the sandbox server: Stack.Proxy, to break the
	// worker's requests on their real path.
	FaultProxy     bool
	FaultProxySeed uint64

	// NoWorker starts no worker (run your own).
	NoWorker bool
	// Worker configures the in-process worker. Its sandbox URL and key are
	// the stack's.
	Worker workerapp.Config

	// Codec, when set, encrypts every payload the stack's client and worker
	// write (codec.DataConverter and codec.FailureConverter), serves a codec
	// server on a free loopback port (Stack.CodecURL) and configures the Web
	// UI to decode through it. Give other clients of the stack
	// Stack.ClientOptions, or they read ciphertext.
	Codec *codec.Keys

	// Logger receives the logs of every part. Default slog.Default(); with
	// LogFile, nil means the file only.
	Logger *slog.Logger
	// LogFile writes the logs of every part to a file in the stack's own
	// directory (Stack.LogPath; a failed Start's *StartError names it): the
	// embedded Temporal server's there only, whatever Temporal.Logger says,
	// the others' to Logger as well. The stack's directory is
	// $TMPDIR/sandboxflow-<uid>/stack-<ip>-<port> for a fixed frontend
	// port, else a temporary one; the next stack sweeps it.
	LogFile bool
	// LogLevel is the least level the log file keeps of the parts other
	// than the Temporal server (whose level is Temporal.LogLevel).
	// Default slog.LevelInfo.
	LogLevel slog.Leveler
}

// Stack is the running development stack.
type Stack struct {
	Temporal *temporalserver.Server
	// Sandbox is the in-process sandbox server; nil when SandboxURL was set.
	Sandbox *localsandbox.Server
	// SandboxURL and SandboxAPIKey reach the sandbox server in use.
	SandboxURL    string
	SandboxAPIKey string
	// Client is connected to the embedded Temporal server.
	Client client.Client
	// Worker is the in-process worker; nil with NoWorker.
	Worker worker.Worker
	// Proxy is the fault proxy in front of the sandbox server, with
	// Options.FaultProxy; the worker reaches the sandbox through it.
	Proxy *faultproxy.Proxy
	// CodecURL is the codec server's base URL (the Web UI posts to
	// CodecURL/decode), with Options.Codec; "" without.
	CodecURL string
	// MetricsURL is the Prometheus endpoint of the stack's client and
	// worker, like http://127.0.0.1:9090/metrics, with
	// Options.Worker.MetricsListen; "" without.
	MetricsURL string
	// LogPath is the log file, with Options.LogFile; "" without.
	LogPath string

	opts          Options
	temporalOpts  temporalserver.Options
	sandboxListen string
	logger        *slog.Logger
	codec         *codecServer
	metrics       *workerapp.MetricsServer
	dir           *stackDir
	logFile       *os.File

	hostsMu sync.Mutex
	hosts   []*Host // of a fleet (fleet.go)

	stopOnce sync.Once
	stopErr  error
}

// StartError is Start's error with Options.LogFile: the log tells more.
type StartError struct {
	Err     error
	LogPath string
}

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Start boots the stack. On error, whatever had started is stopped.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	s := &Stack{opts: opts}
	defer func() {
		if err != nil {
			s.Stop()
			if s.LogPath != "" {
				err = &StartError{Err: err, LogPath: s.LogPath}
			}
		}
	}()
	sandboxed := opts.SandboxURL == "" && !opts.NoSandbox
	if !sandboxed && opts.SandboxURL == "" && (!opts.NoWorker || opts.FaultProxy) {
		return nil, errors.New("stack: with NoSandbox, a worker or a fault proxy needs a SandboxURL")
	}
	if !sandboxed && (opts.Sandbox.Egress != "" && opts.Sandbox.Egress != localsandbox.EgressOff || opts.Sandbox.EgressHostLoopback) {
		// The policy is the in-process server's: another server has its own.
		return nil, fmt.Errorf("stack: egress %q configures the in-process sandbox server, and with SandboxURL or NoSandbox there is none", opts.Sandbox.Egress)
	}
	tOpts := opts.Temporal
	if err := s.openDir(sandboxed, &tOpts); err != nil {
		return nil, err
	}
	tOpts.SearchAttributes = withRunCommandSearchAttributes(tOpts.SearchAttributes)
	if opts.Codec != nil {
		if s.codec, err = listenCodec(); err != nil {
			return nil, err
		}
		s.CodecURL = s.codec.URL()
		tOpts.CodecEndpoint = s.CodecURL
	}
	if s.Temporal, err = temporalserver.Start(ctx, tOpts); err != nil {
		return nil, err
	}
	s.temporalOpts = tOpts
	if s.codec != nil {
		s.codec.serve(opts.Codec, s.Temporal.UIURL())
	}

	if !sandboxed {
		s.SandboxURL, s.SandboxAPIKey = opts.SandboxURL, opts.SandboxAPIKey
	} else if err := s.startSandbox(opts); err != nil {
		return nil, err
	}

	if opts.FaultProxy {
		if s.Proxy, err = faultproxy.New(s.SandboxURL, opts.FaultProxySeed); err != nil {
			return nil, err
		}
	}

	clientOpts := s.ClientOptions()
	if opts.Worker.MetricsListen != "" {
		if s.metrics, err = workerapp.ServeMetrics(opts.Worker.MetricsListen); err != nil {
			return nil, err
		}
		s.MetricsURL = s.metrics.URL()
		clientOpts.MetricsHandler = s.metrics.Metrics.Handler()
	}
	if s.Client, err = client.DialContext(ctx, clientOpts); err != nil {
		return nil, fmt.Errorf("connect to the embedded Temporal server: %w", err)
	}

	if !opts.NoWorker {
		wcfg := opts.Worker
		wcfg.Sandbox.BaseURL, wcfg.Sandbox.APIKey = s.SandboxURL, s.SandboxAPIKey
		if s.Proxy != nil {
			wcfg.Sandbox.BaseURL = s.Proxy.URL()
		}
		if s.Worker, err = workerapp.New(s.Client, wcfg); err != nil {
			return nil, err
		}
		if err := s.Worker.Start(); err != nil {
			return nil, fmt.Errorf("start the worker: %w", err)
		}
		if _, err := workerapp.EnsureReaper(ctx, s.Client, wcfg); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// openDir takes the stack's directory, if it needs one: for the sandbox
// server's root, unless the options give one, and for the log file. It
// sets s.logger and the Temporal server's logger.
func (s *Stack) openDir(sandboxed bool, tOpts *temporalserver.Options) (err error) {
	opts := s.opts
	if opts.LogFile || sandboxed && opts.Sandbox.Root == "" {
		ip := tOpts.IP
		if ip == "" {
			ip = temporalserver.DefaultIP
		}
		if s.dir, err = openStackDir(ip, tOpts.FrontendPort); err != nil {
			return err
		}
		if opts.Sandbox.Root == "" {
			s.opts.Sandbox.Root = s.dir.sandboxRoot()
		}
	}
	s.logger = opts.Logger
	if opts.LogFile {
		if s.logFile, err = s.dir.createLog(); err != nil {
			return err
		}
		s.LogPath = s.logFile.Name()
		level := opts.LogLevel
		if level == nil {
			level = slog.LevelInfo
		}
		// Temporal.LogLevel filters the server's records.
		tOpts.Logger = slog.New(slog.NewTextHandler(s.logFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
		file := slog.NewTextHandler(s.logFile, &slog.HandlerOptions{Level: level})
		if s.logger == nil {
			s.logger = slog.New(file)
		} else {
			s.logger = slog.New(slog.NewMultiHandler(file, s.logger.Handler()))
		}
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	if tOpts.Logger == nil {
		tOpts.Logger = s.logger
	}
	return nil
}

// startSandbox runs the local sandbox server in-process with a random key.
func (s *Stack) startSandbox(opts Options) error {
	s.SandboxAPIKey = rand.Text()
	return s.serveSandbox(net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.SandboxPort)))
}

// serveSandbox starts a local sandbox server on addr with the stack's key.
func (s *Stack) serveSandbox(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		_, port, _ := net.SplitHostPort(addr)
		return fmt.Errorf("sandbox server: port %s is in use (%s)", port, addr)
	}
	if err != nil {
		return fmt.Errorf("sandbox server: %w", err)
	}
	sOpts := s.opts.Sandbox
	sOpts.APIKey = s.SandboxAPIKey
	sOpts.InsecureNoAuth = false
	if sOpts.Logger == nil {
		sOpts.Logger = s.logger
	}
	srv, err := localsandbox.New(sOpts)
	if err != nil {
		ln.Close()
		return fmt.Errorf("sandbox server: %w", err)
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("sandbox server stopped", "error", err)
		}
	}()
	s.Sandbox = srv
	s.sandboxListen = ln.Addr().String()
	s.SandboxURL = (&url.URL{Scheme: "http", Host: s.sandboxListen}).String()
	return nil
}

// RestartSandbox stops the in-process sandbox server, killing everything
// it runs, and starts a new one on the same address, root and key: what a
// crash and restart of sandboxd looks like to clients.
func (s *Stack) RestartSandbox(ctx context.Context) error {
	if s.Sandbox == nil {
		return errors.New("no in-process sandbox server to restart")
	}
	if err := s.Sandbox.Shutdown(ctx); err != nil {
		return err
	}
	s.opts.Sandbox.Root = s.Sandbox.Root()
	return s.serveSandbox(s.sandboxListen)
}

// RestartTemporal stops the embedded Temporal server and starts it again
// on the same ports and database. Workflows survive only with a database
// file (Options.Temporal.DBFile); clients and the worker reconnect.
func (s *Stack) RestartTemporal(ctx context.Context) error {
	if s.temporalOpts.DBFile == "" {
		return errors.New("restarting an in-memory Temporal server would lose every workflow; set a DBFile")
	}
	_, port, err := net.SplitHostPort(s.Temporal.FrontendHostPort())
	if err != nil {
		return err
	}
	opts := s.temporalOpts
	if opts.FrontendPort, err = strconv.Atoi(port); err != nil {
		return err
	}
	if err := s.Temporal.Stop(); err != nil {
		return err
	}
	s.Temporal, err = temporalserver.Start(ctx, opts)
	return err
}

// DataConverter is the converter of the stack's payloads: with
// Options.Codec, the codec over the default converter (refusing plain-text
// input unless Options.Worker.AllowPlaintextInput); else the default.
func (s *Stack) DataConverter() converter.DataConverter {
	return s.opts.Worker.DataConverter(s.opts.Codec)
}

// ClientOptions are the options of a client of the stack's Temporal
// server that reads and writes payloads as the stack's worker does, and
// logs where the stack logs: give them to client.Dial or to the starter.
//
// They turn off the SDK's gzip compression of requests: over loopback it
// buys nothing and costs the client and the server a compressor each way
// (~13% of the CPU of a no-op workflow here; docs/PERFORMANCE.md).
func (s *Stack) ClientOptions() client.Options {
	return client.Options{
		HostPort:          s.Temporal.FrontendHostPort(),
		Namespace:         s.Temporal.Namespace(),
		DataConverter:     s.DataConverter(),
		FailureConverter:  codec.FailureConverter(s.opts.Codec),
		Logger:            sdklog.NewStructuredLogger(s.logger),
		ConnectionOptions: client.ConnectionOptions{GrpcCompression: &client.GrpcCompressionNone{}},
	}
}

// Provider returns a client of the stack's sandbox server.
func (s *Stack) Provider(cfg createos.Config) (*createos.Client, error) {
	cfg.BaseURL, cfg.APIKey = s.SandboxURL, s.SandboxAPIKey
	return createos.New(cfg)
}

// Stop stops every part, the workers first (the hosts' too), then the
// clients and servers.
// Later calls return the first call's result.
func (s *Stack) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Stack) stop() error {
	var errs []error
	if s.Worker != nil {
		s.Worker.Stop()
	}
	for _, h := range s.Hosts() {
		errs = append(errs, h.stop())
	}
	if s.Client != nil {
		s.Client.Close()
	}
	if s.Proxy != nil {
		s.Proxy.Close()
	}
	if s.Sandbox != nil {
		errs = append(errs, s.Sandbox.Shutdown(context.Background()))
	}
	if s.Temporal != nil {
		errs = append(errs, s.Temporal.Stop())
	}
	if s.codec != nil {
		errs = append(errs, s.codec.close())
	}
	if s.metrics != nil {
		errs = append(errs, s.metrics.Close())
	}
	if s.logFile != nil {
		errs = append(errs, s.logFile.Close())
	}
	if s.dir != nil {
		errs = append(errs, s.dir.release())
	}
	return errors.Join(errs...)
}

func withRunCommandSearchAttributes(in map[string]enumspb.IndexedValueType) map[string]enumspb.IndexedValueType {
	out := map[string]enumspb.IndexedValueType{
		workflows.SearchAttributeLeaseID: enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		workflows.SearchAttributePhase:   enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	}
	for k, v := range in {
		out[k] = v
	}
	return out
}
