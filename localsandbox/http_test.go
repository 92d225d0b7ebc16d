package localsandbox

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a log sink that tests read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A field the server does not know is ignored, as the hosted service
// ignores it (a newer SDK adding one must keep working), and logged once
// per name per server; a field of the official API that the server does
// not serve is still refused by name. Before, any unknown field was 400.
func TestUnknownFieldsAreIgnoredAndLoggedOnce(t *testing.T) {
	var logs syncBuffer
	ts := startServer(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	var sb struct{ ID string }
	for range 2 {
		ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "future_field": 1, "another_one": map[string]int{"x": 1}}, &sb)
	}
	ts.mustCall("POST", "/sandboxes", map[string]any{"SHAPE": "s-1vcpu-1gb"}, &sb) // encoding/json's match: no unknown field
	var out struct{ Result execResult }
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "echo", "args": []string{"hi"}, "future_field": true, "timeout_ms": 5}, &out)
	if out.Result.Stdout != "hi\n" {
		t.Errorf("exec with unknown fields: %+v", out.Result)
	}
	// A long name is logged cut short, as error messages quote a request.
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", strings.Repeat("z", 100): 1}, &sb)
	log := logs.String()
	if longestRun([]byte(log)) > maxEcho {
		t.Errorf("the log quotes more than %d bytes of a field name:\n%s", maxEcho, log)
	}
	for field, want := range map[string]int{"future_field": 1, "another_one": 1, "timeout_ms": 1, "SHAPE": 0, "shape": 0} {
		if got := strings.Count(log, "field="+field+" "); got != want {
			t.Errorf("%s logged %d times, want %d:\n%s", field, got, want, log)
		}
	}
	for _, tc := range []struct {
		path  string
		body  map[string]any
		field string
	}{
		{"/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "networks": []map[string]string{{"id": "n"}}, "future_field": 1}, "networks"},
		{"/sandboxes/" + sb.ID + "/exec", map[string]any{"cmd": "true", "pty": map[string]int{"rows": 24, "cols": 80}}, "pty"},
	} {
		if status, body := ts.rawCall("POST", tc.path, tc.body); status != http.StatusBadRequest || !strings.Contains(body, `"code":"UNSUPPORTED"`) || !strings.Contains(body, tc.field) {
			t.Errorf("POST %s with %s: %d %s, want 400 UNSUPPORTED naming it", tc.path, tc.field, status, body)
		}
	}
}
