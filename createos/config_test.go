package createos

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRejectsUnsafeBaseURLs(t *testing.T) {
	f := newFakeServer(t)
	host := strings.TrimPrefix(f.srv.URL, "http://") // 127.0.0.1:port, so a request would reach f
	for _, raw := range []string{
		"",
		"http://user:url-secret@" + host,
		"https://url-secret@sandbox.example.com",
		"http://" + host + "?token=url-secret",
		"http://" + host + "/?",
		"http://" + host + "#url-secret",
		"http://" + host + "/#",
		"http://sandbox.example.com",
		"http://10.0.0.1:8080",
		"file:///etc/url-secret",
		"ftp://sandbox.example.com",
		"https:sandbox.example.com",
		"https://",
		"http://" + host + "/api",
		"http://" + host + "/v1/sandboxes",
		"http://" + host + "/v2",
		"://url-secret",
		"http://[::1]:%zz",
	} {
		_, err := New(Config{BaseURL: raw, APIKey: testKey})
		var invalid *sandbox.InvalidInputError
		if assert.ErrorAs(t, err, &invalid, raw) {
			assert.Equal(t, "BaseURL", invalid.Field)
			assert.NotContains(t, err.Error(), "url-secret", raw)
			assert.NotContains(t, err.Error(), testKey)
		}
	}
	assert.Empty(t, f.routes(), "New sends nothing")
}

func TestNewAcceptsOriginsAndNormalisesV1(t *testing.T) {
	for raw, base := range map[string]string{
		"https://sandbox.example.com":          "https://sandbox.example.com/v1",
		"https://sandbox.example.com/":         "https://sandbox.example.com/v1",
		"https://sandbox.example.com/v1":       "https://sandbox.example.com/v1",
		"https://sandbox.example.com:8443/v1/": "https://sandbox.example.com:8443/v1",
		"http://localhost:7070":                "http://localhost:7070/v1",
		"http://127.0.0.1:7070/v1":             "http://127.0.0.1:7070/v1",
		"http://[::1]:7070":                    "http://[::1]:7070/v1",
	} {
		c, err := New(Config{BaseURL: raw, APIKey: testKey})
		require.NoError(t, err, raw)
		assert.Equal(t, base, c.cfg.base, raw)
	}
}

func TestNewRejectsBadKeys(t *testing.T) {
	for _, key := range []string{"", "key\r\nX-Evil: 1", "key\n", "key\x00", "key\x7f"} {
		_, err := New(Config{BaseURL: "https://sandbox.example.com", APIKey: key})
		var invalid *sandbox.InvalidInputError
		require.ErrorAs(t, err, &invalid)
		assert.Equal(t, "APIKey", invalid.Field)
		if key != "" {
			assert.NotContains(t, err.Error(), key)
		}
	}
}

func TestNewDefaults(t *testing.T) {
	c, err := New(Config{BaseURL: "https://sandbox.example.com", APIKey: testKey})
	require.NoError(t, err)
	assert.Equal(t, settings{
		base:              "https://sandbox.example.com/v1",
		key:               testKey,
		shape:             DefaultShape,
		operationTimeout:  30 * time.Second,
		createTimeout:     3 * time.Minute,
		readyTimeout:      2 * time.Minute,
		paceInterval:      300 * time.Millisecond,
		captureBytes:      256 << 10,
		workspace:         "/workspace",
		streamIdleTimeout: 60 * time.Second,
		httpClient:        c.cfg.httpClient,
	}, c.cfg)
	assert.Equal(t, 250*time.Millisecond, c.reconnectDelay)
	assert.Equal(t, 250*time.Millisecond, c.pollInterval)
	assert.Equal(t, 500*time.Millisecond, c.retryBase)
	assert.NotNil(t, c.pace)
}

func TestPaceIntervalIsATriState(t *testing.T) {
	for _, tc := range []struct {
		url      string
		interval time.Duration
		want     time.Duration
	}{
		{"https://sandbox.example.com", 0, DefaultPaceInterval},
		{"https://sandbox.example.com", -1, 0},
		{"https://sandbox.example.com", time.Second, time.Second},
		{"http://127.0.0.1:7070", 0, 0},
		{"http://localhost:7070", 0, 0},
		{"http://127.0.0.1:7070", 300 * time.Millisecond, 300 * time.Millisecond},
	} {
		c, err := New(Config{BaseURL: tc.url, APIKey: testKey, PaceInterval: tc.interval})
		require.NoError(t, err)
		assert.Equal(t, tc.want, c.cfg.paceInterval, "%s %v", tc.url, tc.interval)
		assert.Equal(t, tc.want == 0, c.pace == nil)
	}
}

func TestNewRejectsBadSettings(t *testing.T) {
	for field, cfg := range map[string]Config{
		"OperationTimeout":  {OperationTimeout: -time.Second},
		"CreateTimeout":     {CreateTimeout: -time.Second},
		"ReadyTimeout":      {ReadyTimeout: -time.Second},
		"StreamIdleTimeout": {StreamIdleTimeout: -time.Second},
		"CaptureBytes":      {CaptureBytes: -1},
		"Workspace":         {Workspace: "relative/dir"},
	} {
		cfg.BaseURL, cfg.APIKey = "https://sandbox.example.com", testKey
		_, err := New(cfg)
		var invalid *sandbox.InvalidInputError
		require.ErrorAs(t, err, &invalid, field)
		assert.Equal(t, field, invalid.Field)
	}
}

func TestNewDoesNotChangeTheCallersHTTPClient(t *testing.T) {
	hc := &http.Client{Timeout: time.Second}
	c, err := New(Config{BaseURL: "https://sandbox.example.com", APIKey: testKey, HTTPClient: hc})
	require.NoError(t, err)
	assert.Nil(t, hc.CheckRedirect)
	assert.Equal(t, time.Second, hc.Timeout)
	assert.NotNil(t, c.cfg.httpClient.CheckRedirect)
	assert.Zero(t, c.cfg.httpClient.Timeout)
}
