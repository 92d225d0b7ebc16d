package temporalserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync"

	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/membership/static"
	"go.temporal.io/server/common/primitives"
	"go.temporal.io/server/temporal"
)

const clusterName = "active"

// Server is a running Temporal server: frontend, history, matching and
// worker services in this process, SQLite persistence and, optionally, the
// Web UI.
type Server struct {
	namespace        string
	frontendHostPort string
	uiURL            string // "" without UI

	temporal temporal.Server
	ui       *webUI // nil without UI
	logger   serverLogger

	stopOnce sync.Once
	stopErr  error
}

// Start starts a Temporal server and returns once it accepts requests, with
// the namespace and its search attributes ready to use. A port that is
// taken fails with a *PortInUseError before anything else happens.
//
// Cancelling ctx aborts the preparation of the database; the Temporal
// services' own start (well under a second) is not interruptible.
func Start(ctx context.Context, opts Options) (_ *Server, err error) {
	opts, err = opts.withDefaults()
	if err != nil {
		return nil, err
	}

	// Ports first: a taken port is the most likely failure, and it should
	// be reported before a database file is created or modified.
	var uiLn net.Listener
	if opts.UIPort != NoUI {
		if uiLn, err = listen("UI", opts.IP, opts.UIPort); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = uiLn.Close()
			}
		}()
	}
	ports, err := pickPorts(opts.IP, opts.FrontendPort)
	if err != nil {
		return nil, err
	}

	db := sqliteConfig(opts.DBFile)
	if opts.DBFile != "" {
		if err := prepareDBFile(db); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := ensureNamespace(ctx, db, opts.Namespace, opts.SearchAttributes); err != nil {
		return nil, err
	}

	logger := newServerLogger(slog.New(newLevelFilter(opts.LogLevel, opts.Logger.Handler())))
	ts, err := newTemporalServer(opts, ports, db, logger)
	if err != nil {
		return nil, err
	}
	if err := ts.Start(); err != nil {
		logger.stopping.Store(true)
		_ = ts.Stop() // stops what did start; its own errors would only add noise
		return nil, fmt.Errorf("temporalserver: start: %w", err)
	}
	s := &Server{
		namespace:        opts.Namespace,
		frontendHostPort: hostPort(opts.IP, ports.grpc[primitives.FrontendService]),
		temporal:         ts,
		logger:           logger,
	}
	if uiLn != nil {
		if s.ui, err = startWebUI(uiLn, s.frontendHostPort, opts.Namespace, opts.CodecEndpoint); err != nil {
			return nil, errors.Join(err, s.Stop())
		}
		s.uiURL = "http://" + uiLn.Addr().String()
	}
	return s, nil
}

// FrontendHostPort is the host:port that SDK clients and workers dial
// (client.Options.HostPort).
func (s *Server) FrontendHostPort() string { return s.frontendHostPort }

// UIURL is the Web UI's base URL, like http://127.0.0.1:8233, or "" when
// the server runs without UI.
func (s *Server) UIURL() string { return s.uiURL }

// Namespace is the namespace Start made ready.
func (s *Server) Namespace() string { return s.namespace }

// RunURL returns the Web UI page of one workflow run (its event history),
// or "" when the server runs without UI.
func (s *Server) RunURL(workflowID, runID string) string {
	if s.uiURL == "" {
		return ""
	}
	return s.uiURL + "/namespaces/" + url.PathEscape(s.namespace) +
		"/workflows/" + url.PathEscape(workflowID) + "/" + url.PathEscape(runID) + "/history"
}

// Stop stops the UI and the Temporal services and releases their ports, so
// that a new server can start on the same ports and database file. Workers
// and clients connected to the server should be stopped first. Stop is
// idempotent: later calls return the first call's result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.logger.stopping.Store(true)
		var uiErr error
		if s.ui != nil {
			uiErr = s.ui.stop()
		}
		s.stopErr = errors.Join(uiErr, s.temporal.Stop())
		if s.stopErr != nil {
			s.stopErr = fmt.Errorf("temporalserver: stop: %w", s.stopErr)
		}
	})
	return s.stopErr
}

// servicePorts are the ports the Temporal services bind.
type servicePorts struct {
	grpc         map[primitives.ServiceName]int
	frontendHTTP int // the frontend's HTTP API (and Nexus endpoints)
}

// pickPorts checks that frontendPort is free (or picks one when it is 0)
// and picks free ports for everything else.
func pickPorts(ip string, frontendPort int) (servicePorts, error) {
	ports := servicePorts{grpc: map[primitives.ServiceName]int{}}
	for _, svc := range []primitives.ServiceName{
		primitives.FrontendService, primitives.HistoryService,
		primitives.MatchingService, primitives.WorkerService,
	} {
		want, name := 0, "internal "+string(svc)
		if svc == primitives.FrontendService {
			want, name = frontendPort, "frontend"
		}
		port, err := reservePort(name, ip, want)
		if err != nil {
			return ports, err
		}
		ports.grpc[svc] = port
	}
	var err error
	ports.frontendHTTP, err = reservePort("frontend HTTP", ip, 0)
	return ports, err
}

func newTemporalServer(opts Options, ports servicePorts, db *config.SQL, logger serverLogger) (temporal.Server, error) {
	frontend := hostPort(opts.IP, ports.grpc[primitives.FrontendService])
	frontendHTTP := hostPort(opts.IP, ports.frontendHTTP)

	cfg := &config.Config{}
	// Membership is static (WithStaticHosts below): no ringpop, no gossip port.
	cfg.Global.Membership.BroadcastAddress = opts.IP
	cfg.Persistence = config.Persistence{
		DefaultStore:     "sqlite",
		VisibilityStore:  "sqlite",
		NumHistoryShards: 1, // one process, one SQLite connection: more shards only cost memory
		DataStores:       map[string]config.DataStore{"sqlite": {SQL: db}},
	}
	cfg.ClusterMetadata = &cluster.Config{
		FailoverVersionIncrement: 10,
		MasterClusterName:        clusterName,
		CurrentClusterName:       clusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			clusterName: {Enabled: true, InitialFailoverVersion: 1, RPCAddress: frontend, HTTPAddress: frontendHTTP},
		},
	}
	cfg.DCRedirectionPolicy.Policy = "noop"
	cfg.Services = map[string]config.Service{}
	hosts := map[primitives.ServiceName]static.Hosts{}
	for svc, port := range ports.grpc {
		rpc := config.RPC{GRPCPort: port, BindOnIP: opts.IP}
		if svc == primitives.FrontendService {
			// Without it the server warns at every start that Nexus is off.
			rpc.HTTPPort = ports.frontendHTTP
		}
		cfg.Services[string(svc)] = config.Service{RPC: rpc}
		hosts[svc] = static.SingleLocalHost(hostPort(opts.IP, port))
	}
	cfg.Archival.History.State = "disabled"
	cfg.Archival.Visibility.State = "disabled"
	cfg.NamespaceDefaults.Archival.History.State = "disabled"
	cfg.NamespaceDefaults.Archival.Visibility.State = "disabled"
	// The worker service's system workflows dial the frontend here.
	cfg.PublicClient.HostPort = frontend

	// No authorizer: every request is allowed, as on `temporal server start-dev`.
	ts, err := temporal.NewServer(
		temporal.WithConfig(cfg),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(hosts),
		temporal.WithLogger(logger),
		temporal.WithDynamicConfigClient(dynamicConfig()),
	)
	if err != nil {
		return nil, fmt.Errorf("temporalserver: %w", err)
	}
	return ts, nil
}

// dynamicConfig is the server's tuning; every other setting keeps the
// production default, so what works here works on a real cluster.
func dynamicConfig() dynamicconfig.StaticClient {
	return dynamicconfig.StaticClient{
		// Visibility APIs (list/count workflows) default to 10 requests per
		// second per namespace: the Web UI alone can exceed that when it
		// refreshes, and tests poll list queries.
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key(): 100,

		// Background scanners clean up a production cluster's task queues
		// and orphaned history branches: pointless on a dev database. Worse,
		// the server never stops their SDK workers, nor the parent close
		// policy processor's: they outlive Stop, keep polling a closed port
		// (logging warnings) and, once a server restarts on the same port,
		// poll it with clients of the stopped one. Without the processor,
		// history applies parent close policies itself, as it already does
		// below system.parentClosePolicyThreshold children.
		dynamicconfig.TaskQueueScannerEnabled.Key():       false,
		dynamicconfig.HistoryScannerEnabled.Key():         false,
		dynamicconfig.EnableParentClosePolicyWorker.Key(): false,

		// History's task schedulers default to hundreds of workers each
		// (512 for timer, transfer and visibility tasks, 640 for replication,
		// which a single cluster never uses): ~2200 of an idle server's ~2800
		// goroutines. A dev server with one SQLite connection gains nothing
		// from them, and the race detector aborts a process past 8128 live
		// goroutines, i.e. at three servers in one test binary.
		dynamicconfig.TimerProcessorSchedulerWorkerCount.Key():                  16,
		dynamicconfig.TransferProcessorSchedulerWorkerCount.Key():               16,
		dynamicconfig.VisibilityProcessorSchedulerWorkerCount.Key():             16,
		dynamicconfig.ReplicationProcessorSchedulerWorkerCount.Key():            1,
		dynamicconfig.ReplicationLowPriorityProcessorSchedulerWorkerCount.Key(): 1,

		// History's queues load their tasks at most 20 times a second per
		// shard: a cluster spreads that over hundreds of shards, this server
		// has one. At 20 a second, a dispatch (every workflow and activity
		// task goes through the transfer queue) waits for its turn once a
		// few runs have drained the limiter's burst: a workflow of three
		// no-op activities then takes ~200 ms instead of ~35 ms.
		dynamicconfig.TransferProcessorMaxPollRPS.Key():   1000,
		dynamicconfig.TimerProcessorMaxPollRPS.Key():      1000,
		dynamicconfig.VisibilityProcessorMaxPollRPS.Key(): 1000,

		// Eager dispatch, which v1.32 enables by default (older servers
		// did not): an activity that a workflow task schedules comes back
		// in the answer to that task, and a workflow started with
		// EnableEagerStart gets its first task in the answer to the start,
		// both without a trip through matching. Pinned here because the
		// figures of docs/PERFORMANCE.md count on them (P0 counts no activity
		// poll).
		dynamicconfig.EnableActivityEagerExecution.Key(): true,
		dynamicconfig.EnableEagerWorkflowStart.Key():     true,
	}
}

func hostPort(ip string, port int) string {
	return net.JoinHostPort(ip, strconv.Itoa(port))
}
