package workflows

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// SessionWorkflow owns one lease and runs many commands on it, one at a
// time, in the order their Updates were accepted:
//
//	UpdateExecute   run a command (validated before it enters history);
//	                an unusable lease is replaced (compensation, as in
//	                RunCommand), the command runs again on the fresh one and
//	                SessionResult.WorkspaceReset says so; a repeat of an
//	                answered Update, even after a continue-as-new, gets the
//	                recorded answer
//	UpdatePause     pause the lease; UpdateResume resumes it (the next
//	                command also resumes it by itself)
//	UpdateSetEgress replace the egress rules of the lease, and of every
//	                later lease (validated before it enters history)
//	UpdateFork      fork the lease into a new session (session_fork.go)
//	UpdateSnapshot  keep the lease as a template (session_snapshot.go)
//	UpdateClose     run what is queued, destroy the lease, end the session
//	StateQuery      SessionState
//
// A lease idle for SessionRequest.IdleTimeout is paused; a busy session
// keeps one idle timer, not one per command, and its SandboxPhase search
// attribute says where its lease is (idle, paused, closed …), not which
// command runs: that shows in its current details. After
// CommandsPerRun commands, or when Temporal suggests it, the session
// continues as new and carries its lease (paused or not) to the next run.
// Cancelling the session — which is what a parent's close does to a
// session opened with OpenSession — destroys the lease in a disconnected
// context, like UpdateClose. A terminated session cannot clean up: its
// lease stays until the reaper (Reaper) destroys it.
//
// Use OpenSession and AttachSession from a workflow, and sandboxclient.SessionClient from
// ordinary Go code.
func SessionWorkflow(ctx workflow.Context, req SessionRequest) (SessionSummary, error) {
	if err := req.Validate(); err != nil {
		return SessionSummary{}, activities.Failure(err)
	}
	s := newSession(ctx, req)
	if err := checkLeaseHost(ctx, s.r.lease); err != nil {
		return SessionSummary{}, err
	}
	// Handlers first: Updates sent with the start wait while the
	// template builds, instead of being refused for want of a handler.
	if err := s.register(ctx); err != nil {
		return SessionSummary{}, err
	}
	if err := s.ensureTemplate(ctx); err != nil {
		return SessionSummary{}, err
	}
	return s.serve(ctx)
}

// maxRememberedLeases bounds the destroyed leases a session keeps in its
// state and carries across continue-as-new.
const maxRememberedLeases = 20

// session is one run of SessionWorkflow.
type session struct {
	req         SessionRequest
	r           *run // the lease, its generations, the compensation loop
	queue       []*operation
	idleTimeout time.Duration
	paused      bool
	hadLease    bool // a command has had a lease: a new one resets the workspace
	closing     bool // close was accepted (or the session was cancelled)
	commands    int  // commands run, across continue-as-new
	runCommands int  // commands run by this run
	// answers are the execute Updates answered lately, across
	// continue-as-new (session_answers.go).
	answers []AnsweredUpdate

	// steady is set in runs of quietCommandsVersion: a command adds to the
	// history only its Update, its activities and their workflow tasks.
	// Its phase shows in the current details, not in the search
	// attributes, and one idle timer runs across commands (waitIdle).
	steady bool
	// lastActive is when the last operation ended (or the run began).
	lastActive time.Time
	// idleTimer runs until it fires, across operations (steady runs).
	idleTimer workflow.Future
}

// quietCommandsVersion is the workflow.GetVersion change of steady
// sessions (session.steady): runs that began before it keep upserting
// the executing and idle phases and restarting their idle timer for each
// command, four events a command that replay expects.
const quietCommandsVersion = "session-quiet-commands"

// operation is an accepted Update waiting for, or given, its turn.
type operation struct {
	kind    string // one of the Update* names
	command SessionCommand
	egress  []string
	done    bool
	result  SessionResult
	state   SessionState
	summary SessionSummary
	fork    SessionFork
	// name and template are the snapshot's.
	name     string
	template sandbox.Template
	err      error
}

func newSession(ctx workflow.Context, req SessionRequest) *session {
	carried := req.Carried
	if carried == nil {
		carried = &SessionCarried{RunKey: workflow.GetInfo(ctx).WorkflowExecution.RunID}
	} else {
		req.LeaseID = "" // the carried lease is the one in use
	}
	s := &session{
		req:         req,
		idleTimeout: req.idleTimeout(),
		paused:      carried.Paused,
		hadLease:    carried.HadLease || req.LeaseID != "", // the caller's workspace
		commands:    carried.Commands,
		answers:     carried.Answered,
	}
	s.r = newRun(Request{
		Lease:           req.Lease,
		Image:           req.Image,
		LeaseID:         req.LeaseID,
		LeaseHost:       req.LeaseHost,
		MaxFreshLeases:  req.MaxFreshLeases,
		ActivityOptions: req.ActivityOptions,
	}, carried.RunKey)
	if req.Carried != nil {
		s.r.lease = carried.Lease
		if carried.Lease != nil {
			s.r.state.LeaseID, s.r.state.LeaseHost = carried.Lease.ID, carried.Lease.Host
		}
		s.r.nextGeneration = carried.NextGeneration
		s.r.state.FreshLeases = carried.FreshLeases
		s.r.state.DestroyedLeases = carried.DestroyedLeases
		s.r.state.LostLeases = carried.LostLeases
		s.r.templateHost = carried.TemplateHost
	}
	s.r.publisher.enabled = true
	s.r.publisher.searchAttributes = workflow.GetTypedSearchAttributes(ctx).
		ContainsKey(temporal.NewSearchAttributeKeyKeyword(SearchAttributePhase))
	s.r.publisher.describe = s.describe
	s.steady = workflow.GetVersion(ctx, quietCommandsVersion, workflow.DefaultVersion, 1) == 1
	s.r.publisher.executingIsIdle = s.steady
	s.lastActive = workflow.Now(ctx)
	return s
}

// ensureTemplate builds the session's Dockerfile, if it has one, before
// the session performs an Update or takes a lease, as RunCommand does; a
// build that fails fails the session. From then on
// the session's request names the template (Lease.Rootfs) instead, so that
// the runs it continues as do not ask again.
func (s *session) ensureTemplate(ctx workflow.Context) error {
	template, err := s.r.ensureTemplate(ctx)
	if err != nil || template.ID == "" {
		return err
	}
	s.req.Lease.Rootfs, s.req.Dockerfile = template.ID, ""
	return nil
}

// register installs the query and the Update handlers. Every handler only
// queues its operation and waits for serve to perform it, so that the
// operations run one at a time, in order.
func (s *session) register(ctx workflow.Context) error {
	if err := workflow.SetQueryHandler(ctx, StateQuery, func() (SessionState, error) { return s.snapshot(), nil }); err != nil {
		return err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateExecute,
		func(ctx workflow.Context, cmd SessionCommand) (SessionResult, error) {
			id := workflow.GetCurrentUpdateInfo(ctx).ID
			if a, ok := s.answered(id); ok {
				// A repeat of an Update answered before a continue-as-new.
				return a.Result, a.Error.err()
			}
			op, err := s.perform(ctx, &operation{kind: UpdateExecute, command: cmd})
			s.remember(id, AnsweredUpdate{Result: op.result}, err)
			return op.result, err
		},
		workflow.UpdateHandlerOptions{Validator: validator[SessionCommand](s)},
	); err != nil {
		return err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateFork,
		func(ctx workflow.Context) (SessionFork, error) {
			id := workflow.GetCurrentUpdateInfo(ctx).ID
			if a, ok := s.answered(id); ok && a.Fork != nil {
				return *a.Fork, a.Error.err()
			}
			op, err := s.perform(ctx, &operation{kind: UpdateFork})
			s.remember(id, AnsweredUpdate{Fork: &op.fork}, err)
			return op.fork, err
		},
		workflow.UpdateHandlerOptions{Validator: s.accepting},
	); err != nil {
		return err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateSnapshot,
		func(ctx workflow.Context, in SessionSnapshot) (sandbox.Template, error) {
			op, err := s.perform(ctx, &operation{kind: UpdateSnapshot, name: snapshotName(ctx, in)})
			return op.template, err
		},
		workflow.UpdateHandlerOptions{Validator: validator[SessionSnapshot](s)},
	); err != nil {
		return err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateSetEgress,
		func(ctx workflow.Context, in SessionEgress) (SessionState, error) {
			op, err := s.perform(ctx, &operation{kind: UpdateSetEgress, egress: in.Egress})
			return op.state, err
		},
		workflow.UpdateHandlerOptions{Validator: validator[SessionEgress](s)},
	); err != nil {
		return err
	}
	for _, name := range []string{UpdatePause, UpdateResume} {
		if err := workflow.SetUpdateHandlerWithOptions(ctx, name,
			func(ctx workflow.Context) (SessionState, error) {
				op, err := s.perform(ctx, &operation{kind: name})
				return op.state, err
			},
			workflow.UpdateHandlerOptions{Validator: s.accepting},
		); err != nil {
			return err
		}
	}
	return workflow.SetUpdateHandlerWithOptions(ctx, UpdateClose,
		func(ctx workflow.Context) (SessionSummary, error) {
			s.closing = true // from now on, every Update is rejected
			op, err := s.perform(ctx, &operation{kind: UpdateClose})
			return op.summary, err
		},
		workflow.UpdateHandlerOptions{Validator: s.accepting},
	)
}

// validator is the Validator of an Update whose input checks itself: the
// session must take Updates, and the input must be valid (a typed
// SandboxInvalidInput when not).
func validator[In interface{ Validate() error }](s *session) func(In) error {
	return func(in In) error {
		if err := s.accepting(); err != nil {
			return err
		}
		if err := in.Validate(); err != nil {
			return activities.Failure(err)
		}
		return nil
	}
}

// accepting rejects Updates once the session is closing.
func (s *session) accepting() error {
	if s.closing {
		return activities.NewFailure("the session is closing", sandbox.NewFailureDetails(TypeSessionClosed), nil)
	}
	return nil
}

// perform queues op and waits until serve has performed it.
func (s *session) perform(ctx workflow.Context, op *operation) (*operation, error) {
	s.queue = append(s.queue, op)
	if err := workflow.Await(ctx, func() bool { return op.done }); err != nil {
		return op, err
	}
	return op, op.err
}

// serve performs the queued operations until the session is closed,
// cancelled or continues as new.
func (s *session) serve(ctx workflow.Context) (SessionSummary, error) {
	for {
		op, err := s.next(ctx)
		if err != nil {
			return SessionSummary{}, s.abandon(ctx, err)
		}
		s.carryOut(ctx, op)
		op.done = true
		s.lastActive = workflow.Now(ctx)
		if op.kind == UpdateClose {
			// Let the handlers return before the session ends.
			_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
			return op.summary, op.err
		}
		if !s.continueAsNewDue(ctx) {
			continue
		}
		// Every accepted Update must be answered by this run: wait until
		// the handlers have returned, unless more work arrives first.
		if err := workflow.Await(ctx, func() bool { return len(s.queue) > 0 || workflow.AllHandlersFinished(ctx) }); err != nil {
			return SessionSummary{}, s.abandon(ctx, err)
		}
		if len(s.queue) == 0 {
			return SessionSummary{}, workflow.NewContinueAsNewError(ctx, SessionWorkflowName, s.carry())
		}
	}
}

// next waits for the next operation. A lease that stays idle for the idle
// timeout is paused meanwhile.
func (s *session) next(ctx workflow.Context) (*operation, error) {
	hasWork := func() bool { return len(s.queue) > 0 }
	if !hasWork() && s.r.lease != nil && !s.paused && s.idleTimeout > 0 {
		idle, err := s.waitIdle(ctx, hasWork)
		if err != nil {
			return nil, err
		}
		if idle {
			if err := s.pause(ctx); err != nil {
				workflow.GetLogger(ctx).Warn("could not pause the idle lease", "lease", s.r.state.LeaseID, "error", err)
			}
		}
	}
	if err := workflow.Await(ctx, hasWork); err != nil {
		return nil, err
	}
	op := s.queue[0]
	s.queue = s.queue[1:]
	return op, nil
}

// waitIdle waits until there is work or the idle timeout has passed since
// the last operation, and reports the latter.
//
// A steady session keeps one timer: when work comes first, the timer runs
// on, and when it fires with an operation since it was set, it is set
// again for what is left of the timeout. A busy session thus sets a timer
// once an idle timeout, not once a command. A session of an earlier
// version sets a timer each time and cancels it when work comes first.
func (s *session) waitIdle(ctx workflow.Context, hasWork func() bool) (idle bool, err error) {
	s.setPhase(ctx, PhaseIdle)
	if s.steady {
		return s.waitIdleSteady(ctx, hasWork)
	}
	timerCtx, cancelTimer := workflow.WithCancel(ctx)
	defer cancelTimer()
	timer := workflow.NewTimerWithOptions(timerCtx, s.idleTimeout,
		workflow.TimerOptions{Summary: "idle: pause the lease after " + s.idleTimeout.String()})
	if err := workflow.Await(ctx, func() bool { return hasWork() || timer.IsReady() }); err != nil {
		return false, err
	}
	return !hasWork() && timer.Get(ctx, nil) == nil, nil
}

// waitIdleSteady is waitIdle of a steady session.
func (s *session) waitIdleSteady(ctx workflow.Context, hasWork func() bool) (idle bool, err error) {
	for {
		if s.idleTimer == nil {
			left := s.idleTimeout - workflow.Now(ctx).Sub(s.lastActive)
			if left <= 0 {
				return true, nil
			}
			s.idleTimer = workflow.NewTimerWithOptions(ctx, left,
				workflow.TimerOptions{Summary: "idle: pause the lease after " + s.idleTimeout.String() + " without a command"})
		}
		if err := workflow.Await(ctx, func() bool { return hasWork() || s.idleTimer.IsReady() }); err != nil {
			return false, err
		}
		if hasWork() {
			return false, nil
		}
		err := s.idleTimer.Get(ctx, nil)
		s.idleTimer = nil
		if err != nil {
			return false, err
		}
	}
}

// carryOut performs one operation and records its outcome in op.
func (s *session) carryOut(ctx workflow.Context, op *operation) {
	switch op.kind {
	case UpdateExecute:
		op.result, op.err = s.execute(ctx, op.command)
	case UpdatePause:
		op.err = s.pause(ctx)
		op.state = s.snapshot()
	case UpdateResume:
		op.err = s.ready(ctx)
		op.state = s.snapshot()
	case UpdateSetEgress:
		op.err = s.setEgress(ctx, op.egress)
		op.state = s.snapshot()
	case UpdateFork:
		op.fork, op.err = s.fork(ctx)
	case UpdateSnapshot:
		op.template, op.err = s.saveTemplate(ctx, op.name)
	case UpdateClose:
		op.err = s.r.release(ctx)
		s.setPhase(ctx, PhaseClosed)
		op.summary = s.summary()
	}
}

// execute runs one command on the session's lease, resuming it first if
// it is paused, with the compensation of RunCommand.
func (s *session) execute(ctx workflow.Context, cmd SessionCommand) (SessionResult, error) {
	s.commands++
	s.runCommands++
	out := SessionResult{Seq: s.commands}
	before, hadLease := s.r.state.LeaseID, s.hadLease
	freshBefore := s.r.state.FreshLeases

	r := s.r
	r.req.Command, r.req.SecretEnv = cmd.Command, cmd.SecretEnv
	r.options.execute = s.req.ActivityOptions.execute().apply(executeOptions(cmd.Command))
	r.publisher.command = summarize(cmd.Command.String())
	var err error
	if err = s.ready(ctx); err == nil {
		var res Result
		res, err = r.runWithCompensation(ctx)
		out.Result = res.Result
	}
	out.LeaseID = r.state.LeaseID
	out.FreshLeases = r.state.FreshLeases - freshBefore
	out.WorkspaceReset = hadLease && out.LeaseID != before
	s.hadLease = hadLease || out.LeaseID != ""
	return out, err
}

// ready makes sure the lease, if there is one, runs: a paused lease is
// resumed, and a lease the session did not create is looked up (its
// workspace learnt). A lease that turns out to be unusable is given up;
// the command then takes a fresh one, within its budget, as compensation
// has it.
func (s *session) ready(ctx workflow.Context) error {
	r := s.r
	if r.lease == nil || (!s.paused && r.lease.Workspace != "") {
		return nil
	}
	r.setPhase(ctx, PhaseResuming)
	lease, err := s.leaseActivity(ctx, activities.NameResumeLease, r.options.resumeLease, "resume lease ")
	switch {
	case err == nil:
		r.lease, s.paused = &lease, false
		r.setPhase(ctx, PhaseIdle)
		return nil
	case r.compensation.unusable(err):
		if err := r.compensation.giveUp(ctx, err); err != nil {
			return err
		}
		s.paused = false
		return nil
	}
	return err
}

// pause pauses the lease, if there is one and it runs.
func (s *session) pause(ctx workflow.Context) error {
	r := s.r
	if r.lease == nil || s.paused {
		return nil
	}
	r.setPhase(ctx, PhasePausing)
	_, err := s.leaseActivity(ctx, activities.NamePauseLease, r.options.pauseLease, "pause idle lease ")
	switch {
	case err == nil:
		s.paused = true
		r.setPhase(ctx, PhasePaused)
	case r.compensation.unusable(err):
		// Gone while idle: given up; the next command takes a fresh
		// lease, within its budget.
		if derr := r.compensation.giveUp(ctx, err); derr != nil {
			return derr
		}
		s.paused = false
		r.setPhase(ctx, PhaseIdle)
		return nil
	default:
		r.setPhase(ctx, PhaseIdle)
	}
	return err
}

// leaseActivity runs PauseLease or ResumeLease on the lease in use.
func (s *session) leaseActivity(ctx workflow.Context, name string, opts workflow.ActivityOptions, summary string) (sandbox.Lease, error) {
	opts.Summary = summary + s.r.lease.ID
	var lease sandbox.Lease
	err := executeActivity(ctx, opts, *s.r.lease, name, activities.LeaseInput{LeaseID: s.r.lease.ID}, &lease)
	return lease, err
}

// abandon ends a cancelled session: the operations still queued fail, and
// the lease is destroyed in a disconnected context.
func (s *session) abandon(ctx workflow.Context, cause error) error {
	s.closing = true
	for _, op := range s.queue {
		op.err, op.done = cause, true
	}
	s.queue = nil
	err := s.r.release(ctx)
	s.setPhase(ctx, PhaseCanceled)
	if err != nil {
		workflow.GetLogger(ctx).Error("the cancelled session could not release its lease", "lease", s.r.state.LeaseID, "error", err)
	}
	return cause
}

func (s *session) continueAsNewDue(ctx workflow.Context) bool {
	return s.runCommands >= s.req.commandsPerRun() || workflow.GetInfo(ctx).GetContinueAsNewSuggested()
}

// carry is the request of the session's next run.
func (s *session) carry() SessionRequest {
	next := s.req
	next.LeaseID = ""
	next.Carried = &SessionCarried{
		RunKey:          s.r.runKey,
		Lease:           s.r.lease,
		Paused:          s.paused,
		HadLease:        s.hadLease,
		NextGeneration:  s.r.nextGeneration,
		Commands:        s.commands,
		FreshLeases:     s.r.state.FreshLeases,
		DestroyedLeases: lastLeases(s.r.state.DestroyedLeases),
		LostLeases:      lastLeases(s.r.state.LostLeases),
		Answered:        s.answers,
		TemplateHost:    s.r.templateHost,
	}
	return next
}

func (s *session) snapshot() SessionState {
	state := s.r.state
	state.DestroyedLeases = lastLeases(state.DestroyedLeases)
	state.LostLeases = lastLeases(state.LostLeases)
	return SessionState{State: state, Paused: s.paused, Egress: s.req.Lease.Egress, Commands: s.commands, Queued: len(s.queue)}
}

func (s *session) summary() SessionSummary {
	return SessionSummary{Commands: s.commands, FreshLeases: s.r.state.FreshLeases, DestroyedLeases: lastLeases(s.r.state.DestroyedLeases)}
}

func (s *session) setPhase(ctx workflow.Context, phase Phase) { s.r.setPhase(ctx, phase) }

// describe renders the session's current details for the Web UI.
func (s *session) describe(state State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "**%s** session", state.Phase)
	if state.LeaseID != "" {
		fmt.Fprintf(&b, " on lease `%s`", state.LeaseID)
	}
	fmt.Fprintf(&b, " · %d commands", s.commands)
	if state.Phase == PhaseExecuting || state.Phase == PhaseCompensating {
		fmt.Fprintf(&b, " · running `%s`", s.r.publisher.command)
	}
	if len(s.queue) > 0 {
		fmt.Fprintf(&b, " · %d queued", len(s.queue))
	}
	fmt.Fprintf(&b, " · fresh leases %d", state.FreshLeases)
	if state.LastError != "" {
		fmt.Fprintf(&b, " · last failure: %s", state.LastError)
	}
	return b.String()
}

func lastLeases(ids []string) []string {
	return slices.Clone(ids[max(0, len(ids)-maxRememberedLeases):])
}
