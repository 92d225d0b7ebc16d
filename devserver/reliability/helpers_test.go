package reliability

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/localsandbox/localsandboxtest"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Deadlines of the waits. They are generous: they bound a broken test, and
// a passing one never gets near them.
const (
	waitLong  = 2 * time.Minute       // a workflow's result
	waitShort = 30 * time.Second      // a state of the sandbox server
	poll      = 20 * time.Millisecond // how often a wait looks again
)

// options shape one row's stack.
type options struct {
	// sandbox configures the local sandbox server (its root is the test's).
	sandbox localsandbox.Options
	// client configures the worker's sandbox client (its URL is the proxy's).
	client createos.Config
	// persistent keeps Temporal's workflows in a database file, so that
	// the Temporal server can be restarted.
	persistent bool
	// noWorker starts no in-process worker: the test runs its own.
	noWorker bool
}

// env is one row's world: an embedded Temporal server, the local sandbox
// server, a FaultProxy in front of it and, unless options.noWorker, a
// worker whose sandbox client goes through the proxy.
type env struct {
	t     *testing.T
	stack *stack.Stack
	proxy *faultproxy.Proxy
	// direct reaches the sandbox server without the proxy: the test's own
	// hands, to release a held command.
	direct *createos.Client
	logs   *logSink
}

// start boots a row's stack for the duration of t. At the end of a test
// that passed so far, it checks that nothing leaked, then stops it all.
func start(t *testing.T, o options) *env {
	t.Helper()
	e := &env{t: t, logs: &logSink{}}
	logger := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tOpts := temporalserver.Options{UIPort: temporalserver.NoUI, Logger: logger, LogLevel: slog.LevelError}
	if o.persistent {
		tOpts.DBFile = filepath.Join(t.TempDir(), "temporal.db")
	}
	o.sandbox.Root = t.TempDir()
	worker := workerapp.Config{
		Sandbox: o.client,
		// Frequent heartbeats bring a cancellation to a command at once.
		HeartbeatInterval: 500 * time.Millisecond,
	}
	if worker.Sandbox.OperationTimeout == 0 {
		worker.Sandbox.OperationTimeout = 10 * time.Second
	}
	s, err := stack.Start(t.Context(), stack.Options{
		Temporal:       tOpts,
		Sandbox:        o.sandbox,
		FaultProxy:     true,
		FaultProxySeed: 1,
		NoWorker:       o.noWorker,
		Worker:         worker,
		Logger:         logger,
	})
	require.NoError(t, err, "start the stack")
	e.stack, e.proxy = s, s.Proxy
	t.Cleanup(func() {
		if !t.Failed() {
			e.assertNothingLeaked()
		}
		if err := s.Stop(); err != nil {
			t.Logf("stop the stack: %v", err)
		}
		if t.Failed() {
			t.Logf("logs of the stack:\n%s", e.logs.String())
		}
		e.logs.close()
	})
	e.direct, err = s.Provider(createos.Config{})
	require.NoError(t, err)
	return e
}

// logSink keeps the stack's logs to show them when a test fails. Parts
// of the stack may still log after the test ended; that is dropped.
type logSink struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	closed bool
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed && l.buf.Len() < 4<<20 {
		l.buf.Write(p)
	}
	return len(p), nil
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logSink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
}

// newMarker returns a line that only one command of the test prints.
func newMarker() string { return "RAN-" + rand.Text()[:16] }

// command is `sh -c 'echo MARKER; script'`: the marker is the first thing it
// prints once past its start gate.
func command(marker, script string) sandbox.Command {
	return sandbox.Command{Argv: []string{"sh", "-c", "echo " + marker + "; " + script}}
}

// heldScript keeps a command running until the test releases it (see
// env.release), then prints "released".
const heldScript = "while [ ! -e released ]; do sleep 0.05; done; echo released"

// request is a RunCommand request with the matrix's short timeouts and
// backoffs: faults are retried in a fraction of a second, not seconds.
func request(cmd sandbox.Command) workflows.Request {
	return workflows.Request{Command: cmd, ActivityOptions: fastActivities()}
}

func fastRetry(attempts int32) *temporal.RetryPolicy {
	return &temporal.RetryPolicy{
		InitialInterval:    100 * time.Millisecond,
		BackoffCoefficient: 2,
		MaximumInterval:    time.Second,
		MaximumAttempts:    attempts,
	}
}

// fastActivities keeps the documented retry counts (Execute 4 failures,
// its attempts unlimited; lease activities 5 attempts, DestroyLease
// unlimited) with short intervals. The
// activities mark their failures retryable or not themselves, so the
// policies need no list of non-retryable types.
func fastActivities() *workflows.ActivityOverrides {
	lease := &workflows.ActivityOptions{StartToCloseTimeout: time.Minute, HeartbeatTimeout: 10 * time.Second, RetryPolicy: fastRetry(5)}
	return &workflows.ActivityOverrides{
		CreateLease:       lease,
		AcquireFreshLease: lease,
		Execute:           &workflows.ActivityOptions{StartToCloseTimeout: 2 * time.Minute, HeartbeatTimeout: 10 * time.Second, RetryPolicy: fastRetry(4)},
		DestroyLease:      &workflows.ActivityOptions{StartToCloseTimeout: time.Minute, HeartbeatTimeout: 10 * time.Second, RetryPolicy: fastRetry(0)},
	}
}

// startRun starts RunCommand.
func (e *env) startRun(req workflows.Request) client.WorkflowRun {
	e.t.Helper()
	run, err := e.stack.Client.ExecuteWorkflow(e.t.Context(), client.StartWorkflowOptions{
		ID:        "reliability-" + e.t.Name() + "-" + rand.Text()[:8],
		TaskQueue: workflows.DefaultTaskQueue,
	}, workflows.WorkflowName, req)
	require.NoError(e.t, err)
	return run
}

// result waits for a run's outcome.
func (e *env) result(run client.WorkflowRun) (workflows.Result, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), waitLong)
	defer cancel()
	var res workflows.Result
	_, err := runresult.Get(ctx, e.stack.Client, run, &res)
	require.NoError(e.t, ctx.Err(), "the run did not end in time")
	return res, err
}

// run runs a request to its end.
func (e *env) run(req workflows.Request) (workflows.Result, error) {
	e.t.Helper()
	return e.result(e.startRun(req))
}

// processes returns the sandbox server's records of the processes made for
// the command printing marker, whether or not they passed their start gate.
func processes(srv *localsandbox.Server, marker string) []localsandbox.ProcessRecord {
	var out []localsandbox.ProcessRecord
	for _, r := range srv.History() {
		if !r.Exec && strings.Contains(strings.Join(r.Argv, " "), "echo "+marker+";") {
			out = append(out, r)
		}
	}
	return out
}

// ran counts the records whose process really ran the command: it printed
// the marker, which it does first thing once past its start gate.
func ran(records []localsandbox.ProcessRecord, marker string) int {
	n := 0
	for _, r := range records {
		if bytes.HasPrefix(r.Stdout, []byte(marker+"\n")) {
			n++
		}
	}
	return n
}

// waitRunning waits until the command printing marker runs, and returns
// its record.
func (e *env) waitRunning(srv *localsandbox.Server, marker string) localsandbox.ProcessRecord {
	e.t.Helper()
	var rec localsandbox.ProcessRecord
	require.Eventually(e.t, func() bool {
		for _, r := range processes(srv, marker) {
			if ran([]localsandbox.ProcessRecord{r}, marker) == 1 && r.End.IsZero() {
				rec = r
				return true
			}
		}
		return false
	}, waitShort, poll, "the command %s never ran", marker)
	return rec
}

// release lets a command running heldScript in the lease finish.
func (e *env) release(leaseID string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), waitShort)
	defer cancel()
	lease, err := e.direct.GetLease(ctx, leaseID)
	require.NoError(e.t, err)
	res, err := e.direct.Execute(ctx, lease, sandbox.Command{Argv: []string{"touch", "released"}}, nil)
	require.NoError(e.t, err)
	require.True(e.t, res.Succeeded(), "release: %+v", res)
}

// assertNothingLeaked checks the sandbox side: no lease and no process on
// the server, no process of any of its sandboxes alive on the machine.
func (e *env) assertNothingLeaked() {
	e.t.Helper()
	assert.EventuallyWithT(e.t, func(c *assert.CollectT) {
		assert.NoError(c, localsandboxtest.CheckNothingLeaked(e.stack.Sandbox))
	}, waitShort, poll)
}

// assertLeaseGone checks that the sandbox server no longer has the lease.
func (e *env) assertLeaseGone(leaseID string) {
	e.t.Helper()
	_, err := e.direct.GetLease(e.t.Context(), leaseID)
	var gone *sandbox.LeaseGoneError
	assert.ErrorAs(e.t, err, &gone, "lease %s still exists", leaseID)
}

// requireFired checks that a proxy rule injected exactly n faults.
func (e *env) requireFired(rule string, n int) {
	e.t.Helper()
	require.Equal(e.t, n, e.proxy.Fired(rule), "faults injected by rule %q; log: %v", rule, e.proxy.Log())
}

// requireApplicationError checks that err carries an ApplicationError of
// the given type (the first in its chain) and returns it.
func requireApplicationError(t *testing.T, err error, typ string) *temporal.ApplicationError {
	t.Helper()
	require.Error(t, err)
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr, "error: %v", err)
	require.Equal(t, typ, appErr.Type(), "error: %v", err)
	return appErr
}

// history is what the workflow history tells of a run's activities.
type history struct {
	// executeAttempts holds, for each Execute activity, its last attempt.
	executeAttempts []int32
	// retriedAfter holds, for each Execute activity retried, the type of
	// the failure of the attempt before the last.
	retriedAfter []string
	// cleanups are the details of the Execute attempts that failed with a
	// SandboxCleanupError.
	cleanups []activities.CleanupDetails
	// canceled is set when the run ended canceled.
	canceled bool
}

// readHistory reads the run's workflow history.
func (e *env) readHistory(run client.WorkflowRun) history {
	e.t.Helper()
	var h history
	activityTypes := map[int64]string{}
	it := e.stack.Client.GetWorkflowHistory(e.t.Context(), run.GetID(), run.GetRunID(), false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		event, err := it.Next()
		require.NoError(e.t, err)
		switch event.GetEventType() {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			activityTypes[event.GetEventId()] = event.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName()
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			attrs := event.GetActivityTaskStartedEventAttributes()
			if activityTypes[attrs.GetScheduledEventId()] == activities.NameExecute {
				h.executeAttempts = append(h.executeAttempts, attrs.GetAttempt())
				if attrs.GetAttempt() > 1 {
					h.retriedAfter = append(h.retriedAfter, attrs.GetLastFailure().GetApplicationFailureInfo().GetType())
				}
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED:
			attrs := event.GetActivityTaskFailedEventAttributes()
			if activityTypes[attrs.GetScheduledEventId()] == activities.NameExecute {
				if d, ok := cleanupDetails(e.t, event); ok {
					h.cleanups = append(h.cleanups, d)
				}
			}
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
			h.canceled = true
		}
	}
	return h
}

// cleanupDetails decodes the details of a failed activity's
// SandboxCleanupError.
func cleanupDetails(t *testing.T, event *historypb.HistoryEvent) (activities.CleanupDetails, bool) {
	info := event.GetActivityTaskFailedEventAttributes().GetFailure().GetApplicationFailureInfo()
	if info.GetType() != sandbox.TypeCleanup {
		return activities.CleanupDetails{}, false
	}
	var d activities.CleanupDetails
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(info.GetDetails(), &d))
	return d, true
}

// reasons lists the reasons of cleanup failures.
func reasons(cleanups []activities.CleanupDetails) []sandbox.CleanupReason {
	out := make([]sandbox.CleanupReason, len(cleanups))
	for i, c := range cleanups {
		out[i] = c.Reason
	}
	return out
}

// describe renders records for failure messages.
func describe(records []localsandbox.ProcessRecord) string {
	var b strings.Builder
	for _, r := range records {
		fmt.Fprintf(&b, "\n  %s/%s start=%s end=%s exit=%d signal=%q stdout=%q", r.LeaseID, r.ProcessID,
			r.Start.Format(time.StampMilli), r.End.Format(time.StampMilli), r.ExitCode, r.Signal, truncate(r.Stdout))
	}
	return b.String()
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}

var errNotEnded = errors.New("the process has not ended")

// killed reports whether the record's process ended by a signal, not on
// its own.
func killed(r localsandbox.ProcessRecord) error {
	switch {
	case r.End.IsZero():
		return errNotEnded
	case r.Signal == "":
		return fmt.Errorf("process %s exited with %d instead of being killed", r.ProcessID, r.ExitCode)
	}
	return nil
}

// logHistory logs the history of every run of a workflow id, one line per
// event, for a failing test to show which activity attempt or Update did
// what.
func (e *env) logHistory(workflowID string) {
	e.t.Helper()
	ctx := context.WithoutCancel(e.t.Context())
	resp, err := e.stack.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: fmt.Sprintf("WorkflowId = %q", workflowID)})
	if err != nil {
		e.t.Logf("history of %s: %v", workflowID, err)
		return
	}
	for _, ex := range slices.Backward(resp.GetExecutions()) {
		runID := ex.GetExecution().GetRunId()
		var b strings.Builder
		req := &workflowservice.GetWorkflowExecutionHistoryRequest{
			Namespace: e.stack.Temporal.Namespace(),
			Execution: ex.GetExecution(),
		}
		for {
			// A page may come empty with a token for more: read them all.
			page, err := e.stack.Client.WorkflowService().GetWorkflowExecutionHistory(ctx, req)
			if err != nil {
				fmt.Fprintf(&b, "\n  error: %v", err)
				break
			}
			for _, event := range page.GetHistory().GetEvents() {
				fmt.Fprintf(&b, "\n  %3d %s %s %s", event.GetEventId(), event.GetEventTime().AsTime().Format(time.StampMilli),
					strings.TrimPrefix(event.GetEventType().String(), "EVENT_TYPE_"), eventDetail(event))
			}
			if req.NextPageToken = page.GetNextPageToken(); len(req.NextPageToken) == 0 {
				break
			}
		}
		e.t.Logf("history of %s run %s:%s", workflowID, runID, b.String())
	}
}

// eventDetail is what logHistory shows of an event besides its type.
func eventDetail(event *historypb.HistoryEvent) string {
	switch a := event.GetAttributes().(type) {
	case *historypb.HistoryEvent_ActivityTaskScheduledEventAttributes:
		return a.ActivityTaskScheduledEventAttributes.GetActivityType().GetName()
	case *historypb.HistoryEvent_ActivityTaskStartedEventAttributes:
		at := a.ActivityTaskStartedEventAttributes
		return fmt.Sprintf("scheduled=%d attempt=%d last failure=%q", at.GetScheduledEventId(), at.GetAttempt(), at.GetLastFailure().GetMessage())
	case *historypb.HistoryEvent_ActivityTaskCompletedEventAttributes:
		return fmt.Sprintf("scheduled=%d", a.ActivityTaskCompletedEventAttributes.GetScheduledEventId())
	case *historypb.HistoryEvent_ActivityTaskFailedEventAttributes:
		at := a.ActivityTaskFailedEventAttributes
		return fmt.Sprintf("scheduled=%d failure=%q", at.GetScheduledEventId(), at.GetFailure().GetMessage())
	case *historypb.HistoryEvent_ActivityTaskTimedOutEventAttributes:
		at := a.ActivityTaskTimedOutEventAttributes
		return fmt.Sprintf("scheduled=%d failure=%q", at.GetScheduledEventId(), at.GetFailure().GetMessage())
	case *historypb.HistoryEvent_WorkflowExecutionUpdateAcceptedEventAttributes:
		at := a.WorkflowExecutionUpdateAcceptedEventAttributes
		return fmt.Sprintf("update=%s %s", at.GetAcceptedRequest().GetMeta().GetUpdateId(), at.GetAcceptedRequest().GetInput().GetName())
	case *historypb.HistoryEvent_WorkflowExecutionUpdateCompletedEventAttributes:
		return "update=" + a.WorkflowExecutionUpdateCompletedEventAttributes.GetMeta().GetUpdateId()
	case *historypb.HistoryEvent_WorkflowTaskScheduledEventAttributes:
		return fmt.Sprintf("attempt=%d", a.WorkflowTaskScheduledEventAttributes.GetAttempt())
	case *historypb.HistoryEvent_WorkflowTaskFailedEventAttributes:
		at := a.WorkflowTaskFailedEventAttributes
		return fmt.Sprintf("cause=%s failure=%q", at.GetCause(), at.GetFailure().GetMessage())
	case *historypb.HistoryEvent_WorkflowTaskTimedOutEventAttributes:
		return a.WorkflowTaskTimedOutEventAttributes.GetTimeoutType().String()
	}
	return ""
}

// waitHeartbeat waits until the server has recorded a heartbeat of the
// workflow's pending Execute activity. It may run on any goroutine (a
// proxy's Hold).
func (e *env) waitHeartbeat(workflowID string) {
	assert.Eventually(e.t, func() bool {
		_, beaten := e.pendingExecute(workflowID)
		return beaten
	}, waitShort, poll, "no heartbeat of Execute")
}

// pendingExecute returns what the server has recorded of the workflow's
// pending Execute activity: the progress in its last heartbeat, and
// whether it has recorded one. It may run on any goroutine.
func (e *env) pendingExecute(workflowID string) (activities.ExecuteProgress, bool) {
	desc, err := e.stack.Client.DescribeWorkflowExecution(e.t.Context(), workflowID, "")
	if err != nil {
		return activities.ExecuteProgress{}, false
	}
	for _, a := range desc.GetPendingActivities() {
		if a.GetActivityType().GetName() == activities.NameExecute && a.GetLastHeartbeatTime() != nil {
			var p activities.ExecuteProgress
			err := converter.GetDefaultDataConverter().FromPayloads(a.GetHeartbeatDetails(), &p)
			return p, assert.NoError(e.t, err, "heartbeat details of Execute")
		}
	}
	return activities.ExecuteProgress{}, false
}
