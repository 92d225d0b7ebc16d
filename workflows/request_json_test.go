package workflows

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// runJSON starts RunCommand by name with input given as raw JSON, as a
// caller in another language does.
func (h *harness) runJSON(t *testing.T, input string) (Result, error) {
	h.env.ExecuteWorkflow(WorkflowName, json.RawMessage(input))
	require.True(t, h.env.IsWorkflowCompleted())
	var res Result
	if err := h.env.GetWorkflowError(); err != nil {
		return res, err
	}
	return res, h.env.GetWorkflowResult(&res)
}

// Durations may be Go duration strings as well as integer nanoseconds.
func TestRequestTakesDurationStrings(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, cmd sandbox.Command, _ sandbox.Observer) (sandbox.Result, error) {
			assert.Equal(t, 10*time.Second, cmd.Timeout)
			return sandbox.Result{ExitCode: 0}, nil
		})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(nil)
	_, err := h.runJSON(t, `{"command":{"argv":["true"],"timeout":"10s"},"lease":{"shape":"s-1vcpu-1gb","autoPauseAfter":"2m"},
		"activityOptions":{"execute":{"heartbeatTimeout":"30s"}}}`)
	require.NoError(t, err)

	var req Request
	require.NoError(t, json.Unmarshal([]byte(`{"command":{"argv":["x"],"timeout":1500000000}}`), &req))
	assert.Equal(t, 1500*time.Millisecond, req.Command.Timeout, "integer nanoseconds, as Go encodes them")
	require.NoError(t, req.Validate())
}

// Malformed input fails as SandboxInvalidInput naming the field, before
// any lease is created: the mock expects no call at all.
func TestMalformedRequestFailsAsInvalidInputNamingTheField(t *testing.T) {
	for field, input := range map[string]string{
		"command.timeout":      `{"command":{"argv":["x"],"timeout":"ten seconds"}}`,
		"command.argv":         `{"command":{"argv":"x"}}`,
		"maxFreshLeases":       `{"command":{"argv":["x"]},"maxFreshLeases":"2"}`,
		"lease.autoPauseAfter": `{"command":{"argv":["x"]},"lease":{"autoPauseAfter":true}}`,
	} {
		t.Run(field, func(t *testing.T) {
			h := newHarness(t)
			_, err := h.runJSON(t, input)
			require.Error(t, err)
			assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
			d := failureDetails(t, err)
			assert.Equal(t, field, d.Field)
			assertNoGoTypeNames(t, err)
		})
	}
}

// Every input a worker with keys must not take in plain text refuses it
// (codec.PlaintextRefuser), and then fails its validation as
// SandboxInvalidInput naming the input as a whole.
func TestInputsRefusePlaintext(t *testing.T) {
	req, sreq := &Request{Command: sandbox.Command{Argv: []string{"true"}}}, &SessionRequest{}
	cmd, egress, snapshot := &SessionCommand{Command: req.Command}, &SessionEgress{Egress: []string{"*"}}, &SessionSnapshot{}
	inputs := []interface {
		codec.PlaintextRefuser
		Validate() error
	}{req, sreq, cmd, egress, snapshot}
	for _, in := range inputs {
		require.NoError(t, in.Validate(), "%T", in)
		in.RefusePlaintext()
		var invalid *sandbox.InvalidInputError
		require.ErrorAs(t, in.Validate(), &invalid, "%T", in)
		assert.Equal(t, "input", invalid.Field)
		assert.Contains(t, invalid.Reason, "plaintext input")
	}
}
