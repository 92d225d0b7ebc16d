// Package sandboxclient is the Go client of RunCommand's result and of
// sessions, for ordinary Go code (a CLI, a service): not workflow code,
// which uses package workflows (Run, OpenSession) instead.
//
//	run, _ := c.ExecuteWorkflow(ctx, opts, workflows.WorkflowName, req)
//	res, err := sandboxclient.CommandResult(ctx, c, run.GetID(), run.GetRunID())
package sandboxclient

import (
	"context"
	"crypto/rand"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/internal/sessionupdate"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// resultUpdateID is the id of every workflows.UpdateResult (workflows.ResultUpdateID).
const resultUpdateID = workflows.ResultUpdateID

// CommandResult returns the workflows.Result of the command that a workflows.RunCommand run
// runs, as soon as the command has ended: the run may still be releasing
// the lease (its DestroyedLeases are those destroyed so far). It waits for
// the command as long as ctx allows. An empty runID means the workflow's
// latest run.
//
//	run, _ := c.ExecuteWorkflow(ctx, opts, workflows.WorkflowName, req)
//	res, err := sandboxclient.CommandResult(ctx, c, run.GetID(), run.GetRunID())
//
// An error means that there is no workflows.Result to give: the run failed or was
// cancelled before the command ended (the error is that failure), or the
// run could not be asked (it has closed already, or its worker predates
// workflows.UpdateResult). Either way, the run's own result (client.GetWorkflow)
// says how it ended.
func CommandResult(ctx context.Context, c client.Client, workflowID, runID string) (workflows.Result, error) {
	handle, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID:   workflowID,
		RunID:        runID,
		UpdateID:     resultUpdateID,
		UpdateName:   workflows.UpdateResult,
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err != nil {
		return workflows.Result{}, err
	}
	var res workflows.Result
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

// StartSession starts a workflows.SessionWorkflow with opts (its TaskQueue is
// required; an empty ID gets a random one) and returns its client.
func StartSession(ctx context.Context, c client.Client, opts client.StartWorkflowOptions, req workflows.SessionRequest) (*SessionClient, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if opts.ID == "" {
		opts.ID = newSessionID()
	}
	run, err := c.ExecuteWorkflow(ctx, opts, workflows.SessionWorkflowName, req)
	if err != nil {
		return nil, err
	}
	return &SessionClient{c: c, id: run.GetID(), runID: run.GetRunID()}, nil
}

// StartSessionWith starts a workflows.SessionWorkflow and sends it its first
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
func StartSessionWith(ctx context.Context, c client.Client, opts client.StartWorkflowOptions, req workflows.SessionRequest, first workflows.SessionCommand) (*SessionClient, *PendingCommand, error) {
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
	start := c.NewWithStartWorkflowOperation(opts, workflows.SessionWorkflowName, req)
	handle, err := c.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{
			UpdateID:     newUpdateID(),
			UpdateName:   workflows.UpdateExecute,
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
func (p *PendingCommand) Get(ctx context.Context) (workflows.SessionResult, error) {
	var res workflows.SessionResult
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
func (s *SessionClient) Execute(ctx context.Context, cmd workflows.SessionCommand) (workflows.SessionResult, error) {
	return sendValid[workflows.SessionResult](ctx, s, workflows.UpdateExecute, cmd)
}

// sendValid sends the Update name with in, unless in is not valid, and
// returns its answer.
func sendValid[Out any](ctx context.Context, s *SessionClient, name string, in interface{ Validate() error }) (Out, error) {
	var out Out
	if err := in.Validate(); err != nil {
		return out, err
	}
	err := sessionupdate.Send(ctx, s.c, s.id, newUpdateID(), name, &out, in)
	return out, err
}

// Pause pauses the session's lease.
func (s *SessionClient) Pause(ctx context.Context) (workflows.SessionState, error) {
	var state workflows.SessionState
	err := sessionupdate.Send(ctx, s.c, s.id, newUpdateID(), workflows.UpdatePause, &state)
	return state, err
}

// Resume resumes the session's lease.
func (s *SessionClient) Resume(ctx context.Context) (workflows.SessionState, error) {
	var state workflows.SessionState
	err := sessionupdate.Send(ctx, s.c, s.id, newUpdateID(), workflows.UpdateResume, &state)
	return state, err
}

// SetEgress replaces the egress rules of the session's lease, after the
// commands already queued, and of every lease the session takes later.
// Invalid rules are rejected before anything is sent.
func (s *SessionClient) SetEgress(ctx context.Context, rules []string) (workflows.SessionState, error) {
	return sendValid[workflows.SessionState](ctx, s, workflows.UpdateSetEgress, workflows.SessionEgress{Egress: rules})
}

// Fork forks the session's lease, after the commands already queued, into
// a new session, and returns its client. The new session's workspace starts
// as a copy of this one's; it is independent of this session: close it
// when done. See UpdateFork and SessionFork.
func (s *SessionClient) Fork(ctx context.Context) (*SessionClient, error) {
	var fork workflows.SessionFork
	if err := sessionupdate.Send(ctx, s.c, s.id, newUpdateID(), workflows.UpdateFork, &fork); err != nil {
		return nil, err
	}
	return AttachSessionClient(s.c, fork.SessionID), nil
}

// Snapshot keeps the session's lease, after the commands already queued,
// as a template that later leases start from (LeaseSpec.Rootfs =
// template.ID), /workspace included; the lease is left as it was. An
// empty name names the template after the session and the Update. An
// invalid name is rejected before anything is sent. See UpdateSnapshot.
func (s *SessionClient) Snapshot(ctx context.Context, name string) (sandbox.Template, error) {
	return sendValid[sandbox.Template](ctx, s, workflows.UpdateSnapshot, workflows.SessionSnapshot{Name: name})
}

// Close runs the commands already queued, destroys the lease and ends the
// session.
func (s *SessionClient) Close(ctx context.Context) (workflows.SessionSummary, error) {
	var summary workflows.SessionSummary
	err := sessionupdate.Send(ctx, s.c, s.id, newUpdateID(), workflows.UpdateClose, &summary)
	return summary, err
}

// State asks the session for its workflows.SessionState.
func (s *SessionClient) State(ctx context.Context) (workflows.SessionState, error) {
	value, err := s.c.QueryWorkflow(ctx, s.id, "", workflows.StateQuery)
	if err != nil {
		return workflows.SessionState{}, err
	}
	var state workflows.SessionState
	err = value.Get(&state)
	return state, err
}

func newUpdateID() string { return "sandboxflow-" + rand.Text() }

func newSessionID() string { return "sandboxflow-session-" + rand.Text()[:12] }
