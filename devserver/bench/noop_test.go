package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
)

// The no-op session answers each Update once its activity has run, and
// ends on the close signal.
func TestNoopSessionAnswersUpdates(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(noopSessionWorkflow, workflow.RegisterOptions{Name: NoopSessionWorkflowName})
	ran := 0
	env.RegisterActivityWithOptions(func() error { ran++; return nil }, activity.RegisterOptions{Name: NoopActivityName})
	answered := 0
	for i := range 2 {
		env.RegisterDelayedCallback(func() {
			env.UpdateWorkflow(noopUpdateName, fmt.Sprint("u", i), &testsuite.TestUpdateCallback{
				OnReject:   func(err error) { t.Errorf("rejected: %v", err) },
				OnAccept:   func() {},
				OnComplete: func(_ any, err error) { require.NoError(t, err); answered++ },
			})
		}, time.Duration(i+1)*time.Second)
	}
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(closeSignalName, nil) }, 10*time.Second)

	env.ExecuteWorkflow(NoopSessionWorkflowName)

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, 2, answered)
	require.Equal(t, 2, ran)
}
