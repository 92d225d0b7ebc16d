package createos

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"path"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// errTimedOut is the cause that ends a run whose command ran out of time.
var errTimedOut = errors.New("the command ran out of time")

// Execute runs cmd in the lease and follows its output until it exits,
// its timeout expires or ctx ends (PROTOCOL.md §6):
//
//  1. cmd and the lease id are checked before any request is sent.
//  2. Stdin, if any, is staged as a file in the lease, and so is the
//     start script when it is too long to pass inline (script.go).
//  3. The process is created; obs.Started learns it at once, with the
//     Deadline that Attach would use (now + cmd.Timeout: a little before
//     the timeout expires, as it runs from step 4). If Started returns an
//     error, the run ends there: the process is killed before its command
//     could start, and Execute returns that error.
//  4. The output stream is attached, and only then is the start gate
//     opened (the run's token written to the process's stdin): the
//     command cannot write a byte that nobody reads. Its timeout runs from
//     there.
//  5. The output is followed, through reconnects, to the exit frame, and
//     delivered live to obs.Output.
//
// A non-zero exit and a timeout are Results, not errors; a Result keeps
// the last Config.CaptureBytes of each stream. When the run does not
// complete, the process tree is killed, with a deadline of its own even
// when ctx has ended, and the files staged for the run are removed.
//
// A caller that cancels ctx with the cause sandbox.ErrDetached leaves the
// process running for a later Attach: the error then wraps ErrDetached and
// nothing is killed or removed. (A process that obs.Started has not
// accepted is killed all the same: nobody could attach to it.)
//
// Errors, in order of precedence: a *sandbox.CleanupError when a process
// may exist that nobody controls (its creation was not confirmed, or its
// end was not) — destroy the lease; the refusal of obs.Started, wrapped,
// even when ctx has ended (the observer's refusal says why); a timeout (a
// Result with TimedOut); an error wrapping ctx's error ("command
// cancelled"); then the failure itself: *sandbox.ConnectionExhaustedError
// (the output could not be re-attached: the process is left as it is,
// running or exited with its result held by the server, and the error's
// Running is set, so that a later Attach reads on instead of the command
// running again),
// *sandbox.OutputEvictedError, *sandbox.ProtocolError,
// *sandbox.LeaseGoneError, *sandbox.APIError, *sandbox.UnavailableError or
// *sandbox.InvalidInputError.
func (c *Client) Execute(ctx context.Context, lease sandbox.Lease, cmd sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
	if err := cmd.Validate(); err != nil {
		return sandbox.Result{}, err
	}
	r, err := c.newRun(lease, rand.Text(), obs)
	if err != nil {
		return sandbox.Result{}, err
	}
	runCtx, expire := context.WithCancelCause(ctx)
	defer expire(nil)
	st, err := r.execute(runCtx, cmd, expire)
	return r.finish(ctx, runCtx, st, err)
}

// Attach follows a process that an earlier Execute started, from the start
// of its output, and returns its Result as Execute would have; it never
// starts the command again and does not call obs.Started. It opens the
// start gate in case the earlier caller died before it did (harmless
// otherwise), the gate file of earlier versions' scripts included; the
// timeout runs to proc.Deadline. Failures, reconnects and
// cleanup are those of Execute: in particular, a connection exhaustion
// leaves the process for another Attach, and an Attach whose ctx has
// ended already kills the process tree (an error wrapping ctx's, or a
// *sandbox.CleanupError if the kill is not confirmed) — the way to stop a
// process that was left running.
//
// If the server no longer holds the start of the output (the first connect
// answers 410), Attach waits for the process tree to exit and returns its
// exit status in a Result with Truncated set and no output. If the deadline
// has passed already, Attach first asks whether the tree has exited: if it
// has, the output is read in full; if not, the process is killed and the
// Result has TimedOut and Truncated set. A process that the server does
// not know (404) is a *sandbox.LeaseGoneError when its lease is gone; an
// error wrapping sandbox.ErrNeverStarted when an Execute refused by
// Observer.Started killed it behind its gate (the command never ran, and
// may be run); and otherwise a *sandbox.OutputEvictedError with Gone set:
// its Result cannot be recovered, and the command may have run. A Process
// without a Token is followed all the same, but no gate is opened and no
// file removed.
func (c *Client) Attach(ctx context.Context, lease sandbox.Lease, proc sandbox.Process, obs sandbox.Observer) (sandbox.Result, error) {
	if err := sandbox.CheckID("process id", proc.ID); err != nil {
		return sandbox.Result{}, err
	}
	if proc.Token != "" {
		if err := sandbox.CheckID("process token", proc.Token); err != nil {
			return sandbox.Result{}, err
		}
	}
	r, err := c.newRun(lease, proc.Token, obs)
	if err != nil {
		return sandbox.Result{}, err
	}
	r.f.pid = proc.ID
	r.known = true
	r.staged = proc.Token != "" // the earlier run's stdin may remain, and the legacy gate will
	runCtx, expire := context.WithCancelCause(ctx)
	defer expire(nil)
	st, err := r.attach(runCtx, proc.Deadline, expire)
	return r.finish(ctx, runCtx, st, err)
}

// A run is one command's life in a lease: the files staged for it, its
// process, its output, and what its end must undo.
type run struct {
	c         *Client
	leaseID   string
	workspace string
	token     string // names the run's files; may be empty for Attach
	obs       sandbox.Observer
	f         *follower // its pid is the process's, once known

	// creationUnconfirmed: a process-create request was sent and no answer
	// proved that it failed.
	creationUnconfirmed bool
	// known: the process is known beyond this run (obs.Started accepted it,
	// or Attach was given it), so a detaching caller may leave it running
	// for a later Attach. A process nobody knows is killed instead.
	known bool
	// refused: obs.Started refused the process, which is killed behind its
	// gate; the run's error is that refusal, whatever ctx says.
	refused bool
	staged  bool        // files of the run may exist in the lease
	timer   *time.Timer // the command's timeout, once running
}

func (c *Client) newRun(lease sandbox.Lease, token string, obs sandbox.Observer) (*run, error) {
	if err := sandbox.CheckID("lease id", lease.ID); err != nil {
		return nil, err
	}
	workspace := orDefault(lease.Workspace, c.cfg.workspace)
	if err := checkWorkspace("lease workspace", workspace); err != nil {
		return nil, err
	}
	if obs == nil {
		obs = nopObserver{}
	}
	return &run{
		c:         c,
		leaseID:   lease.ID,
		workspace: path.Clean(workspace),
		token:     token,
		obs:       obs,
		f:         newFollower(c, lease.ID, obs),
	}, nil
}

// execute stages, creates and follows the command's process.
func (r *run) execute(ctx context.Context, cmd sandbox.Command, expire context.CancelCauseFunc) (exitStatus, error) {
	spec := scriptSpec{
		token: r.token,
		dir:   workingDir(r.workspace, cmd.Cwd),
		env:   cmd.Env,
		argv:  cmd.Argv,
	}
	if len(cmd.Stdin) > 0 {
		spec.stdin = stdinPath(r.workspace, r.token)
		r.staged = true
		if err := r.c.putFile(ctx, r.leaseID, spec.stdin, cmd.Stdin); err != nil {
			return exitStatus{}, err
		}
	}

	args, err := r.processArgs(ctx, spec.build())
	if err != nil {
		return exitStatus{}, err
	}
	r.creationUnconfirmed = true
	pid, notCreated, err := r.c.createProcess(ctx, r.leaseID, args, r.workspace)
	if err != nil {
		r.creationUnconfirmed = !notCreated
		return exitStatus{}, err
	}
	r.creationUnconfirmed = false
	r.f.pid = pid
	var deadline time.Time
	if cmd.Timeout > 0 {
		deadline = time.Now().Add(cmd.Timeout)
	}
	if err := r.obs.Started(sandbox.Process{ID: pid, Token: r.token, Deadline: deadline}); err != nil {
		// Its gate is still shut: the command never ran. The observer may
		// have published the process all the same (its record reached
		// Temporal, the answer did not): the evidence tells a later Attach
		// that it may run the command (refusedPath). Best effort: without
		// it, that Attach fails rather than risk a second run.
		r.refused = true
		mctx, cancel := r.freshContext(ctx)
		_ = r.c.putFile(mctx, r.leaseID, refusedPath(r.workspace, r.token), nil)
		cancel()
		return exitStatus{}, fmt.Errorf("process %s not started: %w", pid, err)
	}
	r.known = true

	r.f.onAttach = func(ctx context.Context) error {
		// The timeout runs from the first gate write: from then on the
		// command may be running.
		if cmd.Timeout > 0 {
			r.timer = time.AfterFunc(cmd.Timeout, func() { expire(errTimedOut) })
		}
		return r.openGate(ctx)
	}
	return r.f.follow(ctx)
}

// attach follows an existing process (see Attach).
func (r *run) attach(ctx context.Context, deadline time.Time, expire context.CancelCauseFunc) (exitStatus, error) {
	if !deadline.IsZero() {
		left := time.Until(deadline)
		if left <= 0 {
			// Out of time already, unless it has exited: then its output is
			// all in the journal, to be read without a timeout.
			_, exited, err := r.c.waitTree(ctx, r.leaseID, r.f.pid, time.Millisecond)
			if err != nil {
				return exitStatus{}, err
			}
			if !exited {
				r.f.lost = true // its output is not read
				expire(errTimedOut)
				return exitStatus{}, errTimedOut
			}
		} else {
			r.timer = time.AfterFunc(left, func() { expire(errTimedOut) })
		}
	}
	if r.token != "" {
		r.f.onAttach = func(ctx context.Context) error {
			// Best effort: a script of this version does not look at it,
			// and cleanup removes it.
			_ = r.c.putFile(ctx, r.leaseID, legacyGatePath(r.workspace, r.token), nil)
			return r.openGate(ctx)
		}
	}
	st, err := r.f.follow(ctx)
	if statusOf(err) == http.StatusNotFound && !r.f.attached {
		return exitStatus{}, r.gone(ctx, err)
	}
	var evicted *sandbox.OutputEvictedError
	if errors.As(err, &evicted) && !r.f.attached {
		// The start of the output is gone: settle for the exit status.
		te, err := r.c.waitExit(ctx, r.leaseID, r.f.pid)
		if err != nil {
			return exitStatus{}, err
		}
		r.f.lost = true
		return te.status, nil
	}
	return st, err
}

// gone classifies a process that the server does not know (notFound), on
// a lease that exists: killed behind its gate by a refused Execute, whose
// evidence is there (ErrNeverStarted), or else lost with its result.
func (r *run) gone(ctx context.Context, notFound error) error {
	if r.token == "" {
		return &sandbox.OutputEvictedError{ProcessID: r.f.pid, Gone: true}
	}
	marker := refusedPath(r.workspace, r.token)
	code, err := r.c.exec(ctx, r.leaseID, "test", "-e", marker)
	switch {
	case err != nil:
		return fmt.Errorf("process %s is unknown (%v); look for its refusal: %w", r.f.pid, notFound, err)
	case code != 0:
		return &sandbox.OutputEvictedError{ProcessID: r.f.pid, Gone: true}
	}
	return fmt.Errorf("process %s: %w", r.f.pid, sandbox.ErrNeverStarted)
}

// openGate lets the command's script go on: it waits for its token on its
// stdin.
//
// A gate write whose outcome is unknown (5xx, 429, no answer) may have
// been delivered: the command may be running already. So such a write is
// repeated, after the reconnect delay, until it is answered, or refused
// for good (another 4xx: nothing was written, and the command never ran),
// or ctx ends — the command's timeout included, whose Result then says
// TimedOut. Writing the token again is harmless: the script reads one
// line, and a script gone past its gate no longer reads its stdin, which
// the server answers 409 — the gate is open. An ambiguous gate write is
// never a reason to kill the process and run the command again.
func (r *run) openGate(ctx context.Context) error {
	for {
		err := r.c.writeInput(ctx, r.leaseID, r.f.pid, gateLine(r.token))
		if statusOf(err) == http.StatusConflict {
			return nil
		}
		if err == nil || !outcomeUnknown(err) || ctx.Err() != nil {
			return err
		}
		if err := sleep(ctx, r.c.reconnectDelay); err != nil {
			return fmt.Errorf("open the start gate: %w", err)
		}
	}
}

// outcomeUnknown reports whether a failed request may have been carried
// out all the same: it got no answer, or one that does not say it was not
// (a 5xx; a 429 is included, as retrying an idempotent request is harmless).
func outcomeUnknown(err error) bool {
	var unavailable *sandbox.UnavailableError
	var api *sandbox.APIError
	return errors.As(err, &unavailable) || (errors.As(err, &api) && api.Retryable())
}

// leftForAttach reports whether err, with which a run ended, leaves its
// process as it is, and marks it so: the output connection was exhausted
// while the caller's context still runs (a caller that ends it wants the
// process killed).
func leftForAttach(err error) bool {
	var exhausted *sandbox.ConnectionExhaustedError
	if !errors.As(err, &exhausted) {
		return false
	}
	exhausted.Running = true
	return true
}

// finish classifies how the run ended (PROTOCOL.md §6, step 7) and cleans
// up (step 8). ctx is the caller's; runCtx ended with errTimedOut when the
// command ran out of time.
func (r *run) finish(ctx, runCtx context.Context, st exitStatus, err error) (sandbox.Result, error) {
	if r.timer != nil {
		r.timer.Stop()
	}
	completed := err == nil
	var res sandbox.Result
	switch {
	case completed:
		res = r.f.result(st)
	case r.f.pid == "" && r.creationUnconfirmed:
		err = &sandbox.CleanupError{Reason: sandbox.CreationUnconfirmed, LeaseID: r.leaseID, Err: err}
	case r.f.pid != "" && r.known && errors.Is(context.Cause(ctx), sandbox.ErrDetached):
		// The caller leaves the process to a later Attach: no kill, and its
		// gate and stdin files stay for that Attach to use.
		return sandbox.Result{}, fmt.Errorf("process %s left running: %w", r.f.pid, sandbox.ErrDetached)
	case r.f.pid != "" && r.known && ctx.Err() == nil && leftForAttach(err):
		// The output could not be read, but the process is known: a later
		// Attach reads on, and gets its exit status if it has exited. Killing
		// it would lose the result of a command that may have run, and a
		// retry would run it again.
		return sandbox.Result{}, err
	case r.refused:
		// The refusal says why (the observer could not record the
		// process, often because ctx is ending): the caller tells that
		// apart from a cancellation.
	case context.Cause(runCtx) == errTimedOut:
		res, err = r.f.result(exitStatus{}), nil
		res.TimedOut = true
	case ctx.Err() != nil:
		err = fmt.Errorf("command cancelled: %w", ctx.Err())
	}
	if err = r.cleanup(ctx, completed, err); err != nil {
		return sandbox.Result{}, err
	}
	return res, nil
}

// cleanup kills the process of a run that did not complete and removes
// the run's files, each step with a fresh deadline even when ctx has
// ended. A kill that is not confirmed overrides the result or the first
// error, which stays reachable through the *sandbox.CleanupError.
func (r *run) cleanup(ctx context.Context, completed bool, first error) error {
	if r.f.pid != "" && !completed {
		kctx, cancel := r.freshContext(ctx)
		err := r.c.killProcess(kctx, r.leaseID, r.f.pid)
		cancel()
		if err != nil {
			first = &sandbox.CleanupError{Reason: sandbox.TerminationUnconfirmed, LeaseID: r.leaseID, ProcessID: r.f.pid, Err: alsoFailed(first, err)}
		}
	}
	var gone *sandbox.LeaseGoneError
	if r.staged && r.token != "" && !errors.As(first, &gone) {
		rctx, cancel := r.freshContext(ctx)
		_ = r.c.removeFiles(rctx, r.leaseID, legacyGatePath(r.workspace, r.token), stdinPath(r.workspace, r.token), scriptPath(r.workspace, r.token))
		cancel()
	}
	return first
}

// freshContext keeps ctx's values but not its end, and gives a cleanup
// step its own OperationTimeout.
func (r *run) freshContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.c.cfg.operationTimeout)
}

type nopObserver struct{}

func (nopObserver) Started(sandbox.Process) error { return nil }
func (nopObserver) Output(sandbox.Chunk)          {}
