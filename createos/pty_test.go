package createos

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/stretchr/testify/require"
)

// A terminal's output stream that breaks is reopened after the last byte
// shown: nothing twice, nothing lost, then the exit. Resize and input
// send what the API names, and a bad size is refused before any request.
func TestTerminalFollowResumesAfterTheLastByteShown(t *testing.T) {
	var mu sync.Mutex
	var afters, bodies []string
	frame := func(seq int, s string) string {
		return fmt.Sprintf(`{"type":"data","seq":%d,"stream":"pty","data_base64":"%s"}`+"\n", seq, base64.StdEncoding.EncodeToString([]byte(s)))
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/v1/sandboxes/sb-1/processes":
			bodies = append(bodies, string(body))
			fmt.Fprint(w, `{"status":"success","data":{"process_id":"proc-1","kind":"pty"}}`)
		case "/v1/sandboxes/sb-1/processes/proc-1/connect":
			after := r.URL.Query().Get("after")
			afters = append(afters, after)
			w.Header().Set("Content-Type", "application/x-ndjson")
			switch after {
			case "0": // breaks after the first frame
				fmt.Fprint(w, frame(1, "$ echo hi\r\n"))
			case "1":
				fmt.Fprint(w, `{"type":"heartbeat"}`+"\n"+frame(2, "hi\r\n")+`{"type":"exit","exit_code":3}`+"\n")
			}
		case "/v1/sandboxes/sb-1/processes/proc-1/resize", "/v1/sandboxes/sb-1/processes/proc-1/input":
			bodies = append(bodies, string(body))
			fmt.Fprint(w, `{"status":"success","data":{"ok":true}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, err := New(Config{BaseURL: srv.URL, APIKey: "test-key"})
	require.NoError(t, err)
	ctx := context.Background()

	_, err = c.OpenTerminal(ctx, "sb-1", TerminalSpec{Rows: 0, Cols: 80})
	require.True(t, sandbox.IsInvalidInputError(err), "a bad size: %v", err)
	term, err := c.OpenTerminal(ctx, "sb-1", TerminalSpec{Rows: 24, Cols: 80})
	require.NoError(t, err)
	require.NoError(t, term.Resize(ctx, 40, 100))
	require.NoError(t, term.Input(ctx, []byte("\x03")))

	var screen bytes.Buffer
	exit, err := term.Follow(ctx, &screen)
	require.NoError(t, err)
	require.Equal(t, TerminalExit{Code: 3}, exit)
	require.Equal(t, "$ echo hi\r\nhi\r\n", screen.String())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"0", "1"}, afters)
	require.Equal(t, []string{`{"pty":{"cols":80,"rows":24}}`, `{"cols":100,"rows":40}`, `{"data_base64":"Aw=="}`}, bodies)
}
