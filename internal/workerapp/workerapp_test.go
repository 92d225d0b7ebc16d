package workerapp

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/metrics"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

func parse(t *testing.T, env map[string]string, args ...string) *Config {
	t.Helper()
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	cfg := Flags(fs, func(name string) string { return env[name] })
	require.NoError(t, fs.Parse(args))
	return cfg
}

func TestMetricsListenFlag(t *testing.T) {
	assert.Equal(t, DefaultMetricsListen, parse(t, nil).MetricsListen)
	assert.Equal(t, "0.0.0.0:9100", parse(t, map[string]string{"SANDBOXFLOW_METRICS_LISTEN": "0.0.0.0:9100"}).MetricsListen)
	assert.Empty(t, parse(t, nil, "--metrics-listen=").MetricsListen, "an empty address turns the endpoint off")
}

func TestConfigNeverPrintsTheAPIKey(t *testing.T) {
	const key = "sk-live-0123456789"
	cfg := parse(t, map[string]string{"SANDBOX_API_KEY": key, "SANDBOX_API_URL": "https://sandboxes.example"})
	require.Equal(t, key, cfg.Sandbox.APIKey)
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%d", "%x"} {
		assert.NotContains(t, fmt.Sprintf(verb, *cfg), key, verb)
	}
	assert.Contains(t, fmt.Sprint(*cfg), "https://sandboxes.example")
	assert.Contains(t, fmt.Sprint(*cfg), "[redacted]")

	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("config", "cfg", *cfg)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("config", "cfg", *cfg)
	assert.NotContains(t, text.String(), key)
	assert.NotContains(t, js.String(), key)
	assert.True(t, json.Valid(js.Bytes()))
}

func TestServeMetricsServesTheExposition(t *testing.T) {
	m, err := ServeMetrics("127.0.0.1:0")
	require.NoError(t, err)
	defer m.Close()
	m.Metrics.Handler().Counter(metrics.LeasesCreated).Inc(1)

	resp, err := http.Get(m.URL())
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "sandboxflow_leases_created_total 1")

	addr := strings.TrimSuffix(strings.TrimPrefix(m.URL(), "http://"), "/metrics")
	_, err = ServeMetrics(addr)
	assert.ErrorContains(t, err, addr, "a taken port is named")

	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "Close is idempotent")
}

func TestHostFlags(t *testing.T) {
	plain := parse(t, nil)
	assert.Empty(t, plain.Host, "plain mode unless told")
	assert.Zero(t, plain.HostCapacity)
	cfg := parse(t, map[string]string{"SANDBOXFLOW_HOST": "h1", "SANDBOXFLOW_HOST_CAPACITY": "8"}, "--sweep-interval", "1m")
	assert.Equal(t, "h1", cfg.Host)
	assert.Equal(t, 8, cfg.HostCapacity)
	assert.Equal(t, time.Minute, cfg.SweepInterval)
	assert.Equal(t, "h2", parse(t, map[string]string{"SANDBOXFLOW_HOST": "h1"}, "--host", "h2").Host)

	for _, bad := range []Config{{Host: "no/slash"}, {Host: "h1", HostCapacity: -1}} {
		_, err := NewHost(nil, bad)
		assert.Error(t, err, "%+v", bad)
	}
}

// Plain-text input is refused unless the operator allows it, by flag or
// environment, and the worker's converter follows the choice.
func TestAllowPlaintextInputFlag(t *testing.T) {
	assert.False(t, parse(t, nil).AllowPlaintextInput, "refused unless told")
	assert.True(t, parse(t, nil, "--allow-plaintext-input").AllowPlaintextInput)
	assert.True(t, parse(t, map[string]string{codec.EnvAllowPlaintext: "1"}).AllowPlaintextInput)

	keys, err := codec.GenerateKeys("k1")
	require.NoError(t, err)
	plain, err := converter.GetDefaultDataConverter().ToPayload(workflows.Request{Command: sandbox.Command{Argv: []string{"true"}}})
	require.NoError(t, err)
	for _, allow := range []bool{false, true} {
		var req workflows.Request
		require.NoError(t, Config{AllowPlaintextInput: allow}.DataConverter(keys).FromPayload(plain, &req))
		if allow {
			assert.NoError(t, req.Validate(), "allowed")
		} else {
			assert.ErrorContains(t, req.Validate(), "plaintext input")
		}
	}
}
