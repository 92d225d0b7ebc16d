package workflows

// This file is the UpdateSession activity: ordinary Go code that runs on a
// worker, not workflow code. Workflows reach it through Session
// (session_handle.go).

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/internal/sessionupdate"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// NameUpdateSession is the activity through which workflow code sends an
// Update to a session (workflows cannot send Updates themselves).
// RegisterWorkflows registers it.
const NameUpdateSession = "sandboxflow.UpdateSession"

// UpdateSessionInput is the input of the UpdateSession activity.
type UpdateSessionInput struct {
	// SessionID is the session's workflow id.
	SessionID string `json:"sessionId"`
	// Update is one of the Update* names.
	Update string `json:"update"`
	// Command is the command of UpdateExecute.
	Command *SessionCommand `json:"command,omitempty"`
	// Egress is the input of UpdateSetEgress.
	Egress *SessionEgress `json:"egress,omitempty"`
	// Snapshot is the input of UpdateSnapshot (none: a name of the
	// session's choosing).
	Snapshot *SessionSnapshot `json:"snapshot,omitempty"`
}

// UpdateSessionOutput is what the Update returned: the field of its kind.
type UpdateSessionOutput struct {
	Result  *SessionResult  `json:"result,omitempty"`
	State   *SessionState   `json:"state,omitempty"`
	Summary *SessionSummary `json:"summary,omitempty"`
	Fork    *SessionFork    `json:"fork,omitempty"`
	// Template is what UpdateSnapshot returned.
	Template *sandbox.Template `json:"template,omitempty"`
}

// updateSession is the UpdateSession activity. Its Update id is derived
// from the calling workflow run and the activity, so a retry of the
// activity (its worker died) waits for the same Update instead of running
// the command twice.
func updateSession(ctx context.Context, in UpdateSessionInput) (UpdateSessionOutput, error) {
	info := activity.GetInfo(ctx)
	updateID := info.WorkflowExecution.RunID + "/" + info.ActivityID
	interval := activities.DefaultHeartbeatInterval
	if info.HeartbeatTimeout > 0 {
		interval = min(interval, info.HeartbeatTimeout/3)
	}
	stop := activities.KeepHeartbeating(ctx, interval, nil)
	defer stop()

	var out UpdateSessionOutput
	var err error
	c := activity.GetClient(ctx)
	switch in.Update {
	case UpdateExecute:
		if in.Command == nil {
			return out, activities.Failure(&sandbox.InvalidInputError{Field: "command", Reason: "execute needs a command"})
		}
		out.Result = &SessionResult{}
		err = sessionupdate.Send(ctx, c, in.SessionID, updateID, UpdateExecute, out.Result, *in.Command)
	case UpdatePause, UpdateResume:
		out.State = &SessionState{}
		err = sessionupdate.Send(ctx, c, in.SessionID, updateID, in.Update, out.State)
	case UpdateSetEgress:
		if in.Egress == nil {
			return out, activities.Failure(&sandbox.InvalidInputError{Field: "egress", Reason: "set_egress needs its rules"})
		}
		out.State = &SessionState{}
		err = sessionupdate.Send(ctx, c, in.SessionID, updateID, UpdateSetEgress, out.State, *in.Egress)
	case UpdateFork:
		out.Fork = &SessionFork{}
		err = sessionupdate.Send(ctx, c, in.SessionID, updateID, UpdateFork, out.Fork)
	case UpdateSnapshot:
		var snapshot SessionSnapshot
		if in.Snapshot != nil {
			snapshot = *in.Snapshot
		}
		out.Template = &sandbox.Template{}
		err = sessionupdate.Send(ctx, c, in.SessionID, updateID, UpdateSnapshot, out.Template, snapshot)
	case UpdateClose:
		out.Summary = &SessionSummary{}
		err = sessionupdate.Send(ctx, c, in.SessionID, updateID, UpdateClose, out.Summary)
	default:
		return out, activities.Failure(&sandbox.InvalidInputError{Field: "update", Reason: fmt.Sprintf("unknown session update %q", in.Update)})
	}
	if err == nil {
		return out, nil
	}
	return UpdateSessionOutput{}, passOn(err)
}

// passOn turns the failure of an Update into the activity's: when the
// session answered (a rejection, the command's own failure, or it is no
// longer running), asking again would get the same answer, so it is
// non-retryable, with its type, message, cause and details kept.
func passOn(err error) error {
	var appErr *temporal.ApplicationError
	var canceled *temporal.CanceledError
	switch {
	case errors.As(err, &appErr):
		return temporal.NewApplicationErrorWithOptions(appErr.Message(), appErr.Type(),
			temporal.ApplicationErrorOptions{NonRetryable: true, Cause: errors.Unwrap(appErr), Details: detailsOf(appErr)})
	case errors.As(err, &canceled):
		return activities.NewFailure("the session was cancelled", sandbox.NewFailureDetails(TypeSessionClosed), err)
	}
	return err
}

// detailsOf returns the details of appErr as they are (CompensationDetails,
// CleanupDetails, …), to be passed on unchanged. The errors of this
// package carry one detail at most.
func detailsOf(appErr *temporal.ApplicationError) []any {
	var raw converter.RawValue
	if !appErr.HasDetails() || appErr.Details(&raw) != nil {
		return nil
	}
	return []any{raw}
}
