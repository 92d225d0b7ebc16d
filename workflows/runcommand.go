package workflows

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// WorkflowName is the registered name of RunCommand.
const WorkflowName = "sandboxflow.RunCommand"

// RunCommand is the workflow: it runs Request.Command on a lease, replaces
// the lease when it becomes unusable, and always releases what it leased.
// See the package documentation for the flow and where each failure goes.
//
// While it runs it answers StateQuery and keeps its current details (shown
// by the Web UI) up to date. It upserts the keyword search attributes
// SearchAttributeLeaseID and SearchAttributePhase only when it was started
// with SearchAttributePhase set, which a starter can do only when the
// namespace has them registered; otherwise it works without them.
//
// It answers UpdateResult with the command's Result as soon as the
// command has ended, while it goes on releasing the lease (see
// sandboxclient.CommandResult); it ends only once every such Update is answered.
func RunCommand(ctx workflow.Context, req Request) (Result, error) {
	r := newRun(req, workflow.GetInfo(ctx).WorkflowExecution.RunID)
	r.publisher.enabled = true
	r.publisher.searchAttributes = workflow.GetTypedSearchAttributes(ctx).
		ContainsKey(temporal.NewSearchAttributeKeyKeyword(SearchAttributePhase))
	if err := workflow.SetQueryHandler(ctx, StateQuery, func() (State, error) { return r.state, nil }); err != nil {
		return Result{}, err
	}
	var answer *resultAnswer // nil until the command's Result, or the run's failure, is known
	r.resultKnown = func(res Result) { answer = &resultAnswer{result: res} }
	if err := workflow.SetUpdateHandler(ctx, UpdateResult, func(ctx workflow.Context) (Result, error) {
		// A cancelled run is answered too, with its outcome.
		ctx, cancel := workflow.NewDisconnectedContext(ctx)
		defer cancel()
		if err := workflow.Await(ctx, func() bool { return answer != nil }); err != nil {
			return Result{}, err
		}
		return answer.result, answer.err
	}); err != nil {
		return Result{}, err
	}

	res, err := r.run(ctx)
	if answer == nil {
		answer = &resultAnswer{err: err} // the run failed before the command ended
	}
	ctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	if werr := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); werr != nil {
		return Result{}, werr
	}
	return res, err
}

// resultAnswer is how RunCommand answers UpdateResult: the command's
// Result, or the failure that ended the run before the command did.
type resultAnswer struct {
	result Result
	err    error
}

// Run runs a command exactly as RunCommand does, but inline: from the
// caller's own workflow code, its activities recorded in the caller's
// history. It publishes no query, details or search attributes and
// answers no UpdateResult (the workflow is the caller's: its own result
// comes when Run returns, after the release), and may be called any
// number of times.
func Run(ctx workflow.Context, req Request) (Result, error) {
	var key string
	// Each call needs its own run key, the same on every replay.
	if err := workflow.SideEffect(ctx, func(workflow.Context) any { return "inline-" + rand.Text() }).Get(&key); err != nil {
		return Result{}, err
	}
	return newRun(req, key).run(ctx)
}

// run is one execution of a Request, or, in a session, the lease that
// successive commands run on.
type run struct {
	req       Request
	runKey    string // labels every lease of the run
	options   activityOptions
	state     State
	publisher publisher
	// lease is the lease in use; nil until one is acquired, and after an
	// unusable one was destroyed.
	lease *sandbox.Lease
	// nextGeneration is the generation of the next lease to acquire: 0
	// means CreateLease, anything else AcquireFreshLease.
	nextGeneration int
	// compensation replaces the lease when it turns unusable.
	compensation compensation
	// resultKnown, if set, learns the command's Result as soon as the
	// command has ended, before the lease is released.
	resultKnown func(Result)
	// templateHost is the host that keeps the template of the run's
	// leases, on a fleet: they are created there, not placed
	// (ensureTemplate).
	templateHost string
}

func newRun(req Request, runKey string) *run {
	r := &run{
		req:       req,
		runKey:    runKey,
		options:   resolveOptions(req),
		state:     State{MaxFreshLeases: req.maxFreshLeases(), KeepLease: req.KeepLease},
		publisher: publisher{command: summarize(req.Command.String())},
	}
	r.compensation = compensation{r: r, max: r.state.MaxFreshLeases}
	if req.LeaseID != "" {
		r.lease = &sandbox.Lease{ID: req.LeaseID, Host: req.LeaseHost}
		r.state.LeaseID, r.state.LeaseHost = req.LeaseID, req.LeaseHost
		r.nextGeneration = 1
	}
	return r
}

func (r *run) run(ctx workflow.Context) (Result, error) {
	if err := r.req.Validate(); err != nil {
		return Result{}, activities.Failure(err)
	}
	if err := checkLeaseHost(ctx, r.lease); err != nil {
		return Result{}, err
	}
	if _, err := r.ensureTemplate(ctx); err != nil {
		return Result{}, err
	}
	result, err := r.runWithCompensation(ctx)
	if err == nil {
		result.LeaseID, result.LeaseHost = r.state.LeaseID, r.state.LeaseHost
		result.FreshLeases = r.state.FreshLeases
		if r.resultKnown != nil {
			known := result
			known.DestroyedLeases = slices.Clone(r.state.DestroyedLeases)
			known.LostLeases = slices.Clone(r.state.LostLeases)
			r.resultKnown(known)
		}
	}
	if cleanupErr := r.release(ctx); err == nil {
		err = cleanupErr
	}
	switch {
	case err == nil:
		r.setPhase(ctx, PhaseCompleted)
	case temporal.IsCanceledError(err):
		r.setPhase(ctx, PhaseCanceled)
	default:
		r.setPhase(ctx, PhaseFailed)
	}
	if err != nil {
		return Result{}, err
	}
	result.DestroyedLeases = slices.Clone(r.state.DestroyedLeases)
	result.LostLeases = slices.Clone(r.state.LostLeases)
	return result, nil
}

// runWithCompensation gets a lease and runs the command on it. When the
// lease turns out to be unusable it gives it up, takes a fresh one and runs
// the command again, as the compensation policy allows.
func (r *run) runWithCompensation(ctx workflow.Context) (Result, error) {
	if r.lease != nil {
		r.publisher.publish(ctx, r.state)
	}
	c := &r.compensation
	c.begin()
	starts := 0 // of the command on the leases given up
	for {
		var err error
		switch {
		case r.lease != nil:
		case r.nextGeneration == 0:
			err = r.acquire(ctx, 0, "")
		default:
			err = c.replace(ctx)
		}
		if r.lease != nil {
			var res sandbox.Result
			if res, err = r.execute(ctx, *r.lease); err == nil {
				res.Starts += starts
				return Result{Result: res}, nil
			}
			starts += startsOf(err)
		}
		if !c.unusable(err) {
			return Result{}, err
		}
		if err := c.giveUp(ctx, err); err != nil {
			return Result{}, err
		}
	}
}

// acquire gets the lease of the next generation: CreateLease for the
// first, AcquireFreshLease (which also sweeps earlier generations) for the
// others. fresh numbers the fresh lease among the command's (0 for the
// first lease); replacing names the lease it replaces, if any.
func (r *run) acquire(ctx workflow.Context, fresh int, replacing string) error {
	var lease sandbox.Lease
	var err error
	// A generation is used once, even by a create that failed: its
	// idempotency key may name a sandbox that must not be used.
	generation := r.nextGeneration
	r.nextGeneration++
	if generation == 0 {
		r.setPhase(ctx, PhaseCreatingLease)
		opts := r.options.createLease
		opts.Summary = "create lease" + describeSpec(r.req.Lease)
		err = executeActivity(ctx, opts, sandbox.Lease{Host: r.templateHost}, activities.NameCreateLease,
			activities.CreateLeaseInput{Spec: r.req.Lease, RunKey: r.runKey, Generation: generation}, &lease)
	} else {
		r.setPhase(ctx, PhaseCompensating)
		opts := r.options.acquireFreshLease
		opts.Summary = "acquire fresh lease"
		if fresh > 0 {
			opts.Summary += fmt.Sprintf(" %d/%d", fresh, r.state.MaxFreshLeases)
		}
		if replacing != "" {
			opts.Summary += " replacing " + replacing
		}
		err = executeActivity(ctx, opts, sandbox.Lease{Host: r.templateHost}, activities.NameAcquireFreshLease,
			// No Replacing: the lease given up is destroyed already
			// (compensation.giveUp); destroying it again on every attempt
			// would only cost requests.
			activities.AcquireFreshLeaseInput{Spec: r.req.Lease, RunKey: r.runKey, Generation: generation}, &lease)
	}
	if err != nil {
		return err
	}
	r.lease = &lease
	r.setLease(ctx, lease)
	return nil
}

func (r *run) execute(ctx workflow.Context, lease sandbox.Lease) (sandbox.Result, error) {
	r.setPhase(ctx, PhaseExecuting)
	opts, budget := withFailureBudget(r.options.execute)
	opts.Summary = fmt.Sprintf("execute `%s` in lease %s", r.publisher.command, lease.ID)
	var res sandbox.Result
	err := executeActivity(ctx, opts, lease, activities.NameExecute,
		activities.ExecuteInput{Lease: lease, Command: r.req.Command, SecretEnv: r.req.SecretEnv, MaxFailures: budget}, &res)
	var timeout *temporal.TimeoutError
	if sandbox.ErrorType(err) == "" && errors.As(err, &timeout) { // not SandboxHostLost (executeActivity)
		return res, r.unattended(ctx, lease, opts.ScheduleToCloseTimeout, timeout, err)
	}
	return res, err
}

// unattended is the end of a command that no Execute attempt followed to
// its end within its horizon (ScheduleToCloseTimeout; the attempts are
// otherwise unlimited, so only it ends Execute with a timeout): its
// workers kept dying, or could not reach Temporal. The process may still
// run with nobody to follow it, so the lease is destroyed with it now —
// even one the request keeps (KeepLease), since only the whole lease is
// sure to take the process tree along — and the failure is
// SandboxUnattended, not Temporal's untyped timeout.
func (r *run) unattended(ctx workflow.Context, lease sandbox.Lease, horizon time.Duration, timeout *temporal.TimeoutError, err error) error {
	var last activities.ExecuteProgress
	if timeout.HasLastHeartbeatDetails() {
		_ = timeout.LastHeartbeatDetails(&last) // best effort: the details name the process
	}
	d := sandbox.NewFailureDetails(sandbox.TypeUnattended)
	d.LeaseID, d.ProcessID, d.Starts = lease.ID, last.Process.ID, last.Starts
	failure := activities.NewFailure(fmt.Sprintf("no attempt of Execute followed the command to its end within %s; the lease is destroyed with it", horizon), d, err)
	if workflow.GetVersion(ctx, "unattended-destroys-lease", workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return failure
	}
	if derr := r.destroy(ctx, lease); derr != nil {
		workflow.GetLogger(ctx).Error("could not destroy the lease of an unattended command; the release tries again", "lease", lease.ID, "error", derr)
		r.req.KeepLease = false // so that the release destroys it, not keeps it
		return failure
	}
	r.lease = nil
	r.setLease(ctx, sandbox.Lease{})
	return failure
}

// startsOf is how many times the command started before the failure err
// of Execute (sandbox.FailureDetails.Starts).
func startsOf(err error) int {
	var appErr *temporal.ApplicationError
	var d sandbox.FailureDetails
	if !errors.As(err, &appErr) || appErr.Details(&d) != nil {
		return 0
	}
	return d.Starts
}

// destroy destroys a lease, or leaves it to its host's sweep when the
// host is lost (abandon).
func (r *run) destroy(ctx workflow.Context, lease sandbox.Lease) error {
	opts := r.options.destroyLease
	opts.Summary = "destroy lease " + lease.ID
	err := executeActivity(ctx, opts, lease, activities.NameDestroyLease,
		activities.DestroyLeaseInput{LeaseID: lease.ID}, nil)
	switch {
	case err == nil:
		r.state.DestroyedLeases = append(r.state.DestroyedLeases, lease.ID)
		r.publisher.publish(ctx, r.state)
	case sandbox.IsHostLostError(err):
		r.abandon(ctx, lease, err)
		return nil
	}
	return err
}

// abandon gives up a lease whose host is lost without destroying it:
// nobody would take the DestroyLease. The lease is counted in LostLeases;
// its host sweeps it when it returns, since no workflow holds it any more
// (SweepHost).
func (r *run) abandon(ctx workflow.Context, lease sandbox.Lease, cause error) {
	workflow.GetLogger(ctx).Warn("lease left to its lost host's sweep", "lease", lease.ID, "host", lease.Host, "error", cause)
	r.state.LostLeases = append(r.state.LostLeases, lease.ID)
	r.publisher.publish(ctx, r.state)
}

// release destroys the lease in use (unless the request keeps it) and
// sweeps the run's orphans. It runs in a disconnected context, so that a
// cancelled or failed run releases its lease too.
func (r *run) release(ctx workflow.Context) error {
	ctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	r.setPhase(ctx, PhaseCleaningUp)
	in := activities.DestroyLeaseInput{RunKey: r.runKey}
	// Where the sweep runs: the lease's host, else the host where the
	// run's leases are made (its template's), if any.
	lease := sandbox.Lease{Host: r.templateHost}
	if r.lease != nil {
		lease = *r.lease
	}
	if r.req.KeepLease {
		in.Keep = r.state.LeaseID
	} else {
		in.LeaseID = r.state.LeaseID
	}
	opts := r.options.destroyLease
	opts.Summary = "release: sweep orphans"
	if in.LeaseID != "" {
		opts.Summary = "release: destroy lease " + in.LeaseID + " and sweep orphans"
	}
	err := executeActivity(ctx, opts, lease, activities.NameDestroyLease, in, nil)
	switch {
	case sandbox.IsHostLostError(err) && in.LeaseID != "":
		// The run holds the lease no longer: its host's sweep destroys it.
		r.abandon(ctx, lease, err)
		r.setLease(ctx, sandbox.Lease{})
		return nil
	case sandbox.IsHostLostError(err):
		// A kept lease stays the caller's; the orphans the sweep would
		// have found are left to their host's sweep.
		workflow.GetLogger(ctx).Warn("release: the lease's host is lost; orphans are left to its sweep", "host", lease.Host, "error", err)
		return nil
	case err != nil:
		return err
	}
	if in.LeaseID != "" {
		r.state.DestroyedLeases = append(r.state.DestroyedLeases, in.LeaseID)
	}
	return nil
}

func (r *run) setPhase(ctx workflow.Context, phase Phase) {
	r.state.Phase = phase
	r.publisher.publish(ctx, r.state)
}

// setLease makes lease the one in use (the zero Lease for none).
func (r *run) setLease(ctx workflow.Context, lease sandbox.Lease) {
	r.state.LeaseID, r.state.LeaseHost = lease.ID, lease.Host
	r.publisher.publish(ctx, r.state)
}

// describeSpec renders the interesting parts of a lease spec for a
// summary: " (s-1vcpu-1gb, egress: any, ingress)".
func describeSpec(spec sandbox.LeaseSpec) string {
	out := " ("
	if spec.Shape != "" {
		out += spec.Shape + ", "
	}
	out += "egress: " + describeEgress(spec.Egress)
	if spec.IngressEnabled {
		out += ", ingress"
	}
	return out + ")"
}

// summarize keeps a command line short enough for a one-line summary.
func summarize(command string) string {
	const max = 60
	if r := []rune(command); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return command
}
