package activities

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"
	"unicode/utf8"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// ExecuteInput is a command to run on a lease.
type ExecuteInput struct {
	Lease   sandbox.Lease   `json:"lease"`
	Command sandbox.Command `json:"command"`
	// SecretEnv adds environment variables whose values are secrets:
	// variable name → secret name, resolved on the worker by
	// Activities.Secrets. Only the names travel through workflow history.
	SecretEnv map[string]string `json:"secretEnv,omitempty"`
	// MaxFailures is how many failures of the sandbox service (a retryable
	// failure: a lost output connection, a 5xx, an unreachable server) the
	// command's Execute may meet, across its attempts, before it gives up
	// with a non-retryable failure; zero sets no budget of its own. A
	// worker's death, a detach and Temporal's refusal to record a process
	// are not failures and cost nothing. The workflows move Execute's
	// RetryPolicy.MaximumAttempts here (workflows/options.go), and schedule
	// Execute with unlimited attempts bounded by its ScheduleToCloseTimeout.
	MaxFailures int `json:"maxFailures,omitempty"`
}

// ExecuteProgress is what Execute records in its heartbeats: what the Web UI
// shows of a running command, and what a retry needs to re-attach to it.
type ExecuteProgress struct {
	// LeaseID is the lease the command runs on.
	LeaseID string `json:"leaseId,omitempty"`
	// Process is the command's process once it exists. With LeaseID it
	// names the output stream: a new process is a new stream.
	Process sandbox.Process `json:"process,omitzero"`
	// StartedAt is when the process was created, by whichever attempt
	// created it: the command's duration (a metric) runs from it, however
	// many attempts followed the process.
	StartedAt time.Time `json:"startedAt,omitzero"`
	// Cursor is the sequence number of the last output frame read.
	Cursor int64 `json:"cursor,omitempty"`
	// Bytes counts the output bytes read so far.
	Bytes int64 `json:"bytes,omitempty"`
	// Ended is set when the attempt that recorded it saw the process end or
	// killed it: a retry must then start the command anew rather than attach
	// to a dead process. An attempt that could not read the output of its
	// process (a connection exhaustion) leaves it unset: the process is
	// left as it was, and the retry attaches to it and reads on.
	Ended bool `json:"ended,omitempty"`
	// Starts counts the processes started for the command and recorded in
	// Temporal, across attempts: what Result.Starts reports.
	Starts int `json:"starts,omitempty"`
	// Failures counts the failures of the sandbox service met so far,
	// across attempts: what ExecuteInput.MaxFailures bounds. A heartbeat
	// timeout or a detach leaves it as it was.
	Failures int `json:"failures,omitempty"`
	// Stdout and Stderr are the ends of the command's output streams, for
	// whoever shows it live (the starter, the Web UI's pending activity).
	Stdout OutputTail `json:"stdout,omitzero"`
	Stderr OutputTail `json:"stderr,omitzero"`
}

// LiveTailBytes bounds the output that each stream's OutputTail carries in
// a heartbeat, so that heartbeats (encrypted with the rest when the codec is
// on) stay small.
const LiveTailBytes = 4 << 10

// OutputTail is the end of one output stream as Execute's heartbeats carry
// it. The stream's bytes [End-len(Text), End) are Text; a reader that has
// printed the stream up to offset n prints Text from n on, and learns that
// it missed End-len(Text)-n bytes when that is positive.
type OutputTail struct {
	// Text is the stream's last output, decoded as UTF-8, at most
	// LiveTailBytes long and cut at a character boundary.
	Text string `json:"text,omitempty"`
	// End is the offset of Text's end in the stream: how many bytes of
	// decoded output the stream has produced in all.
	End int64 `json:"end,omitempty"`
}

// Start is the offset in the stream of Text's first byte.
func (t OutputTail) Start() int64 { return t.End - int64(len(t.Text)) }

// append adds text to the end of the stream, keeping at most LiveTailBytes.
func (t *OutputTail) append(text string) {
	t.End += int64(len(text))
	if len(t.Text)+len(text) <= LiveTailBytes {
		t.Text += text
		return
	}
	if len(text) < LiveTailBytes {
		text = t.Text[len(t.Text)-(LiveTailBytes-len(text)):] + text
	}
	cut := len(text) - LiveTailBytes
	for cut < len(text) && !utf8.RuneStart(text[cut]) {
		cut++
	}
	t.Text = text[cut:]
}

// Execute runs a command on a lease and returns its Result; a non-zero exit
// and a timeout are Results, not errors.
//
// While the command runs, Execute heartbeats its ExecuteProgress. A new
// process is recorded on the Temporal server before its command may start.
// When an earlier attempt's heartbeat names a process that did not end — the
// worker running it died — Execute attaches to that process instead of
// starting the command again, so a worker crash never runs a command twice.
// A process that is gone is run again only when the provider proves that
// its command never started (sandbox.ErrNeverStarted: an attempt that could
// not record it killed it behind its gate); otherwise its result is lost
// (a SandboxOutputEvicted failure), never a second run. When Execute
// ends a process itself (it exited, timed out or was cancelled), its last
// heartbeat says so, and a retry starts afresh.
//
// An attempt that cannot read its command's output (a connection
// exhaustion) leaves the process as it is, running or exited with its
// result on the server, and fails retryably: the next attempt re-attaches
// and reads the exit status and the output, so a command is never run
// again only because its reader failed. Each such failure, like every
// other retryable failure of the sandbox service, counts against
// ExecuteInput.MaxFailures; the attempt that spends the budget kills the
// process (an unconfirmed kill is a cleanup error) and fails for good.
// Worker deaths and detaches cost nothing: the count travels in the
// heartbeat details (ExecuteProgress.Failures), which survive them.
//
// Cancellation arrives through the heartbeat: the process tree is killed and
// the activity reports itself cancelled.
func (a *Activities) Execute(ctx context.Context, in ExecuteInput) (sandbox.Result, error) {
	cmd, err := a.withSecrets(ctx, in.Command, in.SecretEnv)
	if err != nil {
		return sandbox.Result{}, classify(err)
	}
	lease := in.Lease
	if lease.Workspace == "" {
		// A lease the workflow did not create itself: learn where its
		// workspace is (and that it still exists) before starting anything.
		if lease, err = a.Provider.GetLease(ctx, lease.ID); err != nil {
			return sandbox.Result{}, classify(err)
		}
	}

	var previous ExecuteProgress
	if activity.HasHeartbeatDetails(ctx) {
		if err := activity.GetHeartbeatDetails(ctx, &previous); err != nil {
			activity.GetLogger(ctx).Warn("ignoring unreadable heartbeat details of the previous attempt", "error", err)
			previous = ExecuteProgress{}
		}
	}

	m := meterOf(ctx)
	progress := &progressRecorder{ctx: ctx, record: a.heartbeats().RecordHeartbeatNow, bytes: m.outputCounters(),
		progress: ExecuteProgress{LeaseID: lease.ID, Starts: previous.Starts, Failures: previous.Failures}}
	reattach := previous.Process.ID != "" && !previous.Ended
	if reattach {
		// Before the periodic heartbeats begin: none of them may forget
		// the process.
		progress.resume(previous)
	}
	stop, nudge, hold := a.keepBeating(ctx, progress.snapshot)
	progress.nudge, progress.hold = nudge, hold
	runCtx, release := followContext(ctx, activity.GetWorkerStopChannel(ctx))
	var result sandbox.Result
	if reattach {
		activity.GetLogger(ctx).Info("re-attaching to the process of an earlier attempt", "lease", lease.ID, "process", previous.Process.ID)
		result, err = a.Provider.Attach(runCtx, lease, previous.Process, progress)
		if errors.Is(err, sandbox.ErrNeverStarted) {
			// That attempt could not record its process in Temporal and
			// killed it behind its start gate; the record reached the
			// server all the same. The command has not run: run it now.
			activity.GetLogger(ctx).Info("the process of an earlier attempt never started its command; starting it", "lease", lease.ID, "process", previous.Process.ID)
			progress.forget()
			result, err = a.Provider.Execute(runCtx, lease, cmd, progress)
		}
	} else {
		result, err = a.Provider.Execute(runCtx, lease, cmd, progress)
	}
	release()
	stop()
	if errors.Is(err, sandbox.ErrDetached) {
		// The process runs on; the last heartbeat names it, so the next
		// attempt attaches to it.
		d := sandbox.NewFailureDetails(TypeDetached)
		d.LeaseID, d.ProcessID, d.Attempt, d.Starts = lease.ID, progress.processID(), attemptOf(ctx), progress.starts()
		return sandbox.Result{}, NewFailure(
			"left the command running for the next attempt to attach to: "+context.Cause(runCtx).Error(), d, nil)
	}
	var unrecorded *unrecordedError
	if errors.As(err, &unrecorded) && sandbox.ErrorType(err) == "" {
		// Killed before its command could start: a retry starts afresh.
		progress.end()
		d := sandbox.NewFailureDetails(TypeUnrecorded)
		d.LeaseID, d.Attempt, d.Starts = lease.ID, attemptOf(ctx), progress.starts()
		return sandbox.Result{}, NewFailure(err.Error(), d, nil)
	}
	retry := err != nil && sandbox.Retryable(err) && !budgetSpent(ctx, progress.failed(), in.MaxFailures)
	var exhausted *sandbox.ConnectionExhaustedError
	if errors.As(err, &exhausted) && exhausted.Running {
		if retry {
			// The process is left as it is, and the last heartbeat names
			// it, not Ended: the next attempt attaches and reads on.
			return sandbox.Result{}, executeFailure(ctx, err, progress.starts(), true)
		}
		err = a.stopLeft(ctx, lease, progress.process(), err)
	}
	// Otherwise this attempt is done with the process: it exited, or the
	// provider killed it (or reported why it could not).
	started := progress.end()
	if err != nil {
		return sandbox.Result{}, executeFailure(ctx, err, progress.starts(), retry)
	}
	if !started.IsZero() {
		m.commandEnded(started)
	}
	result.Starts = progress.starts()
	return result, nil
}

// budgetSpent reports whether an Execute attempt that met the command's
// failures-th failure of the sandbox service is its last: the budget
// (maxFailures, if set) is used up, or Temporal will not retry it — the
// attempt is the last that its retry policy allows, which is where a
// workflow of an earlier version puts the budget.
func budgetSpent(ctx context.Context, failures, maxFailures int) bool {
	if maxFailures > 0 && failures >= maxFailures {
		return true
	}
	if !activity.IsActivity(ctx) {
		return false
	}
	info := activity.GetInfo(ctx)
	return info.RetryPolicy != nil && info.RetryPolicy.MaximumAttempts > 0 && info.Attempt >= info.RetryPolicy.MaximumAttempts
}

// stopLeft kills the process that a connection exhaustion left running,
// once no attempt will follow it any more: an Attach whose context has
// ended kills the process tree (sandbox.Provider.Attach, as Execute kills a
// cancelled command). It returns cause, or the *sandbox.CleanupError of a
// kill that was not confirmed: then the lease may hold the process, and is
// given up.
func (a *Activities) stopLeft(ctx context.Context, lease sandbox.Lease, proc sandbox.Process, cause error) error {
	kctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	cancel(errors.New("the failure budget is spent: stop the process"))
	_, err := a.Provider.Attach(kctx, lease, proc, nil)
	if sandbox.IsCleanupError(err) {
		activity.GetLogger(ctx).Warn("could not confirm the kill of a process whose output could not be read", "lease", lease.ID, "process", proc.ID, "error", err)
		return err
	}
	return cause
}

// executeFailure is fail for Execute: its details count the command's
// starts, and a failure that spent the budget (retry false) is not
// retryable, whatever its kind.
func executeFailure(ctx context.Context, err error, starts int, retry bool) error {
	meterOf(ctx).failed(err)
	return classifyWith(err, func(d *sandbox.FailureDetails) {
		d.Attempt, d.Starts = attemptOf(ctx), starts
		d.Retryable = d.Retryable && retry
	})
}

// TypeDetached is the (retryable) error type of an Execute attempt that
// left its command running for the next attempt: its worker is shutting
// down, or Temporal no longer counts it as the current attempt.
const TypeDetached = sandbox.TypeDetached

// TypeUnrecorded is the (retryable) error type of an Execute attempt that
// could not record its new process in Temporal: the process was killed
// before its command could start, so the next attempt starts it afresh.
const TypeUnrecorded = sandbox.TypeUnrecorded

// unrecordedError is the refusal of progressRecorder.Started.
type unrecordedError struct{ err error }

func (e *unrecordedError) Error() string {
	return "the process could not be recorded in Temporal before its command started: " + e.err.Error()
}

func (e *unrecordedError) Unwrap() error { return e.err }

// followContext returns the context in which an Execute attempt follows its
// command. It ends when ctx does, but with a cause that tells the provider
// whether to kill the process or to leave it running (sandbox.ErrDetached):
//
//   - the workflow cancelled the activity, or the attempt ran out of
//     time, or the cause is unknown: kill, as ctx says;
//   - the worker is shutting down (workerStopping closes): detach at once,
//     without waiting for ctx to end; a retry on another worker attaches;
//   - Temporal no longer knows this attempt (its heartbeat timed out, so
//     another attempt may already have attached), the activity was paused,
//     or heartbeats could not reach the server: detach, since killing could
//     break the attempt that owns the process now.
//
// release frees its resources.
func followContext(ctx context.Context, workerStopping <-chan struct{}) (runCtx context.Context, release func()) {
	base := context.WithoutCancel(ctx)
	stopDeadline := func() {}
	if deadline, ok := ctx.Deadline(); ok {
		base, stopDeadline = context.WithDeadline(base, deadline)
	}
	runCtx, cancel := context.WithCancelCause(base)
	done := make(chan struct{})
	go func() {
		select {
		case <-workerStopping:
			cancel(fmt.Errorf("worker stopping: %w", sandbox.ErrDetached))
		case <-ctx.Done():
			if cause := context.Cause(ctx); killOn(cause) {
				cancel(cause)
			} else {
				cancel(fmt.Errorf("%w: %v", sandbox.ErrDetached, cause))
			}
		case <-done:
		}
	}()
	return runCtx, func() {
		close(done)
		cancel(nil)
		stopDeadline()
	}
}

// killOn reports whether an attempt whose context ended with cause should
// kill its process (see followContext).
func killOn(cause error) bool {
	var (
		notFound           *serviceerror.NotFound
		unavailable        *serviceerror.Unavailable
		rpcDeadline        *serviceerror.DeadlineExceeded
		namespaceNotActive *serviceerror.NamespaceNotActive
		namespaceNotFound  *serviceerror.NamespaceNotFound
	)
	switch {
	case errors.As(cause, &notFound), errors.As(cause, &unavailable), errors.As(cause, &rpcDeadline),
		errors.As(cause, &namespaceNotActive), errors.As(cause, &namespaceNotFound),
		errors.Is(cause, activity.ErrActivityPaused): // a paused activity resumes with a new attempt
		return false
	}
	return true
}

// withSecrets returns cmd with the secret variables added.
func (a *Activities) withSecrets(ctx context.Context, cmd sandbox.Command, secretEnv map[string]string) (sandbox.Command, error) {
	if len(secretEnv) == 0 {
		return cmd, nil
	}
	if a.Secrets == nil {
		return cmd, &sandbox.InvalidInputError{Field: "secretEnv", Reason: "this worker has no secret source configured"}
	}
	env := maps.Clone(cmd.Env)
	if env == nil {
		env = make(map[string]string, len(secretEnv))
	}
	for variable, secret := range secretEnv {
		if _, clash := env[variable]; clash {
			return cmd, &sandbox.InvalidInputError{Field: "secretEnv", Reason: fmt.Sprintf("%s is also a plain environment variable", variable)}
		}
		value, err := a.Secrets.Secret(ctx, secret)
		if err != nil {
			return cmd, &sandbox.InvalidInputError{Field: "secretEnv", Reason: err.Error()}
		}
		env[variable] = value
	}
	cmd.Env = env
	return cmd, nil
}

// progressRecorder follows a running command for Execute's heartbeats and
// its metrics.
type progressRecorder struct {
	ctx context.Context
	// record records a heartbeat and returns once the server has it
	// (Activities.Heartbeats).
	record func(context.Context, any) error
	bytes  map[sandbox.Stream]client.MetricsCounter // output bytes by stream
	// nudge asks for a heartbeat soon: output has arrived.
	nudge func()
	// hold runs a function while no periodic heartbeat is recorded.
	hold func(func())

	mu        sync.Mutex
	progress  ExecuteProgress
	// replayed is the last frame that an earlier attempt already added to
	// the output tails: Attach delivers the output from its start again.
	replayed int64
}

// resume continues what an earlier attempt recorded of the process it
// started: the output tails go on from where its last heartbeat left
// them, so that a reader of the heartbeats sees one stream.
func (r *progressRecorder) resume(previous ExecuteProgress) {
	r.mu.Lock()
	r.progress.Process, r.progress.StartedAt = previous.Process, previous.StartedAt
	r.progress.Stdout, r.progress.Stderr = previous.Stdout, previous.Stderr
	r.progress.Cursor, r.replayed = previous.Cursor, previous.Cursor
	r.mu.Unlock()
	activity.RecordHeartbeat(r.ctx, r.snapshot())
}

// processID is the process this attempt follows, once it exists.
func (r *progressRecorder) processID() string { return r.process().ID }

// process is the process this attempt follows, once it exists.
func (r *progressRecorder) process() sandbox.Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress.Process
}

// starts is ExecuteProgress.Starts.
func (r *progressRecorder) starts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress.Starts
}

// failed counts a failure of the sandbox service in the heartbeat
// details, and returns the count. The SDK sends the last details it was
// given before it reports the attempt's failure, so the next attempt
// finds the count.
func (r *progressRecorder) failed() int {
	r.mu.Lock()
	r.progress.Failures++
	failures := r.progress.Failures
	r.mu.Unlock()
	activity.RecordHeartbeat(r.ctx, r.snapshot())
	return failures
}

// Started records the process and returns once the Temporal server has
// it; the command waits behind its start gate until then. From then on a
// worker crash or a Temporal outage leads to a re-attach, not to a second
// run. A heartbeat through the SDK alone could not promise that: the SDK
// holds heartbeats back for its throttle interval (up to the worker's
// MaxHeartbeatThrottleInterval after the previous one), and one that dies
// with the worker, or fails while the server is down, leaves the server
// with details that name no process. If the server cannot be told, Started
// refuses the process: it is killed before its command starts.
//
// The SDK's heartbeats name the process only once the server has
// recorded it: a process that was refused must not be published by a
// heartbeat that reaches a slow server late, or the next attempt would
// look for a process that was killed. (It may be all the same, when the
// record reached the server but its answer did not; the provider leaves
// evidence that the command never started, and the next attempt runs it,
// see Execute.) The periodic heartbeats wait while the record is in
// flight (hold), so that none with older details follows it.
func (r *progressRecorder) Started(p sandbox.Process) error {
	r.mu.Lock()
	details := r.progress
	details.Process, details.StartedAt = p, time.Now()
	details.Starts++
	r.mu.Unlock()
	var err error
	r.hold(func() {
		if err = r.record(r.ctx, details); err != nil {
			return
		}
		r.mu.Lock()
		r.progress.Process, r.progress.StartedAt, r.progress.Starts = p, details.StartedAt, details.Starts
		r.mu.Unlock()
		activity.RecordHeartbeat(r.ctx, r.snapshot())
	})
	if err != nil {
		return &unrecordedError{err}
	}
	return nil
}

// forget drops the process that resume took over: it is gone, and the
// command is started anew.
func (r *progressRecorder) forget() {
	r.mu.Lock()
	r.progress = ExecuteProgress{LeaseID: r.progress.LeaseID, Starts: r.progress.Starts, Failures: r.progress.Failures}
	r.replayed = 0
	r.mu.Unlock()
}

func (r *progressRecorder) Output(c sandbox.Chunk) {
	r.mu.Lock()
	if c.Seq > r.replayed {
		r.progress.Cursor = max(r.progress.Cursor, c.Seq)
		switch c.Stream {
		case sandbox.Stdout:
			r.progress.Stdout.append(c.Text)
		case sandbox.Stderr:
			r.progress.Stderr.append(c.Text)
		}
	}
	r.progress.Bytes += int64(c.Bytes)
	replayed := c.Seq <= r.replayed
	r.mu.Unlock()
	if r.nudge != nil && c.Text != "" {
		r.nudge()
	}
	// A re-attach reads the journal from its start: the frames an earlier
	// attempt recorded were counted by it.
	if counter, ok := r.bytes[c.Stream]; ok && !replayed {
		counter.Inc(int64(c.Bytes))
	}
}

func (r *progressRecorder) snapshot() any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress
}

// end records that this attempt is done with the process, and returns when
// the process was created, by this attempt or an earlier one (zero when no
// process began).
func (r *progressRecorder) end() (startedAt time.Time) {
	r.mu.Lock()
	r.progress.Ended = true
	startedAt = r.progress.StartedAt
	r.mu.Unlock()
	activity.RecordHeartbeat(r.ctx, r.snapshot())
	return startedAt
}
