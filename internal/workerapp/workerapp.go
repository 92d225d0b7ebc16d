// Package workerapp builds the sandboxflow worker: a Temporal worker with
// RunCommand and the activities over a CreateOS provider, and its metrics
// endpoint. The worker binary and the dev server both use it.
//
// A worker runs in one of two modes. In plain mode (New), every worker
// shares one sandbox service — the hosted service, or one sandboxd — and
// polls one task queue. In host mode (NewHost, Config.Host), each worker
// is one host of a fleet, with a sandbox server of its own: see Host.
//
// The sandbox API key lives here only, in Config.Sandbox: it is never part
// of a workflow's input, and Config prints and logs it redacted.
package workerapp

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/worker"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Config configures a worker.
type Config struct {
	// TaskQueue to poll; workflows.DefaultTaskQueue when empty.
	TaskQueue string
	// Sandbox configures the CreateOS provider.
	Sandbox createos.Config
	// SecretPrefix: a command's secret NAME is read from the worker's
	// environment variable SecretPrefix+NAME.
	SecretPrefix string
	// StopTimeout is how long a stopping worker lets running activities
	// finish. Execute does not need it: it detaches at once and its retry
	// re-attaches.
	StopTimeout time.Duration
	// HeartbeatInterval of the activities; 0 means the default.
	HeartbeatInterval time.Duration
	// MetricsListen is where the worker binary and the dev stack serve the
	// worker's metrics at /metrics (see ServeMetrics); "" serves none. New
	// does not read it: metrics reach Prometheus through the client's
	// MetricsHandler.
	MetricsListen string
	// AllowPlaintextInput lets a worker with a key ring take workflow and
	// Update inputs that arrived unencrypted (DataConverter). Without it
	// such a workflow fails, or such an Update is rejected, as
	// SandboxInvalidInput ("plaintext input") before anything runs: only
	// holders of the ring may start commands. Allow it while the runs
	// started before encryption was turned on finish.
	AllowPlaintextInput bool
	// Options tune the Temporal worker (pollers, eager activities …). New
	// sets WorkerStopTimeout from StopTimeout, and MaxHeartbeatThrottleInterval
	// when it is zero; host mode sets its slot limits too.
	Options worker.Options

	// ReaperInterval is how often the reaper (workflows.Reaper) destroys
	// the leases of runs that closed without releasing them: the period of
	// the schedule that EnsureReaper creates. 0 means
	// workflows.DefaultReaperInterval; negative creates no schedule (the
	// worker still runs the reaper's workflow and activities for a
	// schedule that exists). ReaperClosedFor is
	// workflows.ReaperRequest.ClosedFor. Both only apply when the schedule
	// is created: edit an existing one in the Web UI or with the CLI.
	ReaperInterval, ReaperClosedFor time.Duration

	// Host, when set, names this sandbox host of a fleet: NewHost runs the
	// worker in host mode (see Host), and Sandbox is the host's own
	// server. New ignores the fields below.
	Host string
	// HostCapacity is how many leases the host holds at most: it takes no
	// new lease while it holds that many. 0 means DefaultHostCapacity.
	HostCapacity int
	// SweepInterval is how often the host sweeps the leases no workflow
	// holds, besides when it starts: 0 means DefaultSweepInterval.
	// SweepSettle is workflows.SweepHost's settle.
	SweepInterval, SweepSettle time.Duration
	// Logger receives what host mode says (its sweeps, its capacity);
	// nil means slog.Default().
	Logger *slog.Logger
}

// Format prints the configuration with the sandbox API key redacted,
// whatever the verb.
func (c Config) Format(f fmt.State, verb rune) {
	type plain Config // no methods: printed field by field
	redacted := plain(c)
	if redacted.Sandbox.APIKey != "" {
		redacted.Sandbox.APIKey = "[redacted]"
	}
	fmt.Fprintf(f, "%+v", redacted)
}

// LogValue logs the configuration as Format prints it.
func (c Config) LogValue() slog.Value { return slog.StringValue(fmt.Sprint(c)) }

// DataConverter is the data converter of the worker's client for key
// ring k (nil: no encryption): codec.DataConverter, which refuses
// plain-text input, or with AllowPlaintextInput
// codec.DataConverterAllowingPlaintext. The worker takes its converter
// from the client, so this is set on the client's options.
func (c Config) DataConverter(k *codec.Keys) converter.DataConverter {
	if c.AllowPlaintextInput {
		return codec.DataConverterAllowingPlaintext(k)
	}
	return codec.DataConverter(k)
}

// New creates a worker in plain mode on c, with RunCommand, the reaper
// and the activities registered. EnsureReaper creates the reaper's
// schedule.
func New(c client.Client, cfg Config) (worker.Worker, error) {
	provider, err := newProvider(&cfg)
	if err != nil {
		return nil, err
	}
	if cfg.TaskQueue == "" {
		cfg.TaskQueue = workflows.DefaultTaskQueue
	}
	w := worker.New(c, cfg.TaskQueue, workerOptions(cfg))
	workflows.RegisterWorkflows(w)
	workflows.RegisterReaper(w, c)
	acts := &activities.Activities{
		Provider:          provider,
		Secrets:           activities.EnvSecrets{Prefix: cfg.SecretPrefix},
		HeartbeatInterval: cfg.HeartbeatInterval,
	}
	acts.Register(w)
	return w, nil
}

// Flags registers the worker's flags on fs, with defaults from the
// environment, and returns the Config they fill in. The API key is read
// from SANDBOX_API_KEY (or --sandbox-api-key-file), never from a flag that
// would show in the process list.
func Flags(fs *flag.FlagSet, getenv func(string) string) *Config {
	cfg := &Config{}
	env := func(name, fallback string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return fallback
	}
	fs.StringVar(&cfg.TaskQueue, "task-queue", env("SANDBOXFLOW_TASK_QUEUE", workflows.DefaultTaskQueue), "task queue to poll (SANDBOXFLOW_TASK_QUEUE)")
	fs.StringVar(&cfg.Sandbox.BaseURL, "sandbox-url", getenv("SANDBOX_API_URL"), "sandbox server origin (SANDBOX_API_URL)")
	cfg.Sandbox.APIKey = getenv("SANDBOX_API_KEY")
	fs.Func("sandbox-api-key-file", "read the sandbox API key from this file (default: SANDBOX_API_KEY)", func(path string) error {
		key, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		cfg.Sandbox.APIKey = trimNewline(string(key))
		return nil
	})
	fs.StringVar(&cfg.Sandbox.Shape, "sandbox-shape", getenv("SANDBOX_SHAPE"), "default sandbox shape (SANDBOX_SHAPE)")
	fs.StringVar(&cfg.Sandbox.Rootfs, "sandbox-rootfs", getenv("SANDBOX_ROOTFS"), "default root filesystem (SANDBOX_ROOTFS)")
	fs.StringVar(&cfg.Sandbox.Region, "sandbox-region", getenv("SANDBOX_REGION"), "default region (SANDBOX_REGION)")
	fs.StringVar(&cfg.Sandbox.Workspace, "sandbox-workspace", getenv("SANDBOX_WORKSPACE"), "workspace directory when the server reports none (SANDBOX_WORKSPACE)")
	fs.DurationVar(&cfg.Sandbox.PaceInterval, "sandbox-pace", durationEnv(getenv, "SANDBOX_PACE_INTERVAL"),
		"least time between two requests; 0 = 300ms off loopback, none on it; negative = none (SANDBOX_PACE_INTERVAL)")
	fs.StringVar(&cfg.SecretPrefix, "secret-prefix", env("SANDBOXFLOW_SECRET_PREFIX", "SANDBOXFLOW_SECRET_"), "environment prefix of command secrets")
	fs.BoolVar(&cfg.AllowPlaintextInput, "allow-plaintext-input", getenv(codec.EnvAllowPlaintext) == "1",
		"with a key ring, take workflow and Update inputs that arrived unencrypted instead of failing them ("+codec.EnvAllowPlaintext+"=1)")
	fs.DurationVar(&cfg.StopTimeout, "stop-timeout", 30*time.Second, "how long a stopping worker lets activities finish")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", env("SANDBOXFLOW_METRICS_LISTEN", DefaultMetricsListen),
		`serve Prometheus metrics at /metrics on this address; "" serves none (SANDBOXFLOW_METRICS_LISTEN)`)
	fs.DurationVar(&cfg.ReaperInterval, "reaper-interval", workflows.DefaultReaperInterval,
		"how often the reaper destroys the leases of runs that closed without releasing them (the schedule "+workflows.ReaperScheduleID+", created if missing); negative: create no schedule")
	fs.DurationVar(&cfg.ReaperClosedFor, "reaper-closed-for", workflows.DefaultReaperClosedFor,
		"how long a lease's owner must have been closed before the reaper destroys the lease")
	fs.StringVar(&cfg.Host, "host", getenv("SANDBOXFLOW_HOST"),
		"run as this sandbox host of a fleet, with --sandbox-url its own server (SANDBOXFLOW_HOST; default: plain mode, one sandbox service for all workers)")
	fs.IntVar(&cfg.HostCapacity, "host-capacity", intEnv(getenv, "SANDBOXFLOW_HOST_CAPACITY"),
		fmt.Sprintf("host mode: the most leases this host holds (SANDBOXFLOW_HOST_CAPACITY; 0 = %d)", DefaultHostCapacity))
	fs.DurationVar(&cfg.SweepInterval, "sweep-interval", DefaultSweepInterval,
		"host mode: how often to sweep the leases no workflow holds, besides at start")
	return cfg
}

func intEnv(getenv func(string) string, name string) int {
	n, err := strconv.Atoi(getenv(name))
	if err != nil {
		return 0
	}
	return n
}

func durationEnv(getenv func(string) string, name string) time.Duration {
	d, err := time.ParseDuration(getenv(name))
	if err != nil {
		return 0
	}
	return d
}

func trimNewline(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	return s
}
