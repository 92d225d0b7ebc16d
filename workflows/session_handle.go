package workflows

import (
	"crypto/rand"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Session is a reference to a running SessionWorkflow, for workflow code:
// its workflow id. Any workflow that knows the id can use the session
// (AttachSession); its methods send Updates through the UpdateSession
// activity, so the calls are recorded in the caller's history and survive
// its worker's crash.
type Session struct {
	ID string `json:"id"`
}

// OpenSession starts a SessionWorkflow as a child of the calling workflow
// and returns once it runs. The child's id is the caller's with a
// "/session-…" suffix unless the context's child options name one. Unless
// those options say otherwise, the parent-close policy is
// REQUEST_CANCEL: when the parent closes without closing the session, the
// session is cancelled and destroys its lease.
func OpenSession(ctx workflow.Context, req SessionRequest) (Session, error) {
	if err := req.Validate(); err != nil {
		return Session{}, activities.Failure(err)
	}
	opts := workflow.GetChildWorkflowOptions(ctx)
	if opts.WorkflowID == "" {
		var suffix string
		if err := workflow.SideEffect(ctx, func(workflow.Context) any { return strings.ToLower(rand.Text()[:10]) }).Get(&suffix); err != nil {
			return Session{}, err
		}
		opts.WorkflowID = workflow.GetInfo(ctx).WorkflowExecution.ID + "/session-" + suffix
	}
	if opts.ParentClosePolicy == enumspb.PARENT_CLOSE_POLICY_UNSPECIFIED {
		opts.ParentClosePolicy = enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL
	}
	opts.WaitForCancellation = true // a cancelled parent waits until the lease is destroyed
	if opts.StaticSummary == "" {
		opts.StaticSummary = "sandbox session"
	}
	child := workflow.ExecuteChildWorkflow(workflow.WithChildOptions(ctx, opts), SessionWorkflowName, req)
	var started workflow.Execution
	if err := child.GetChildWorkflowExecution().Get(ctx, &started); err != nil {
		return Session{}, err
	}
	return Session{ID: started.ID}, nil
}

// AttachSession refers to a session that is already running, opened by
// this workflow or any other: by its workflow id.
func AttachSession(sessionID string) Session { return Session{ID: sessionID} }

// Execute runs a command in the session, after the commands already
// queued, and returns its result. The command is validated first: an
// invalid one fails with SandboxInvalidInput before anything is recorded.
func (s Session) Execute(ctx workflow.Context, cmd SessionCommand) (SessionResult, error) {
	if err := cmd.Validate(); err != nil {
		return SessionResult{}, activities.Failure(err)
	}
	var out UpdateSessionOutput
	err := s.update(ctx, UpdateSessionInput{SessionID: s.ID, Update: UpdateExecute, Command: &cmd}, cmd.Command.Timeout, &out)
	if err != nil || out.Result == nil {
		return SessionResult{}, err
	}
	return *out.Result, nil
}

// Pause pauses the session's lease.
func (s Session) Pause(ctx workflow.Context) (SessionState, error) {
	return s.lifecycle(ctx, UpdatePause)
}

// Resume resumes the session's lease.
func (s Session) Resume(ctx workflow.Context) (SessionState, error) {
	return s.lifecycle(ctx, UpdateResume)
}

// SetEgress replaces the egress rules of the session's lease, after the
// commands already queued, and of every lease the session takes later.
// Invalid rules fail with SandboxInvalidInput before anything is recorded.
func (s Session) SetEgress(ctx workflow.Context, rules []string) (SessionState, error) {
	in := SessionEgress{Egress: rules}
	if err := in.Validate(); err != nil {
		return SessionState{}, activities.Failure(err)
	}
	var out UpdateSessionOutput
	if err := s.update(ctx, UpdateSessionInput{SessionID: s.ID, Update: UpdateSetEgress, Egress: &in}, 0, &out); err != nil || out.State == nil {
		return SessionState{}, err
	}
	return *out.State, nil
}

// Fork forks the session's lease, after the commands already queued, into
// a new session, and returns it. The new session's workspace starts as a
// copy of this one's; it is independent of this session and of the
// calling workflow (it outlives both): close it when done. See UpdateFork
// and SessionFork.
func (s Session) Fork(ctx workflow.Context) (Session, error) {
	var out UpdateSessionOutput
	if err := s.update(ctx, UpdateSessionInput{SessionID: s.ID, Update: UpdateFork}, 0, &out); err != nil || out.Fork == nil {
		return Session{}, err
	}
	return Session{ID: out.Fork.SessionID}, nil
}

// Snapshot keeps the session's lease as a template, after the commands
// already queued, and returns it: later leases whose Lease.Rootfs names it
// start from its files, /workspace included (UpdateSnapshot). The lease is
// left running or paused as it was. An invalid name fails with
// SandboxInvalidInput before anything is recorded; an empty one is of the
// session's choosing, the same on a retry of the call.
func (s Session) Snapshot(ctx workflow.Context, in SessionSnapshot) (sandbox.Template, error) {
	if err := in.Validate(); err != nil {
		return sandbox.Template{}, activities.Failure(err)
	}
	var out UpdateSessionOutput
	if err := s.update(ctx, UpdateSessionInput{SessionID: s.ID, Update: UpdateSnapshot, Snapshot: &in}, 0, &out); err != nil || out.Template == nil {
		return sandbox.Template{}, err
	}
	return *out.Template, nil
}

// Close runs the commands already queued, destroys the lease and ends the
// session.
func (s Session) Close(ctx workflow.Context) (SessionSummary, error) {
	var out UpdateSessionOutput
	if err := s.update(ctx, UpdateSessionInput{SessionID: s.ID, Update: UpdateClose}, 0, &out); err != nil || out.Summary == nil {
		return SessionSummary{}, err
	}
	return *out.Summary, nil
}

func (s Session) lifecycle(ctx workflow.Context, name string) (SessionState, error) {
	var out UpdateSessionOutput
	if err := s.update(ctx, UpdateSessionInput{SessionID: s.ID, Update: name}, 0, &out); err != nil || out.State == nil {
		return SessionState{}, err
	}
	return *out.State, nil
}

// update runs the UpdateSession activity. Its start-to-close timeout
// covers the command's own timeout; it heartbeats, so a dead worker is
// noticed, and its retry waits for the same Update.
func (s Session) update(ctx workflow.Context, in UpdateSessionInput, commandTimeout time.Duration, out *UpdateSessionOutput) error {
	startToClose := 24 * time.Hour
	if commandTimeout > 0 {
		startToClose = commandTimeout + 15*time.Minute
	}
	summary := in.Update + " in session " + s.ID
	if in.Command != nil {
		summary = "execute `" + summarize(in.Command.Command.String()) + "` in session " + s.ID
	}
	opts := workflow.ActivityOptions{
		StartToCloseTimeout: startToClose,
		HeartbeatTimeout:    30 * time.Second,
		Summary:             summary,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    time.Second,
			BackoffCoefficient: 2,
			MaximumInterval:    30 * time.Second,
			MaximumAttempts:    10,
		},
	}
	return executeActivity(ctx, opts, sandbox.Lease{}, NameUpdateSession, in, out)
}
