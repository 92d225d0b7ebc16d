package bench

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTallyCountsSandboxRequestsByRoute(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	var tally Tally
	c := &http.Client{Transport: tally.Transport(http.DefaultTransport)}
	before := tally.Snapshot()
	for _, p := range []string{"/v1/sandboxes", "/v1/sandboxes/sb-1/processes/p-1/connect", "/v1/sandboxes/sb-2/processes/p-9/connect"} {
		resp, err := c.Get(srv.URL + p)
		require.NoError(t, err)
		resp.Body.Close()
	}

	got := since(before, tally.Snapshot())
	assert.Equal(t, tallied{"GET /sandboxes": 1, "GET /sandboxes/{id}/processes/{id}/connect": 2}, got)
	assert.Equal(t, 3, got.total())
	assert.Equal(t, "GET /sandboxes/{id}/processes/{id}/connect 1, GET /sandboxes 0.5", got.per(2))
}
