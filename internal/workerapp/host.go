package workerapp

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Defaults of host mode.
const (
	// DefaultHostCapacity is how many leases a host holds at most unless
	// Config.HostCapacity says otherwise.
	DefaultHostCapacity = 32
	// DefaultSweepInterval is how often a host sweeps the leases no
	// workflow holds, besides when it starts.
	DefaultSweepInterval = 10 * time.Minute
)

// ledgerResync is how often a host reads its leases anew from its sandbox
// server, and how soon it tries again when the server did not answer.
const ledgerResync = 15 * time.Second

// Host is a worker in host mode: one sandbox host of a fleet, each host
// with its own sandbox server (Config.Sandbox) and the same Temporal
// namespace and task queue (Config.TaskQueue, the fleet's shared queue).
// It runs three Temporal workers:
//
//	shared queue      the workflows (marked as on a fleet:
//	                  workflows.FleetInterceptor) and UpdateSession
//	placement queue   CreateLease, AcquireFreshLease: polled only while
//	                  the host has room for one more lease (HostCapacity)
//	the host's queue  everything else on the leases that live here
//	                  (workflows.HostTaskQueue): Execute, DestroyLease,
//	                  pause, resume, fork, egress
//
// Every lease it makes names the host (sandbox.Lease.Host), and the
// workflows send the work on it to the host's queue. When it starts, and
// every SweepInterval, it sweeps the leases on its server that no
// workflow holds (workflows.SweepHost).
type Host struct {
	cfg    Config
	c      client.Client
	logger *slog.Logger
	gate   *capacityGate
	ledger *ledger
	// shared, placement and own are the workers of the three queues.
	shared, placement, own worker.Worker

	drainOnce sync.Once
	drained   chan struct{} // closed once draining and no lease is left
	draining  chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once
	loops     sync.WaitGroup
}

// NewHost creates a worker in host mode: cfg.Host names the host.
func NewHost(c client.Client, cfg Config) (*Host, error) {
	if err := checkHost(&cfg); err != nil {
		return nil, err
	}
	provider, err := newProvider(&cfg)
	if err != nil {
		return nil, err
	}
	h := &Host{
		cfg:      cfg,
		c:        c,
		logger:   cfg.Logger,
		gate:     newCapacityGate(cfg.HostCapacity),
		drained:  make(chan struct{}),
		draining: make(chan struct{}),
		stop:     make(chan struct{}),
	}
	if h.logger == nil {
		h.logger = slog.Default()
	}
	h.logger = h.logger.With("host", cfg.Host)
	h.ledger = newLedger(provider, h.counted)
	acts := &activities.Activities{
		Provider:          h.ledger,
		Secrets:           activities.EnvSecrets{Prefix: cfg.SecretPrefix},
		HeartbeatInterval: cfg.HeartbeatInterval,
		Host:              cfg.Host,
	}

	opts := workerOptions(cfg)
	hostname, _ := os.Hostname()
	opts.Identity = fmt.Sprintf("%d@%s/%s", os.Getpid(), hostname, cfg.Host)
	shared := opts
	shared.Interceptors = append(slices.Clone(opts.Interceptors), workflows.FleetInterceptor())
	h.shared = worker.New(c, cfg.TaskQueue, shared)
	workflows.RegisterWorkflows(h.shared)

	placement := opts
	fixed, err := worker.NewFixedSizeSlotSupplier(1000)
	if err != nil {
		return nil, err
	}
	if placement.Tuner, err = worker.NewCompositeTuner(worker.CompositeTunerOptions{
		ActivitySlotSupplier:        h.gate,
		WorkflowSlotSupplier:        fixed,
		LocalActivitySlotSupplier:   fixed,
		NexusSlotSupplier:           fixed,
		SessionActivitySlotSupplier: fixed,
	}); err != nil {
		return nil, err
	}
	h.placement = worker.New(c, workflows.PlacementTaskQueue(cfg.TaskQueue), placement)
	acts.Register(h.placement)

	h.own = worker.New(c, workflows.HostTaskQueue(cfg.TaskQueue, cfg.Host), opts)
	acts.Register(h.own)
	return h, nil
}

// checkHost checks and completes the host-mode part of cfg.
func checkHost(cfg *Config) error {
	if err := sandbox.CheckHostName("host", cfg.Host); err != nil {
		return err
	}
	if cfg.HostCapacity < 0 {
		return fmt.Errorf("host capacity %d: must not be negative", cfg.HostCapacity)
	}
	if cfg.HostCapacity == 0 {
		cfg.HostCapacity = DefaultHostCapacity
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.TaskQueue == "" {
		cfg.TaskQueue = workflows.DefaultTaskQueue
	}
	return nil
}

// counted hears the host's lease count.
func (h *Host) counted(n int) {
	h.gate.setLeases(n)
	if n == 0 {
		select {
		case <-h.draining:
			h.drainOnce.Do(func() { close(h.drained) })
		default:
		}
	}
}

// Start starts the host: the worker of its own queue first, so that the
// work on its leases goes on, then the shared one, then — once its leases
// are known — placement. It sweeps in the background.
func (h *Host) Start() error {
	if err := h.own.Start(); err != nil {
		return fmt.Errorf("host queue worker: %w", err)
	}
	if err := h.shared.Start(); err != nil {
		h.own.Stop()
		return fmt.Errorf("shared queue worker: %w", err)
	}
	if err := h.placement.Start(); err != nil {
		h.shared.Stop()
		h.own.Stop()
		return fmt.Errorf("placement worker: %w", err)
	}
	h.loops.Add(2)
	go h.keepCounting()
	go h.keepSweeping()
	h.logger.Info("sandbox host started", "taskQueue", h.cfg.TaskQueue, "capacity", h.cfg.HostCapacity)
	return nil
}

// keepCounting reads the host's leases from its server every
// ledgerResync, and when a create or fork failed: the gate opens at the
// first answer and closes while the server does not answer, so that a
// host whose server is down takes no create.
func (h *Host) keepCounting() {
	defer h.loops.Done()
	ctx, cancel := h.context()
	defer cancel()
	for {
		err := h.ledger.resync(ctx)
		h.gate.setReady(err == nil)
		if err != nil && ctx.Err() == nil {
			h.logger.Warn("cannot count the host's leases; taking no new lease", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-h.ledger.stale:
		case <-time.After(ledgerResync):
		}
	}
}

// keepSweeping sweeps at once, then every SweepInterval.
func (h *Host) keepSweeping() {
	defer h.loops.Done()
	ctx, cancel := h.context()
	defer cancel()
	for {
		if _, err := h.Sweep(ctx); err != nil && ctx.Err() == nil {
			h.logger.Warn("host sweep failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.cfg.SweepInterval):
		}
	}
}

// context is cancelled when the host stops.
func (h *Host) context() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Sweep destroys the leases on the host that no workflow holds
// (workflows.SweepHost), as the host does when it starts and every
// SweepInterval.
func (h *Host) Sweep(ctx context.Context) (workflows.HostSweep, error) {
	sweep, err := workflows.SweepHost(ctx, h.c, h.ledger, h.cfg.SweepSettle)
	if len(sweep.Destroyed) > 0 {
		h.logger.Warn("swept leases no workflow holds", "destroyed", sweep.Destroyed)
	}
	for _, k := range sweep.Kept {
		h.logger.Info("sweep left a lease alone", "lease", k.ID, "reason", k.Reason)
	}
	return sweep, err
}

// Leases is how many leases the host holds, as far as it knows.
func (h *Host) Leases() int { return h.ledger.leases() }

// Drain stops the host taking new leases: its placement worker stops, and
// it goes on with the leases it holds. Drained is closed once it holds
// none.
func (h *Host) Drain() {
	select {
	case <-h.draining:
		return
	default:
	}
	close(h.draining)
	h.gate.drain()
	// The polls already out would still take a create each: stop them.
	// A create under way ends first (Config.StopTimeout).
	h.placement.Stop()
	h.logger.Info("draining: taking no new lease", "leases", h.ledger.leases())
	h.counted(h.ledger.leases())
}

// Drained is closed once the host, draining, holds no lease.
func (h *Host) Drained() <-chan struct{} { return h.drained }

// Run starts the host and runs it until interruptCh delivers, then stops
// it, as worker.Worker's Run does.
func (h *Host) Run(interruptCh <-chan any) error {
	if err := h.Start(); err != nil {
		return err
	}
	<-interruptCh
	h.Stop()
	return nil
}

// Stop stops the host's workers and loops. Running commands are detached,
// not killed (see Config.StopTimeout): the next attempt on the host's
// queue, after a restart, re-attaches to them.
func (h *Host) Stop() {
	h.stopOnce.Do(func() {
		close(h.stop)
		h.placement.Stop()
		h.shared.Stop()
		h.own.Stop()
		h.loops.Wait()
	})
}

// newProvider is the CreateOS provider of cfg, whose secrets a lease's
// SecretEnv reads as a command's do.
func newProvider(cfg *Config) (*createos.Client, error) {
	if cfg.Sandbox.Secrets == nil {
		cfg.Sandbox.Secrets = activities.EnvSecrets{Prefix: cfg.SecretPrefix}
	}
	provider, err := createos.New(cfg.Sandbox)
	if err != nil {
		return nil, fmt.Errorf("sandbox provider: %w", err)
	}
	return provider, nil
}

// workerOptions are the options every worker of the app starts from.
func workerOptions(cfg Config) worker.Options {
	opts := cfg.Options
	opts.WorkerStopTimeout = cfg.StopTimeout
	if opts.MaxHeartbeatThrottleInterval == 0 {
		// Heartbeats carry cancellation to running commands; send them
		// often enough that a cancel takes seconds, not most of a heartbeat
		// timeout.
		opts.MaxHeartbeatThrottleInterval = 2 * time.Second
	}
	return opts
}
