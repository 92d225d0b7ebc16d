package workflows

import (
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// DefaultTaskQueue is the task queue that the sandboxflow worker and
// starter use unless told otherwise.
const DefaultTaskQueue = "sandboxflow"

// Registry is where workflows and activities are registered: a
// worker.Worker or a testsuite environment.
type Registry interface {
	activities.Registry
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
}

// Register registers RunCommand and the activities over provider: all a
// worker needs. Use RegisterWorkflows and Activities.Register instead to
// configure the activities (secrets, heartbeat interval).
func Register(r Registry, provider sandbox.Provider) {
	RegisterWorkflows(r)
	(&activities.Activities{Provider: provider}).Register(r)
}

// RegisterWorkflows registers RunCommand under WorkflowName and
// SessionWorkflow under SessionWorkflowName, and the UpdateSession
// activity through which workflows use sessions (it needs no provider).
func RegisterWorkflows(r Registry) {
	r.RegisterWorkflowWithOptions(RunCommand, workflow.RegisterOptions{Name: WorkflowName})
	r.RegisterWorkflowWithOptions(SessionWorkflow, workflow.RegisterOptions{Name: SessionWorkflowName})
	r.RegisterActivityWithOptions(updateSession, activity.RegisterOptions{Name: NameUpdateSession})
}
