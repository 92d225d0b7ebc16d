package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLeaseRows(t *testing.T) {
	ms := func(v ...time.Duration) []time.Duration {
		for i := range v {
			v[i] *= time.Millisecond
		}
		return v
	}
	rows := leaseRows(leaseSamples{
		execute: ms(9, 11, 10), direct: ms(2, 3, 4), lifecycle: ms(60, 40, 45), bwrap: ms(6, 5, 4),
		fork: ms(300, 200), cp: ms(100, 50),
	})
	require.Len(t, rows, 4)
	md := Report{Rows: rows}.Markdown()
	for _, line := range []string{
		"| P6 latency, median: Execute(`true`) on an existing lease, direct provider | 10.0 ms | 5.00 ms (`bwrap --unshare-all … true`) | 2.00× | ≤ 2× | met |\n",
		"| P6 latency, median: POST /exec of `true` on an existing lease, sandbox server's API | 3.00 ms | 5.00 ms (`bwrap --unshare-all … true`) | 0.60× | — | info |\n",
		"| P6 latency, median: create + destroy of a lease, direct provider | 45.0 ms | 5.00 ms (`bwrap --unshare-all … true`) | 9.00× | ≤ 50 ms | met |\n",
		"| P6 latency, median: fork of a paused lease with 100 MiB in its upper layer, until running | 200 ms | 50.0 ms (`cp -a` of 100 MiB on the host) | 4.00× | — | info |\n",
	} {
		assert.Contains(t, md, line)
	}
}

func TestSandboxAPIErrorsKeepTheKeyOut(t *testing.T) {
	const key = "sk-secret-123"
	var gotKey string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey = r.Header.Get("X-Api-Key")
		http.Error(w, `{"status":"error","error":"only a paused sandbox can be forked"}`, http.StatusConflict)
	}))
	defer srv.Close()
	_, err := SandboxAPI{URL: srv.URL, Key: key}.fork(context.Background(), "sb-1")
	require.Error(t, err)
	assert.Equal(t, key, gotKey)
	assert.Contains(t, err.Error(), "fork sb-1: 409 Conflict")
	assert.NotContains(t, err.Error(), key)
}

func TestSandboxAPIFork(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/v1/sandboxes/sb-1/fork", r.URL.Path)
		w.Write([]byte(`{"status":"success","data":{"id":"sb-2","status":"forking","forked_from":"sb-1"}}`))
	}))
	defer srv.Close()
	id, err := SandboxAPI{URL: srv.URL}.fork(context.Background(), "sb-1")
	require.NoError(t, err)
	assert.Equal(t, "sb-2", id)

	_, err = SandboxAPI{URL: srv.URL}.fork(context.Background(), "../x")
	assert.Error(t, err, "a bad id fails before anything is sent")
}
