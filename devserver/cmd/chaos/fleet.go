package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// world is what the soak runs on: a stack, and either its own sandbox
// server and worker or a fleet of hosts, each sandbox server behind a fault
// proxy.
type world struct {
	stack   *stack.Stack
	servers []*localsandbox.Server
	proxies []*faultproxy.Proxy
	hosts   []*stack.Host // a fleet's
	kills   int           // hosts killed
}

// startStack is the plain world: one sandbox server and a plain worker.
func startStack(ctx context.Context, cfg config, sandboxOpts localsandbox.Options, worker workerapp.Config, logger *slog.Logger) (*world, error) {
	s, err := stack.Start(ctx, stack.Options{
		Temporal:       temporalserver.Options{UIPort: temporalserver.NoUI, Logger: logger, LogLevel: slog.LevelError},
		Sandbox:        sandboxOpts,
		FaultProxy:     true,
		FaultProxySeed: cfg.seed,
		Worker:         worker,
		Logger:         logger,
	})
	if err != nil {
		return nil, err
	}
	return &world{stack: s, servers: []*localsandbox.Server{s.Sandbox}, proxies: []*faultproxy.Proxy{s.Proxy}}, nil
}

// fleetSweepInterval is how often the soak's hosts sweep: the orphans of
// creates whose retry landed on another host wait that long at most.
const fleetSweepInterval = 20 * time.Second

// startFleet is a fleet of cfg.hosts hosts, each with a sandbox server of
// its own (a directory of sandboxOpts.Root), a fault proxy seeded with
// cfg.seed plus its number, and a worker in host mode.
func startFleet(ctx context.Context, cfg config, sandboxOpts localsandbox.Options, worker workerapp.Config, logger *slog.Logger) (_ *world, err error) {
	s, err := stack.Start(ctx, stack.Options{
		Temporal:  temporalserver.Options{UIPort: temporalserver.NoUI, Logger: logger, LogLevel: slog.LevelError},
		NoSandbox: true,
		NoWorker:  true,
		Logger:    logger,
	})
	if err != nil {
		return nil, err
	}
	w := &world{stack: s}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	worker.HostCapacity, worker.SweepInterval, worker.SweepSettle = cfg.capacity, fleetSweepInterval, 2*time.Second
	worker.Logger = logger
	for i := range cfg.hosts {
		opts := sandboxOpts
		opts.Root = filepath.Join(sandboxOpts.Root, fmt.Sprintf("host-%d", i))
		if err := os.MkdirAll(opts.Root, 0o711); err != nil {
			return nil, err
		}
		h, err := s.AddHost(ctx, stack.HostOptions{
			Name: fmt.Sprintf("host-%d", i), Sandbox: opts, Worker: worker,
			FaultProxy: true, FaultProxySeed: cfg.seed + uint64(i),
		})
		if err != nil {
			return nil, err
		}
		w.hosts = append(w.hosts, h)
		w.servers = append(w.servers, h.Sandbox)
		w.proxies = append(w.proxies, h.Proxy)
	}
	return w, nil
}

// describe says what the world is, for the soak's first line.
func (w *world) describe(cfg config) string {
	if len(w.hosts) == 0 {
		return ""
	}
	out := fmt.Sprintf(", a fleet of %d hosts of %d leases", len(w.hosts), cfg.capacity)
	if cfg.killEvery > 0 {
		out += fmt.Sprintf(", one at a time killed for %s, %s after the last came back", hostDown, cfg.killEvery)
	}
	return out
}

// hostDown is how long a killed host stays down: long enough for the runs
// on it to find it lost, and the leases they held there to be given up.
const hostDown = hostStart + hostHeartbeat + 5*time.Second

// killHosts kills a host cfg.killEvery after the last one came back, in
// turn, and brings it back hostDown later, until the function it returns
// is called; that brings back the host down, if any, and has every host
// sweep what no workflow holds: the leases given up with a lost host, and the orphans of
// creates whose retry landed on another host.
func (w *world) killHosts(cfg config) (stop func(context.Context) error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var returnErr error
	killing := cfg.killEvery > 0 && len(w.hosts) > 1
	wg.Go(func() {
		for i := 0; killing; i++ {
			select {
			case <-done:
				return
			case <-time.After(cfg.killEvery):
			}
			h := w.hosts[i%len(w.hosts)]
			fmt.Fprintf(os.Stderr, "chaos: killing %s\n", h.Name)
			h.Kill()
			w.kills++
			select {
			case <-done:
			case <-time.After(hostDown):
			}
			fmt.Fprintf(os.Stderr, "chaos: %s returns\n", h.Name)
			if err := h.Return(context.Background()); err != nil {
				returnErr = err
				return
			}
		}
	})
	return func(ctx context.Context) error {
		close(done)
		wg.Wait()
		if returnErr != nil {
			return returnErr
		}
		// A returning host sweeps at once; the others every interval.
		for _, h := range w.hosts {
			if _, err := h.Worker().Sweep(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "chaos: the sweep of %s: %v\n", h.Name, err)
			}
		}
		return nil
	}
}
