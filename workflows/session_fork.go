package workflows

import (
	"crypto/rand"
	"fmt"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// fork is the fork Update: it forks the session's lease into a new
// session, in this order:
//
//	PauseLease   the lease, unless it is paused already (the API forks
//	             only a paused sandbox); it stays paused afterwards, and
//	             the session's next command resumes it
//	ForkLease    a copy of its files, labelled with the new session's run
//	             key: the new session's release sweeps it, and so does this
//	             session when the fork fails or the new session cannot start
//	child        the new SessionWorkflow, started with the forked lease as
//	             its own (as a continue-as-new carries a lease), this
//	             session's request (shape, egress as set_egress left it,
//	             options) and a workflow id of this session's with a
//	             "/fork-…" suffix
//
// The new session is independent: a child with the parent-close policy
// ABANDON, it outlives this one, and whoever asked for the fork closes it.
// A session without a lease (no command ran yet, or its lease was just
// given up) forks into a new session without one.
//
// A fork that fails leaves the session's lease as it was (paused): the
// failure is the fork's, and a lease that is in fact gone is found by the
// next command, which replaces it as compensation has it.
func (s *session) fork(ctx workflow.Context) (SessionFork, error) {
	var key string
	if err := workflow.SideEffect(ctx, func(workflow.Context) any { return rand.Text() }).Get(&key); err != nil {
		return SessionFork{}, err
	}
	out := SessionFork{SessionID: workflow.GetInfo(ctx).WorkflowExecution.ID + "/fork-" + strings.ToLower(key[:10])}
	next := s.req
	next.LeaseID = ""
	next.Carried = &SessionCarried{RunKey: key, TemplateHost: s.r.templateHost}
	if err := s.pause(ctx); err != nil {
		return SessionFork{}, err
	}
	var lease sandbox.Lease
	if s.r.lease != nil {
		var err error
		if lease, err = s.forkLease(ctx, key, out.SessionID); err != nil {
			return SessionFork{}, err
		}
		out.LeaseID = lease.ID
		next.Carried.Lease, next.Carried.HadLease, next.Carried.NextGeneration = &lease, true, 1
	}
	if err := s.startFork(ctx, out.SessionID, next); err != nil {
		s.discardFork(ctx, lease, key)
		return SessionFork{}, err
	}
	return out, nil
}

// forkLease forks the paused lease for the session sessionID, whose run
// key is runKey. When the fork fails, whatever it may have made is swept.
func (s *session) forkLease(ctx workflow.Context, runKey, sessionID string) (sandbox.Lease, error) {
	r := s.r
	r.setPhase(ctx, PhaseForking)
	defer r.setPhase(ctx, PhasePaused)
	opts := r.options.forkLease
	opts.Summary = fmt.Sprintf("fork lease %s into session %s", r.lease.ID, sessionID)
	var lease sandbox.Lease
	err := executeActivity(ctx, opts, *r.lease, activities.NameForkLease,
		activities.ForkLeaseInput{SourceID: r.lease.ID, RunKey: runKey, WorkflowID: sessionID}, &lease)
	if err != nil {
		// Whatever it made lives on the source's host.
		s.discardFork(ctx, sandbox.Lease{Host: r.lease.Host}, runKey)
	}
	return lease, err
}

// startFork starts the forked session and waits until it runs.
func (s *session) startFork(ctx workflow.Context, id string, req SessionRequest) error {
	opts := workflow.ChildWorkflowOptions{
		WorkflowID:        id,
		ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
		StaticSummary:     "sandbox session forked from " + workflow.GetInfo(ctx).WorkflowExecution.ID,
	}
	child := workflow.ExecuteChildWorkflow(workflow.WithChildOptions(ctx, opts), SessionWorkflowName, req)
	return child.GetChildWorkflowExecution().Get(ctx, nil)
}

// discardFork destroys the forked lease, if any (its ID is empty when the
// fork failed; its Host is the source's), and sweeps the leases of its
// run on that host, in a disconnected context: the fork's failure (or this
// session's cancellation) must not leave it behind.
func (s *session) discardFork(ctx workflow.Context, lease sandbox.Lease, runKey string) {
	ctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	opts := s.r.options.destroyLease
	opts.Summary = "discard fork: sweep its run"
	if lease.ID != "" {
		opts.Summary = "discard fork: destroy lease " + lease.ID + " and sweep its run"
	}
	err := executeActivity(ctx, opts, lease, activities.NameDestroyLease,
		activities.DestroyLeaseInput{LeaseID: lease.ID, RunKey: runKey}, nil)
	if err != nil {
		workflow.GetLogger(ctx).Error("could not discard a fork", "lease", lease.ID, "runKey", runKey, "error", err)
	}
}
