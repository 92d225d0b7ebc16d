package runresult

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
)

// stuckRun is a run whose long poll never wakes up: the lost notification.
type stuckRun struct{ client.WorkflowRun }

func (stuckRun) GetID() string    { return "wf" }
func (stuckRun) GetRunID() string { return "run" }
func (stuckRun) Get(ctx context.Context, _ any) error {
	<-ctx.Done()
	return ctx.Err()
}

// answeringRun answers at once, as a Get of a closed run does.
type answeringRun struct {
	client.WorkflowRun
	result string
}

func (r answeringRun) Get(_ context.Context, out any) error {
	*out.(*string) = r.result
	return nil
}

// closedClient says the run has closed and reads it with answeringRun.
type closedClient struct {
	client.Client
	status enumspb.WorkflowExecutionStatus
}

func (c closedClient) DescribeWorkflowExecution(context.Context, string, string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	return &workflowservice.DescribeWorkflowExecutionResponse{
		WorkflowExecutionInfo: &workflowpb.WorkflowExecutionInfo{Status: c.status},
	}, nil
}

func (c closedClient) GetWorkflow(context.Context, string, string) client.WorkflowRun {
	return answeringRun{result: "done"}
}

func TestGetReadsARunWhoseCloseWasNotNotified(t *testing.T) {
	var out string
	lost, err := Get(t.Context(), closedClient{status: enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED}, stuckRun{}, &out)
	require.NoError(t, err)
	assert.True(t, lost)
	assert.Equal(t, "done", out)
}

func TestGetKeepsWaitingForARunningRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), CheckInterval*5/2) // two checks
	defer cancel()
	var out string
	lost, err := Get(ctx, closedClient{status: enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING}, stuckRun{}, &out)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, lost)
}

func TestGetReturnsTheLongPollsAnswer(t *testing.T) {
	var out string
	lost, err := Get(t.Context(), closedClient{}, answeringRun{result: "polled"}, &out)
	require.NoError(t, err)
	assert.False(t, lost)
	assert.Equal(t, "polled", out)
}
