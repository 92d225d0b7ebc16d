package prom

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/metrics"
)

func scrape(t *testing.T, p *Prometheus) string {
	t.Helper()
	srv := httptest.NewServer(p.HTTPHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

func TestHandlerMetricsReachTheExposition(t *testing.T) {
	p, err := NewPrometheus()
	require.NoError(t, err)
	h := p.Handler().WithTags(map[string]string{"activity_type": "sandboxflow.Execute"})
	h.Counter(metrics.LeasesCreated).Inc(2)
	h.WithTags(map[string]string{metrics.TagStream: "stdout"}).Counter(metrics.OutputBytes).Inc(1234)
	h.Timer(metrics.CommandDuration).Record(1500 * time.Millisecond)
	h.Gauge("temporal_worker_task_slots_available").Update(3)

	text := scrape(t, p)
	assert.Contains(t, text, "# TYPE sandboxflow_leases_created_total counter")
	assert.Contains(t, text, `sandboxflow_leases_created_total{activity_type="sandboxflow.Execute"} 2`)
	assert.Contains(t, text, `sandboxflow_output_bytes_total{activity_type="sandboxflow.Execute",stream="stdout"} 1234`)
	assert.Contains(t, text, "# TYPE sandboxflow_command_duration_seconds histogram")
	assert.Contains(t, text, `sandboxflow_command_duration_seconds_bucket{activity_type="sandboxflow.Execute",le="2.5"} 1`,
		"timers use buckets in seconds")
	assert.Contains(t, text, `sandboxflow_command_duration_seconds_bucket{activity_type="sandboxflow.Execute",le="1"} 0`)
	assert.Contains(t, text, "temporal_worker_task_slots_available")
	assert.Contains(t, text, "go_goroutines", "the Go runtime collector")
	assert.NotContains(t, text, "otel_scope_name")
	require.NoError(t, p.Err())
}

func TestTwoPrometheusesDoNotShareState(t *testing.T) {
	a, err := NewPrometheus()
	require.NoError(t, err)
	b, err := NewPrometheus()
	require.NoError(t, err, "no global registry: a second one registers its collectors again")
	a.Handler().Counter(metrics.Compensations).Inc(1)
	assert.Contains(t, scrape(t, a), "sandboxflow_compensations_total 1")
	assert.NotContains(t, scrape(t, b), "sandboxflow_compensations_total")
}

func TestAnInstrumentErrorIsRecordedNotPanicked(t *testing.T) {
	p, err := NewPrometheus()
	require.NoError(t, err)
	p.Handler().Counter("not a valid name!").Inc(1) // OpenTelemetry rejects the name
	assert.ErrorContains(t, p.Err(), "1 instrument errors")
	require.NoError(t, p.Shutdown(t.Context()))
}
