package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// plainTextRun is a command whose input and output are each marked with
// strings that occur nowhere else: the argv, an env value, stdin, and a
// stdout line that the command assembles (so it is in no input).
type plainTextRun struct {
	argv, env, stdin, stdout string
	outA, outB               string
}

func newPlainTextRun() plainTextRun {
	b := make([]byte, 8)
	rand.Read(b)
	r := hex.EncodeToString(b)
	return plainTextRun{
		argv: "argv-marker-" + r, env: "env-marker-" + r, stdin: "stdin-marker-" + r,
		outA: "out-" + r[:8], outB: r[8:] + "-tuo", stdout: "out-" + r[:8] + r[8:] + "-tuo",
	}
}

// args are the starter's arguments; the command prints the assembled
// stdout marker and the lengths of what it received.
func (p plainTextRun) args(extra ...string) []string {
	return append(extra, "--stdin", "-", "--env", "MARKED="+p.env, "--",
		"sh", "-c", `printf '%s%s %d %d %d\n' "$1" "$2" "${#MARKED}" "$(cat | wc -c)" "${#3}"`, "sh", p.outA, p.outB, p.argv)
}

// wantStdout is what the command prints when every input arrived.
func (p plainTextRun) wantStdout() string {
	return fmt.Sprintf("%s %d %d %d\n", p.stdout, len(p.env), len(p.stdin)+1, len(p.argv))
}

// markers are the strings no stored history may hold in plain text. Stdin
// is bytes, which JSON carries in base64: its marker is that base64.
func (p plainTextRun) markers() []string {
	stdin := base64.StdEncoding.EncodeToString([]byte(p.stdin + "\n"))
	return []string{p.argv, p.env, stdin, p.stdout, p.outA, p.outB, "MARKED"}
}

func TestEncryptedStackStoresCiphertextAndTheUIDecodesIt(t *testing.T) {
	keys, err := codec.GenerateKeys("e2e-1")
	require.NoError(t, err)
	s, _ := startOwnStack(t, stack.Options{Temporal: temporalserver.Options{UIPort: 0}, Codec: keys})
	require.NotEmpty(t, s.CodecURL)
	p := newPlainTextRun()

	code, stdout, stderr, workflowID, runID := runStarterOn(t, s, p.stdin+"\n", p.args()...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, p.wantStdout(), stdout, "the command got its argv, env and stdin, and the starter decoded its output")

	// The server stores ciphertext: a client without the codec reads no
	// input and no output anywhere in the history.
	plain := plainClient(t, s)
	wire, js, events := storedHistory(t, plain, workflowID, runID)
	require.Greater(t, events, 10, "a whole run: the workflow and its activities")
	for _, m := range p.markers() {
		assert.False(t, bytes.Contains(wire, []byte(m)), "%q in the stored history (wire)", m)
		assert.False(t, bytes.Contains(js, []byte(m)), "%q in the stored history (JSON)", m)
	}
	assert.True(t, bytes.Contains(wire, []byte(codec.Encoding)), "the payloads are there, encrypted")
	assert.True(t, bytes.Contains(wire, []byte("e2e-1")), "naming their key id")

	// Without the codec the result cannot be read; with it, it can.
	var res workflows.Result
	assert.Error(t, plain.GetWorkflow(t.Context(), workflowID, runID).Get(t.Context(), &res))
	require.NoError(t, s.Client.GetWorkflow(t.Context(), workflowID, runID).Get(t.Context(), &res))
	assert.Equal(t, p.wantStdout(), res.Stdout)

	// The Web UI is told where the codec server is, the codec server lets
	// the UI's origin in, and decodes the stored result for it.
	ui := s.Temporal.UIURL()
	var settings struct{ Codec struct{ Endpoint string } }
	require.NoError(t, json.Unmarshal(httpGet(t, ui+"/api/v1/settings"), &settings))
	assert.Equal(t, s.CodecURL, settings.Codec.Endpoint)
	assertPreflightAllowed(t, s.CodecURL+"/decode", ui)
	decoded := decodeAsTheUI(t, s.CodecURL, ui, resultPayloads(t, plain, workflowID, runID))
	require.Len(t, decoded, 1)
	assert.Equal(t, "json/plain", string(decoded[0].GetMetadata()[converter.MetadataEncoding]))
	assert.Contains(t, string(decoded[0].GetData()), p.stdout)
}

func TestEncryptedStackEncryptsFailureMessagesButNotTheirTypes(t *testing.T) {
	keys, err := codec.GenerateKeys("e2e-1")
	require.NoError(t, err)
	s, _ := startOwnStack(t, stack.Options{Temporal: temporalserver.Options{UIPort: temporalserver.NoUI}, Codec: keys})

	code, _, stderr, workflowID, runID := runStarterOn(t, s, "", "--shape", "s-no-such-shape", "--", "true")
	require.Equal(t, 125, code)
	assert.Contains(t, stderr, "failed: SandboxAPIError: create sandbox: HTTP 400", "the starter decodes the failure's message")

	wire, js, _ := storedHistory(t, plainClient(t, s), workflowID, runID)
	for _, m := range []string{"create sandbox", "HTTP 400", "s-no-such-shape"} {
		assert.False(t, bytes.Contains(wire, []byte(m)), "%q in the stored history", m)
		assert.False(t, bytes.Contains(js, []byte(m)), "%q in the stored history", m)
	}
	assert.True(t, bytes.Contains(js, []byte(`"type":"SandboxAPIError"`)), "error types stay readable for retry policies")
}

// The scan of the two tests above is not blind: on a stack without the
// codec it finds every marker.
func TestPlainStackStoresPlainTextWhichTheScanFinds(t *testing.T) {
	s := stackOf(t)
	p := newPlainTextRun()
	code, stdout, stderr, workflowID, runID := runStarterOn(t, s, p.stdin+"\n", p.args()...)
	t.Cleanup(func() { assertNothingLeaked(t) })
	require.Equal(t, 0, code, stderr)
	require.Equal(t, p.wantStdout(), stdout)
	wire, _, _ := storedHistory(t, plainClient(t, s), workflowID, runID)
	for _, m := range p.markers() {
		assert.True(t, bytes.Contains(wire, []byte(m)), "%q is in a plain history", m)
	}
}

// resultPayloads are the stored payloads of a closed run's result.
func resultPayloads(t *testing.T, c client.Client, workflowID, runID string) []*commonpb.Payload {
	t.Helper()
	iter := c.GetWorkflowHistory(t.Context(), workflowID, runID, false, enums.HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT)
	require.True(t, iter.HasNext())
	event, err := iter.Next()
	require.NoError(t, err)
	result := event.GetWorkflowExecutionCompletedEventAttributes().GetResult().GetPayloads()
	require.Len(t, result, 1, "a completed run")
	require.Equal(t, codec.Encoding, string(result[0].GetMetadata()[converter.MetadataEncoding]))
	return result
}

// decodeAsTheUI posts payloads to the codec server as the Web UI does from
// the operator's browser.
func decodeAsTheUI(t *testing.T, codecURL, uiOrigin string, payloads []*commonpb.Payload) []*commonpb.Payload {
	t.Helper()
	body, err := protojson.Marshal(&commonpb.Payloads{Payloads: payloads})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, codecURL+"/decode?preserveStorageRefs=true", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Namespace", "default")
	req.Header.Set("Origin", uiOrigin)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", data)
	assert.Equal(t, uiOrigin, resp.Header.Get("Access-Control-Allow-Origin"))
	var out commonpb.Payloads
	require.NoError(t, protojson.Unmarshal(data, &out))
	return out.GetPayloads()
}

// assertPreflightAllowed sends the CORS preflight a browser sends before the
// UI's first codec request.
func assertPreflightAllowed(t *testing.T, url, origin string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodOptions, url, nil)
	require.NoError(t, err)
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "content-type,x-namespace")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, origin, resp.Header.Get("Access-Control-Allow-Origin"))
	assert.True(t, strings.Contains(strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers")), "x-namespace"))
}

// httpGet GETs url and returns its body; anything but 200 fails the test.
func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s", url)
	return body
}
