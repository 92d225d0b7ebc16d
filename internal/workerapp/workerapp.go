// Package workerapp builds the sandboxflow worker: a Temporal worker with
// RunCommand and the activities over a CreateOS provider, and its metrics
// endpoint. The worker binary and the dev server both use it.
//
// The sandbox API key lives here only, in Config.Sandbox: it is never part
// of a workflow's input, and Config prints and logs it redacted.
package workerapp

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/sandboxflow/sandboxflow/activities"
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
	// Options tune the Temporal worker (pollers, eager activities …). New
	// sets WorkerStopTimeout from StopTimeout, and MaxHeartbeatThrottleInterval
	// when it is zero.
	Options worker.Options
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

// New creates a worker on c with RunCommand and the activities registered.
func New(c client.Client, cfg Config) (worker.Worker, error) {
	secrets := activities.EnvSecrets{Prefix: cfg.SecretPrefix}
	if cfg.Sandbox.Secrets == nil {
		cfg.Sandbox.Secrets = secrets // a lease's SecretEnv, as a command's
	}
	provider, err := createos.New(cfg.Sandbox)
	if err != nil {
		return nil, fmt.Errorf("sandbox provider: %w", err)
	}
	if cfg.TaskQueue == "" {
		cfg.TaskQueue = workflows.DefaultTaskQueue
	}
	opts := cfg.Options
	opts.WorkerStopTimeout = cfg.StopTimeout
	if opts.MaxHeartbeatThrottleInterval == 0 {
		// Heartbeats carry cancellation to running commands; send them
		// often enough that a cancel takes seconds, not most of a heartbeat
		// timeout.
		opts.MaxHeartbeatThrottleInterval = 2 * time.Second
	}
	w := worker.New(c, cfg.TaskQueue, opts)
	workflows.RegisterWorkflows(w)
	acts := &activities.Activities{
		Provider:          provider,
		Secrets:           secrets,
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
	fs.DurationVar(&cfg.StopTimeout, "stop-timeout", 30*time.Second, "how long a stopping worker lets activities finish")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", env("SANDBOXFLOW_METRICS_LISTEN", DefaultMetricsListen),
		`serve Prometheus metrics at /metrics on this address; "" serves none (SANDBOXFLOW_METRICS_LISTEN)`)
	return cfg
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
