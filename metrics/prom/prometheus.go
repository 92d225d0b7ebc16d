// Package prom makes a worker's metrics readable by Prometheus: the
// Temporal SDK's own (temporal_request_total, temporal_activity_execution_latency_seconds,
// temporal_workflow_task_schedule_to_start_latency_seconds, …) and
// sandboxflow's, named by the constants of package metrics, which the
// activities record through the same SDK handler. It is a package of its
// own so that importing the activities or the workflows never links
// OpenTelemetry or the Prometheus client: only a worker that serves
// /metrics does.
//
// A Prometheus is self-contained: an OpenTelemetry MeterProvider whose
// only reader is the OpenTelemetry Prometheus exporter, registered on a
// private Prometheus registry (with the Go runtime and process collectors),
// and nothing global — no otel global provider, no prometheus default
// registry — so two of them in one process (two test stacks) never mix.
//
//	p, err := prom.NewPrometheus()
//	options.MetricsHandler = p.Handler()           // client.Options, before client.Dial
//	http.Handle("/metrics", p.HTTPHandler())
package prom

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/opentelemetry"
)

// meterName is the instrumentation scope of every instrument.
const meterName = "github.com/sandboxflow/sandboxflow"

// SecondsBuckets returns the histogram bounds of every timer, in seconds:
// from a fast RPC (5 ms) to a long command (an hour). OpenTelemetry's
// default bounds (0 to 10000) suit milliseconds, not the SDK's seconds.
func SecondsBuckets() []float64 {
	return []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
}

// Prometheus turns the SDK's metrics handler into a Prometheus endpoint.
type Prometheus struct {
	registry *prometheus.Registry
	provider *sdkmetric.MeterProvider
	handler  client.MetricsHandler

	mu       sync.Mutex
	firstErr error // the first instrument error, see Err
	errCount int
}

// NewPrometheus builds a Prometheus with its own registry and provider.
func NewPrometheus() (*Prometheus, error) {
	registry := prometheus.NewRegistry()
	if err := registry.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("metrics: register the Go collector: %w", err)
	}
	if err := registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("metrics: register the process collector: %w", err)
	}
	exporter, err := otelprom.New(
		otelprom.WithRegisterer(registry),
		// Scope labels on every series and a target_info series tell a
		// single-service endpoint nothing that its scrape job does not.
		otelprom.WithoutScopeInfo(),
		otelprom.WithoutTargetInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("metrics: Prometheus exporter: %w", err)
	}
	p := &Prometheus{registry: registry}
	p.provider = sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(exporter),
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Unit: "s"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: SecondsBuckets()}},
		)),
	)
	p.handler = opentelemetry.NewMetricsHandler(opentelemetry.MetricsHandlerOptions{
		Meter: p.provider.Meter(meterName),
		// Counters only ever grow: export them as Prometheus counters
		// (…_total), not gauges.
		UseMonotonicCounters: true,
		// The SDK handler panics on an instrument error by default; a
		// metric is never worth a worker.
		OnError: p.recordError,
	})
	return p, nil
}

// Handler is the SDK metrics handler to set as client.Options.MetricsHandler
// on the client that workers (and so their activities) use.
func (p *Prometheus) Handler() client.MetricsHandler { return p.handler }

// HTTPHandler serves the Prometheus text exposition of every metric: mount
// it at /metrics. A collector that fails is reported in the response and
// does not hide the others.
func (p *Prometheus) HTTPHandler() http.Handler {
	return promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Registry is the private registry, to register more collectors on it.
func (p *Prometheus) Registry() *prometheus.Registry { return p.registry }

// Err reports instrument errors (an instrument name the meter rejects):
// the metric is dropped, the rest goes on. Nil when there were none.
func (p *Prometheus) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.firstErr == nil {
		return nil
	}
	return fmt.Errorf("metrics: %d instrument errors, the first: %w", p.errCount, p.firstErr)
}

// Shutdown stops the meter provider; the endpoint then serves only the
// runtime collectors.
func (p *Prometheus) Shutdown(ctx context.Context) error {
	if err := p.provider.Shutdown(ctx); err != nil && !errors.Is(err, sdkmetric.ErrReaderShutdown) {
		return fmt.Errorf("metrics: shut down: %w", err)
	}
	return nil
}

func (p *Prometheus) recordError(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errCount++
	if p.firstErr == nil {
		p.firstErr = err
	}
}
