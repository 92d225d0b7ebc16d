package e2e

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/localsandbox/localsandboxtest"
)

// startOwnStack starts a stack of the test's own beside TestMain's, for the
// duration of t, logging everything at debug level into the returned
// buffer. Such tests must not run in parallel: a race-detector binary holds
// two Temporal servers, not three.
func startOwnStack(t *testing.T, opts stack.Options) (*stack.Stack, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if opts.Temporal.LogLevel == nil {
		opts.Temporal.LogLevel = slog.LevelInfo
	}
	opts.Sandbox.Root = t.TempDir()
	s, err := stack.Start(t.Context(), opts)
	require.NoError(t, err, "start the test's own stack")
	t.Cleanup(func() {
		if !t.Failed() {
			assert.NoError(t, localsandboxtest.CheckNothingLeaked(s.Sandbox))
		}
		if err := s.Stop(); err != nil {
			t.Logf("stop the test's own stack: %v", err)
		}
	})
	return s, logs
}

// runStarterOn runs the starter against s exactly as `devserver run` does,
// with the stack's client options (and so its codec).
func runStarterOn(t *testing.T, s *stack.Stack, stdin string, args ...string) (code int, stdout, stderr, workflowID, runID string) {
	t.Helper()
	var out, errOut bytes.Buffer
	started := func(wf, run string) { workflowID, runID = wf, run }
	code = starterapp.Main(t.Context(), waitingForRelease(args), starterapp.IO{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut},
		s.ClientOptions(), started)
	return code, out.String(), errOut.String(), workflowID, runID
}

// plainClient reaches s's Temporal server without any codec: it sees the
// payloads as the server stores them.
func plainClient(t *testing.T, s *stack.Stack) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{
		HostPort:  s.Temporal.FrontendHostPort(),
		Namespace: s.Temporal.Namespace(),
		Logger:    sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// storedHistory is every event of a run as the server stores it, each
// serialized twice: in the protobuf wire format, where payload data stays
// the raw bytes a codec produced, and as protojson, where every string
// field is readable (payload bytes are base64 there, so a scan of the JSON
// alone could not see a plain-text payload). A scan of both misses nothing.
func storedHistory(t *testing.T, c client.Client, workflowID, runID string) (wire, json []byte, events int) {
	t.Helper()
	iter := c.GetWorkflowHistory(t.Context(), workflowID, runID, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		event, err := iter.Next()
		require.NoError(t, err)
		b, err := proto.Marshal(event)
		require.NoError(t, err)
		wire = append(wire, b...)
		j, err := protojson.Marshal(event)
		require.NoError(t, err)
		json = append(append(json, j...), '\n')
		events++
	}
	desc, err := c.DescribeWorkflowExecution(t.Context(), workflowID, runID)
	require.NoError(t, err)
	b, err := proto.Marshal(desc)
	require.NoError(t, err)
	wire = append(wire, b...)
	j, err := protojson.Marshal(desc)
	require.NoError(t, err)
	return wire, append(json, j...), events
}

// logBuffer collects a stack's whole log output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
