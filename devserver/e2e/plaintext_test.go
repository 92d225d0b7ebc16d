package e2e

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// plaintextCommand prints a marker: output that says it ran.
var plaintextCommand = sandbox.Command{Argv: []string{"sh", "-c", "echo ran-in-plaintext"}}

// A worker that holds a key ring refuses a RunCommand and an execute Update
// whose input arrived unencrypted (a client without the codec): the run
// fails as SandboxInvalidInput, non-retryable, naming "plaintext input",
// before any activity, so before any lease; the Update is rejected and the
// session runs nothing. Whoever can write to the namespace cannot start a
// command the holders of the ring did not ask for.
func TestEncryptingWorkerRefusesPlaintextInput(t *testing.T) {
	keys, err := codec.GenerateKeys("e2e-1")
	require.NoError(t, err)
	s, _ := startOwnStack(t, stack.Options{Temporal: temporalserver.Options{UIPort: temporalserver.NoUI}, Codec: keys})
	plain := plaintextWriter(t, s, keys)

	run, err := plain.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, workflows.Request{Command: plaintextCommand})
	require.NoError(t, err)
	assertPlaintextRefused(t, run.Get(t.Context(), nil))
	assertNoActivity(t, s, run.GetID(), run.GetRunID())

	// A session started by a holder of the ring rejects an execute Update
	// sent in plain text, and runs nothing for it.
	session, err := sandboxclient.StartSession(t.Context(), s.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue}, workflows.SessionRequest{})
	require.NoError(t, err)
	_, err = sandboxclient.AttachSessionClient(plain, session.ID()).Execute(t.Context(), workflows.SessionCommand{Command: plaintextCommand})
	assertPlaintextRefused(t, err)
	summary, err := session.Close(t.Context())
	require.NoError(t, err)
	assert.Zero(t, summary.Commands, "the refused Update ran no command")

	stats, err := s.Sandbox.Stats()
	require.NoError(t, err)
	assert.Zero(t, stats.ProcessesStarted, "no command ran")
}

// With --allow-plaintext-input the same plain-text input runs: the refusal
// is the operator's to lift, not a decoding accident.
func TestEncryptingWorkerAllowingPlaintextRunsIt(t *testing.T) {
	keys, err := codec.GenerateKeys("e2e-1")
	require.NoError(t, err)
	s, _ := startOwnStack(t, stack.Options{Temporal: temporalserver.Options{UIPort: temporalserver.NoUI}, Codec: keys,
		Worker: workerapp.Config{AllowPlaintextInput: true}})

	run, err := plaintextWriter(t, s, keys).ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, workflows.Request{Command: plaintextCommand})
	require.NoError(t, err)
	var res workflows.Result
	require.NoError(t, run.Get(t.Context(), &res))
	assert.Equal(t, "ran-in-plaintext\n", res.Stdout)
}

// plaintextWriter is a client of s that writes its payloads in plain
// text, as a client that was not given the codec does, but reads the
// worker's encrypted answers and failures with the ring: so that the test
// sees their details.
func plaintextWriter(t *testing.T, s *stack.Stack, keys *codec.Keys) client.Client {
	t.Helper()
	dc := converter.NewCodecDataConverter(converter.GetDefaultDataConverter(), decryptOnly{codec.NewPayloadCodec(keys)})
	c, err := client.Dial(client.Options{
		HostPort:         s.Temporal.FrontendHostPort(),
		Namespace:        s.Temporal.Namespace(),
		DataConverter:    dc,
		FailureConverter: temporal.NewDefaultFailureConverter(temporal.DefaultFailureConverterOptions{DataConverter: dc}),
		Logger:           sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// decryptOnly decodes with the codec and encodes nothing.
type decryptOnly struct{ converter.PayloadCodec }

func (decryptOnly) Encode(p []*commonpb.Payload) ([]*commonpb.Payload, error) { return p, nil }

// assertPlaintextRefused checks the typed refusal of plain-text input.
func assertPlaintextRefused(t *testing.T, err error) {
	t.Helper()
	d := requireFailure(t, err, sandbox.TypeInvalidInput)
	assert.Equal(t, "input", d.Field)
	assert.Contains(t, d.Reason, "plaintext input")
}

// requireFailure checks that err is a non-retryable failure of type typ
// and returns its details.
func requireFailure(t *testing.T, err error, typ string) sandbox.FailureDetails {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	assert.Equal(t, typ, appErr.Type())
	assert.True(t, appErr.NonRetryable())
	var d sandbox.FailureDetails
	require.NoError(t, appErr.Details(&d))
	return d
}

// assertNoActivity checks that a run scheduled no activity: it created no
// lease.
func assertNoActivity(t *testing.T, s *stack.Stack, workflowID, runID string) {
	t.Helper()
	history := s.Client.GetWorkflowHistory(t.Context(), workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for history.HasNext() {
		event, err := history.Next()
		require.NoError(t, err)
		assert.NotEqual(t, enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, event.GetEventType(), "no activity, so no lease")
	}
}
