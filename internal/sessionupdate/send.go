// Package sessionupdate sends an Update to a session workflow and waits for
// its outcome: the one way the Go client (package sandboxclient) and the
// UpdateSession activity (package workflows) reach a session.
package sessionupdate

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Send sends an Update to a session and waits for its outcome,
// decoded into out. A session that is not running (closed, cancelled, or
// never started) is an ApplicationError of type SandboxSessionClosed.
func Send(ctx context.Context, c client.Client, sessionID, updateID, name string, out any, args ...any) error {
	handle, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID:   sessionID,
		UpdateID:     updateID,
		UpdateName:   name,
		Args:         args,
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err == nil {
		err = handle.Get(ctx, out)
	}
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("session %s is not running", sessionID), sandbox.TypeSessionClosed, err)
	}
	return err
}
