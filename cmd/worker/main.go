// Command worker runs the sandboxflow worker: RunCommand and its four
// activities over a CreateOS-compatible sandbox server.
//
// It reaches Temporal as configured by the environment (TEMPORAL_ADDRESS,
// TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS settings, profiles: see
// go.temporal.io/sdk/contrib/envconfig) and the sandbox server from
// SANDBOX_API_URL and SANDBOX_API_KEY (or the flags). SIGINT or SIGTERM
// stop it gracefully: running commands are left running and the next
// attempt, on another worker, re-attaches to them.
//
// With --host NAME (SANDBOXFLOW_HOST) it runs as one sandbox host of a
// fleet, each host with its own sandbox server (--sandbox-url) and the
// same Temporal namespace and --task-queue: it takes new leases only while
// it holds fewer than --host-capacity, runs the work on its leases on a
// task queue of its own, and sweeps, when it starts and every
// --sweep-interval, the leases on its server that no workflow holds
// (package workflows, "Fleets of sandbox hosts"). SIGUSR1 drains it: it
// takes no new lease, and exits once it holds none.
//
// It serves Prometheus metrics at /metrics on --metrics-listen
// (SANDBOXFLOW_METRICS_LISTEN, default 127.0.0.1:9090; empty: none), and
// encrypts every payload it writes to history when SANDBOXFLOW_CODEC_KEYS or
// SANDBOXFLOW_CODEC_KEYS_FILE holds a key ring (see package codec); starters
// must then hold the same ring. Such a worker refuses a workflow or an
// Update whose input arrived unencrypted (SandboxInvalidInput, "plaintext
// input"), unless --allow-plaintext-input (SANDBOXFLOW_ALLOW_PLAINTEXT=1).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/workflows"
)

func main() {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	cfg := workerapp.Flags(fs, os.Getenv)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Parse(os.Args[1:])

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fatal("--log-level: %v", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	options, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		fatal("Temporal client configuration: %v", err)
	}
	options.Logger = log.NewStructuredLogger(logger)
	keys, err := codec.LoadKeys(os.Getenv)
	if err != nil {
		fatal("%v", err)
	}
	options.DataConverter, options.FailureConverter = cfg.DataConverter(keys), codec.FailureConverter(keys)
	if cfg.MetricsListen != "" {
		m, err := workerapp.ServeMetrics(cfg.MetricsListen)
		if err != nil {
			fatal("%v", err)
		}
		defer m.Close()
		options.MetricsHandler = m.Metrics.Handler()
		logger.Info("serving metrics", "url", m.URL())
	}
	c, err := client.Dial(options)
	if err != nil {
		fatal("cannot reach Temporal: %v", err)
	}
	defer c.Close()

	if cfg.Host != "" {
		cfg.Logger = logger
		runHost(c, *cfg, logger)
		return
	}
	w, err := workerapp.New(c, *cfg)
	if err != nil {
		fatal("%v", err)
	}
	if created, err := workerapp.EnsureReaper(context.Background(), c, *cfg); err != nil {
		// The worker runs without it; another worker, or the next start,
		// creates it.
		logger.Warn("could not create the reaper's schedule", "error", err)
	} else if created {
		logger.Info("created the reaper's schedule", "schedule", workflows.ReaperScheduleID, "every", cfg.ReaperInterval)
	}
	logger.Info("worker started", "taskQueue", cfg.TaskQueue, "encryption", keys)
	if err := w.Run(worker.InterruptCh()); err != nil {
		fatal("%v", err)
	}
}

// runHost runs the worker in host mode until SIGINT or SIGTERM, or until
// a drain (SIGUSR1) leaves the host without a lease.
func runHost(c client.Client, cfg workerapp.Config, logger *slog.Logger) {
	h, err := workerapp.NewHost(c, cfg)
	if err != nil {
		fatal("%v", err)
	}
	if err := h.Start(); err != nil {
		fatal("%v", err)
	}
	defer h.Stop()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	if drainSignal != nil {
		signal.Notify(signals, drainSignal)
	}
	for {
		select {
		case <-h.Drained():
			logger.Info("drained: no lease left")
			return
		case sig := <-signals:
			if sig != drainSignal {
				return
			}
			h.Drain()
		}
	}
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "worker: "+format+"\n", args...)
	os.Exit(1)
}
