package workerapp

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sandboxflow/sandboxflow/metrics/prom"
)

// DefaultMetricsListen is where the worker serves /metrics unless told
// otherwise.
const DefaultMetricsListen = "127.0.0.1:9090"

// MetricsServer serves a worker's metrics to Prometheus at /metrics.
type MetricsServer struct {
	// Metrics holds the metrics served: set Metrics.Handler() as the
	// MetricsHandler of the worker's client.
	Metrics *prom.Prometheus

	url       string
	srv       *http.Server
	served    chan error
	closeOnce sync.Once
	closeErr  error
}

// ServeMetrics binds addr (host:port; port 0 picks one) and serves a new
// prom.Prometheus at /metrics there until Close. A taken port fails
// here, naming it.
func ServeMetrics(addr string) (*MetricsServer, error) {
	p, err := prom.NewPrometheus()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", p.HTTPHandler())
	m := &MetricsServer{
		Metrics: p,
		url:     "http://" + ln.Addr().String() + "/metrics",
		srv:     &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		served:  make(chan error, 1),
	}
	go func() { m.served <- m.srv.Serve(ln) }()
	return m, nil
}

// URL is the endpoint's address, like http://127.0.0.1:9090/metrics.
func (m *MetricsServer) URL() string { return m.url }

// Close stops serving and releases the port. Later calls return the first
// call's result.
func (m *MetricsServer) Close() error {
	m.closeOnce.Do(func() {
		err := m.srv.Close()
		if served := <-m.served; !errors.Is(served, http.ErrServerClosed) {
			err = errors.Join(err, served)
		}
		if err != nil {
			m.closeErr = fmt.Errorf("metrics endpoint: %w", err)
		}
	})
	return m.closeErr
}
