package createos

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// assertNothingLeaks checks an error's text against everything it must
// never hold.
func assertNothingLeaks(t *testing.T, err error, secrets ...string) {
	t.Helper()
	for _, s := range append(secrets, testKey, bodySecret, "/v1", "/sandboxes", "http://") {
		assert.NotContains(t, err.Error(), s)
	}
}

func TestUnauthorizedErrorHasNoSecrets(t *testing.T) {
	f := newFakeServer(t)
	const wrongKey = "wrong-key-5a5a"
	c, err := New(Config{BaseURL: f.srv.URL, APIKey: wrongKey})
	require.NoError(t, err)
	lease := f.newLease()

	_, err = c.GetLease(t.Context(), lease.ID)
	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusUnauthorized, api.Status)
	assert.Equal(t, "get sandbox: HTTP 401", err.Error())

	_, err = c.Execute(t.Context(), lease, sandbox.Command{Argv: []string{"true"}, Env: map[string]string{"TOKEN": "env-secret"}}, nil)
	require.ErrorAs(t, err, &api, "a 401 on create proves nothing was created")
	assert.Contains(t, err.Error(), "HTTP 401")
	assertNothingLeaks(t, err, wrongKey, "env-secret")

	for _, rq := range f.requests("") {
		assert.Equal(t, wrongKey, rq.Header.Get("X-Api-Key"), "every request carries the key")
	}
}

func TestRedirectsAreNotFollowed(t *testing.T) {
	f := newFakeServer(t)
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		http.Redirect(w, r, "/v1/sandboxes?stolen=1", http.StatusTemporaryRedirect)
		return true
	})
	c := newTestClient(t, f)

	_, err := c.GetLease(t.Context(), f.newLease().ID)

	var api *sandbox.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, http.StatusTemporaryRedirect, api.Status)
	assert.Equal(t, []string{"getSandbox"}, f.routes())
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there any more
	c, err := New(Config{BaseURL: "http://" + addr, APIKey: testKey})
	require.NoError(t, err)

	_, err = c.GetLease(t.Context(), "sb-1")

	var unavailable *sandbox.UnavailableError
	require.ErrorAs(t, err, &unavailable)
	assert.Equal(t, "get sandbox", unavailable.Operation)
	assert.True(t, sandbox.Retryable(err))
	assert.True(t, strings.HasPrefix(err.Error(), "get sandbox: sandbox server unavailable"), err.Error())
	assertNothingLeaks(t, err)
}

func TestResponsesOutsideTheEnvelopeAreProtocolErrors(t *testing.T) {
	f := newFakeServer(t)
	answers := []string{
		`not json`,
		`{"status":"error","data":{}}`,
		`{"status":"success"}`,
		`{"status":"success","data":"sb-1"}`,
		`{"status":"success","data":{"id":7}}`,
	}
	f.on("getSandbox", func(w http.ResponseWriter, r *http.Request, n int) bool {
		w.Write([]byte(answers[n-1]))
		return true
	})
	c := newTestClient(t, f)
	lease := f.newLease()

	for range answers {
		_, err := c.GetLease(t.Context(), lease.ID)
		var protocol *sandbox.ProtocolError
		require.ErrorAs(t, err, &protocol)
		assert.Equal(t, sandbox.InvalidResponse, protocol.Kind)
		assertNothingLeaks(t, err, "not json")
	}
}
