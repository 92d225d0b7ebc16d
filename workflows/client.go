package workflows

// This file is the Go client side of RunCommand's result and of sessions,
// for ordinary Go code (a CLI, a service) and for the UpdateSession
// activity: not workflow code.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// resultUpdateID is the id of every UpdateResult (ResultUpdateID).
const resultUpdateID = ResultUpdateID

// CommandResult returns the Result of the command that a RunCommand run
// runs, as soon as the command has ended: the run may still be releasing
// the lease (its DestroyedLeases are those destroyed so far). It waits for
// the command as long as ctx allows. An empty runID means the workflow's
// latest run.
//
//	run, _ := c.ExecuteWorkflow(ctx, opts, workflows.WorkflowName, req)
//	res, err := workflows.CommandResult(ctx, c, run.GetID(), run.GetRunID())
//
// An error means that there is no Result to give: the run failed or was
// cancelled before the command ended (the error is that failure), or the
// run could not be asked (it has closed already, or its worker predates
// UpdateResult). Either way, the run's own result (client.GetWorkflow)
// says how it ended.
func CommandResult(ctx context.Context, c client.Client, workflowID, runID string) (Result, error) {
	handle, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID:   workflowID,
		RunID:        runID,
		UpdateID:     resultUpdateID,
		UpdateName:   UpdateResult,
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err != nil {
		return Result{}, err
	}
	var res Result
	err = handle.Get(ctx, &res)
	return res, err
}

// SessionClient drives a session from ordinary Go code (a CLI, a service):
// each method sends one Update and waits for its outcome.
type SessionClient struct {
	c     client.Client
	id    string
	runID string // of the first run, when this client started it
}

// StartSession starts a SessionWorkflow with opts (its TaskQueue is
// required; an empty ID gets a random one) and returns its client.
func StartSession(ctx context.Context, c client.Client, opts client.StartWorkflowOptions, req SessionRequest) (*SessionClient, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if opts.ID == "" {
		opts.ID = newSessionID()
	}
	run, err := c.ExecuteWorkflow(ctx, opts, SessionWorkflowName, req)
	if err != nil {
		return nil, err
	}
	return &SessionClient{c: c, id: run.GetID(), runID: run.GetRunID()}, nil
}

// StartSessionWith starts a SessionWorkflow and sends it its first
// command in the same request (Temporal's update-with-start): the session
// accepts the command in its first workflow task, so the first result
// comes a round trip and a workflow task sooner than with StartSession,
// then Execute. opts are StartSession's (EnableEagerStart cannot be set
// here, Temporal's rule); an unset WorkflowIDConflictPolicy is
// USE_EXISTING: with the id of a running session, the command runs in
// that session, as StartSession then Execute would have it.
//
// It returns once the session runs and has accepted the command: the
// command's result comes from the PendingCommand's Get. An invalid command
// is rejected before anything is sent.
func StartSessionWith(ctx context.Context, c client.Client, opts client.StartWorkflowOptions, req SessionRequest, first SessionCommand) (*SessionClient, *PendingCommand, error) {
	if err := req.Validate(); err != nil {
		return nil, nil, err
	}
	if err := first.Validate(); err != nil {
		return nil, nil, err
	}
	if opts.ID == "" {
		opts.ID = newSessionID()
	}
	if opts.WorkflowIDConflictPolicy == enumspb.WORKFLOW_ID_CONFLICT_POLICY_UNSPECIFIED {
		opts.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING
	}
	start := c.NewWithStartWorkflowOperation(opts, SessionWorkflowName, req)
	handle, err := c.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{
			UpdateID:     newUpdateID(),
			UpdateName:   UpdateExecute,
			Args:         []any{first},
			WaitForStage: client.WorkflowUpdateStageAccepted,
		},
	})
	if err != nil {
		return nil, nil, err
	}
	run, err := start.Get(ctx)
	if err != nil {
		return nil, nil, err
	}
	return &SessionClient{c: c, id: run.GetID(), runID: run.GetRunID()}, &PendingCommand{handle: handle}, nil
}

// PendingCommand is a session's command that was sent and accepted, and
// whose result is still to come.
type PendingCommand struct {
	handle client.WorkflowUpdateHandle
}

// Get waits for the command's result.
func (p *PendingCommand) Get(ctx context.Context) (SessionResult, error) {
	var res SessionResult
	err := p.handle.Get(ctx, &res)
	return res, err
}

// AttachSessionClient returns a client of a running session, by its
// workflow id.
func AttachSessionClient(c client.Client, sessionID string) *SessionClient {
	return &SessionClient{c: c, id: sessionID}
}

// ID is the session's workflow id: the reference to give to others.
func (s *SessionClient) ID() string { return s.id }

// FirstRunID is the run id the session started with, when this client
// started it (the session continues as new under later run ids), and ""
// for an attached client.
func (s *SessionClient) FirstRunID() string { return s.runID }

// Execute runs a command in the session, after the commands already
// queued. An invalid command is rejected before anything is sent.
func (s *SessionClient) Execute(ctx context.Context, cmd SessionCommand) (SessionResult, error) {
	if err := cmd.Validate(); err != nil {
		return SessionResult{}, err
	}
	var res SessionResult
	err := sendUpdate(ctx, s.c, s.id, newUpdateID(), UpdateExecute, &res, cmd)
	return res, err
}

// Pause pauses the session's lease.
func (s *SessionClient) Pause(ctx context.Context) (SessionState, error) {
	var state SessionState
	err := sendUpdate(ctx, s.c, s.id, newUpdateID(), UpdatePause, &state)
	return state, err
}

// Resume resumes the session's lease.
func (s *SessionClient) Resume(ctx context.Context) (SessionState, error) {
	var state SessionState
	err := sendUpdate(ctx, s.c, s.id, newUpdateID(), UpdateResume, &state)
	return state, err
}

// SetEgress replaces the egress rules of the session's lease, after the
// commands already queued, and of every lease the session takes later.
// Invalid rules are rejected before anything is sent.
func (s *SessionClient) SetEgress(ctx context.Context, rules []string) (SessionState, error) {
	in := SessionEgress{Egress: rules}
	if err := in.Validate(); err != nil {
		return SessionState{}, err
	}
	var state SessionState
	err := sendUpdate(ctx, s.c, s.id, newUpdateID(), UpdateSetEgress, &state, in)
	return state, err
}

// Fork forks the session's lease, after the commands already queued, into
// a new session, and returns its client. The new session's workspace starts
// as a copy of this one's; it is independent of this session: close it
// when done. See UpdateFork and SessionFork.
func (s *SessionClient) Fork(ctx context.Context) (*SessionClient, error) {
	var fork SessionFork
	if err := sendUpdate(ctx, s.c, s.id, newUpdateID(), UpdateFork, &fork); err != nil {
		return nil, err
	}
	return AttachSessionClient(s.c, fork.SessionID), nil
}

// Close runs the commands already queued, destroys the lease and ends the
// session.
func (s *SessionClient) Close(ctx context.Context) (SessionSummary, error) {
	var summary SessionSummary
	err := sendUpdate(ctx, s.c, s.id, newUpdateID(), UpdateClose, &summary)
	return summary, err
}

// State asks the session for its SessionState.
func (s *SessionClient) State(ctx context.Context) (SessionState, error) {
	value, err := s.c.QueryWorkflow(ctx, s.id, "", StateQuery)
	if err != nil {
		return SessionState{}, err
	}
	var state SessionState
	err = value.Get(&state)
	return state, err
}

func newUpdateID() string { return "sandboxflow-" + rand.Text() }

func newSessionID() string { return "sandboxflow-session-" + rand.Text()[:12] }

// sendUpdate sends an Update to a session and waits for its outcome,
// decoded into out. A session that is not running (closed, cancelled, or
// never started) is an ApplicationError of type SandboxSessionClosed.
func sendUpdate(ctx context.Context, c client.Client, sessionID, updateID, name string, out any, args ...any) error {
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
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("session %s is not running", sessionID), TypeSessionClosed, err)
	}
	return err
}
