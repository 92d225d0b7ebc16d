package e2e

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// runRawJSON starts RunCommand by its name with input as raw JSON, as a
// client in another language does, and waits for its result.
func runRawJSON(t *testing.T, input string) (workflows.Result, error) {
	t.Helper()
	t.Cleanup(func() { assertNothingLeaked(t) })
	run, err := stackOf(t).Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, json.RawMessage(input))
	require.NoError(t, err)
	var res workflows.Result
	return res, run.Get(t.Context(), &res)
}

// A duration given as a Go duration string, as the polyglot guide allows.
func TestRawJSONInputTakesADurationString(t *testing.T) {
	res, err := runRawJSON(t, `{"command":{"argv":["sh","-c","echo ok"],"timeout":"10s"}}`)
	require.NoError(t, err)
	assert.Equal(t, "ok\n", res.Stdout)
}

// A malformed field fails the run as SandboxInvalidInput naming the field,
// non-retryable, before any lease exists.
func TestRawJSONInputWithAMalformedFieldFailsAsInvalidInput(t *testing.T) {
	run, err := stackOf(t).Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, json.RawMessage(`{"command":{"argv":["true"],"timeout":"ten seconds"}}`))
	require.NoError(t, err)
	t.Cleanup(func() { assertNothingLeaked(t) })
	err = run.Get(t.Context(), nil)
	require.Error(t, err)
	history := stackOf(t).Client.GetWorkflowHistory(t.Context(), run.GetID(), run.GetRunID(), false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for history.HasNext() {
		event, err := history.Next()
		require.NoError(t, err)
		assert.NotEqual(t, enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, event.GetEventType(), "no activity, so no lease, before the input is found malformed")
	}
	assert.Equal(t, "command.timeout", requireFailure(t, err, sandbox.TypeInvalidInput).Field)
}
