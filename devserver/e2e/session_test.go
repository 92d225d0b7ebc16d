package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/localsandbox/localsandboxtest"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

func TestStarterRunsCommandsInOneSession(t *testing.T) {
	code, stdout, stderr := runStarter(t, "",
		"--env", "WHO=world", "--then", "cat note; echo $WHO", "--then", "exit 4", "--then", "echo never",
		"--", "sh", "-c", "echo hello > note")
	assert.Equal(t, 4, code, stderr)
	assert.Equal(t, "hello\nworld\n", stdout, "the second command sees the first one's file; the fourth never runs")
}

func TestStarterSessionFromAScriptAsJSON(t *testing.T) {
	script := t.TempDir() + "/steps"
	require.NoError(t, os.WriteFile(script, []byte("# one line a command\necho one > f\ncat f\n"), 0o600))
	code, stdout, stderr := runStarter(t, "", "--json", "--script", script)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 2, stdout)
	assert.Contains(t, lines[1], `"stdout":"one\n"`)
	assert.Contains(t, lines[1], `"seq":2`)
}

// sessionWorker runs the test's own workflows, the sandboxflow workflows
// and their activities on a task queue of its own.
func sessionWorker(t *testing.T, register func(worker.Worker)) string {
	t.Helper()
	s := stackOf(t)
	queue := "e2e-" + strings.ReplaceAll(t.Name(), "/", "-")
	provider, err := s.Provider(createos.Config{})
	require.NoError(t, err)
	w := worker.New(s.Client, queue, worker.Options{})
	workflows.Register(w, provider)
	register(w)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	return queue
}

// writeThenRead opens a session, writes a file in its workspace, lets
// another workflow read it through the session by reference, and closes
// the session.
func writeThenRead(ctx workflow.Context) (string, error) {
	sess, err := workflows.OpenSession(ctx, workflows.SessionRequest{})
	if err != nil {
		return "", err
	}
	if _, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", "echo shared > f"}}}); err != nil {
		return "", err
	}
	var read string
	if err := workflow.ExecuteChildWorkflow(ctx, readThroughSession, sess.ID).Get(ctx, &read); err != nil {
		return "", err
	}
	if _, err := sess.Close(ctx); err != nil {
		return "", err
	}
	return read, nil
}

// readThroughSession attaches to a session it did not open.
func readThroughSession(ctx workflow.Context, sessionID string) (string, error) {
	res, err := workflows.AttachSession(sessionID).Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"cat", "f"}}})
	return res.Stdout, err
}

func TestWorkflowsShareASessionByReference(t *testing.T) {
	t.Cleanup(func() { assertNothingLeaked(t) })
	queue := sessionWorker(t, func(w worker.Worker) {
		w.RegisterWorkflow(writeThenRead)
		w.RegisterWorkflow(readThroughSession)
	})
	run, err := stackOf(t).Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: queue}, writeThenRead)
	require.NoError(t, err)
	var read string
	require.NoError(t, run.Get(t.Context(), &read))
	assert.Equal(t, "shared\n", read)
}

// openAndLeave opens a session, runs a command and returns without
// closing it: the parent-close policy must clean up.
func openAndLeave(ctx workflow.Context) (string, error) {
	sess, err := workflows.OpenSession(ctx, workflows.SessionRequest{})
	if err != nil {
		return "", err
	}
	res, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"true"}}})
	return res.LeaseID, err
}

func TestParentCloseDestroysTheSessionsLease(t *testing.T) {
	queue := sessionWorker(t, func(w worker.Worker) { w.RegisterWorkflow(openAndLeave) })
	s := stackOf(t)
	run, err := s.Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: queue}, openAndLeave)
	require.NoError(t, err)
	var leaseID string
	require.NoError(t, run.Get(t.Context(), &leaseID))
	require.NotEmpty(t, leaseID)

	// The parent is closed; the session is cancelled and destroys its lease.
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, localsandboxtest.CheckNothingLeaked(s.Sandbox))
	}, 30*time.Second, 50*time.Millisecond)
}

func TestIdleSessionIsPausedAndTheNextCommandResumesIt(t *testing.T) {
	t.Cleanup(func() { assertNothingLeaked(t) })
	s := stackOf(t)
	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, s.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{IdleTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	first, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", "echo kept > f"}}})
	require.NoError(t, err)

	// The session says it paused the lease, and the sandbox server agrees.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		state, err := sess.State(ctx)
		require.NoError(c, err)
		assert.True(c, state.Paused)
	}, 30*time.Second, 50*time.Millisecond)
	direct, err := s.Provider(createos.Config{})
	require.NoError(t, err)
	lease, err := direct.GetLease(ctx, first.LeaseID)
	require.NoError(t, err)
	assert.Equal(t, sandbox.StatusPaused, lease.Status)

	second, err := sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"cat", "f"}}})
	require.NoError(t, err)
	assert.Equal(t, "kept\n", second.Stdout, "resumed with its workspace")
	assert.Equal(t, first.LeaseID, second.LeaseID)
	assert.False(t, second.WorkspaceReset)

	summary, err := sess.Close(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{first.LeaseID}, summary.DestroyedLeases)
}

// A session opened with its first command (update-with-start) runs that
// command from its first workflow task; with the id of the running
// session, another StartSessionWith runs its command in the same session.
func TestSessionStartedWithItsFirstCommand(t *testing.T) {
	t.Cleanup(func() { assertNothingLeaked(t) })
	s := stackOf(t)
	ctx := t.Context()
	sess, pending, err := sandboxclient.StartSessionWith(ctx, s.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{}, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", "echo one > f; cat f"}}})
	require.NoError(t, err)
	first, err := pending.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, "one\n", first.Stdout)
	assert.Equal(t, 1, first.Seq)

	// The first workflow task took the start and the command at once: the
	// lease was created from it.
	tasks := 0
	it := s.Client.GetWorkflowHistory(ctx, sess.ID(), sess.FirstRunID(), false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			tasks++
		}
		if ev.GetEventType() == enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED {
			break
		}
	}
	assert.Equal(t, 1, tasks, "one workflow task before the first activity")

	again, pending, err := sandboxclient.StartSessionWith(ctx, s.Client, client.StartWorkflowOptions{ID: sess.ID(), TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{}, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"cat", "f"}}})
	require.NoError(t, err)
	assert.Equal(t, sess.FirstRunID(), again.FirstRunID(), "the running session")
	second, err := pending.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, "one\n", second.Stdout)
	assert.Equal(t, first.LeaseID, second.LeaseID)
	assert.Equal(t, 2, second.Seq)

	_, err = sess.Close(ctx)
	require.NoError(t, err)
}

// requireSessionClosed checks that err is a typed SandboxSessionClosed.
func requireSessionClosed(t *testing.T, err error) {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr, "error: %v", err)
	assert.Equal(t, workflows.TypeSessionClosed, appErr.Type(), "error: %v", err)
}

func TestAClosedSessionRefusesCommandsByName(t *testing.T) {
	t.Cleanup(func() { assertNothingLeaked(t) })
	s := stackOf(t)
	ctx := t.Context()
	sess, err := sandboxclient.StartSession(ctx, s.Client, client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue}, workflows.SessionRequest{})
	require.NoError(t, err)
	_, err = sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"true"}}})
	require.NoError(t, err)
	_, err = sess.Close(ctx)
	require.NoError(t, err)

	_, err = sess.Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"true"}}})
	requireSessionClosed(t, err)
	_, err = sandboxclient.AttachSessionClient(s.Client, "no-such-session").Pause(ctx)
	requireSessionClosed(t, err)
}

// useClosedSession closes a session and then tries to use it, as a
// workflow holding a stale reference would.
func useClosedSession(ctx workflow.Context) error {
	sess, err := workflows.OpenSession(ctx, workflows.SessionRequest{})
	if err != nil {
		return err
	}
	if _, err := sess.Close(ctx); err != nil {
		return err
	}
	_, err = workflows.AttachSession(sess.ID).Execute(ctx, workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"true"}}})
	return err
}

func TestAWorkflowUsingAClosedSessionFailsByName(t *testing.T) {
	t.Cleanup(func() { assertNothingLeaked(t) })
	queue := sessionWorker(t, func(w worker.Worker) { w.RegisterWorkflow(useClosedSession) })
	run, err := stackOf(t).Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: queue}, useClosedSession)
	require.NoError(t, err)
	err = run.Get(t.Context(), nil)
	requireSessionClosed(t, err)
	assert.NotContains(t, err.Error(), "retryable: false) (type", "the session's error is not wrapped twice")
}

func TestStarterSessionWhoseLeaseFailsExitsWithItsType(t *testing.T) {
	code, stdout, stderr := runStarter(t, "", "--shape", "s-no-such-shape", "--then", "echo never", "--", "echo", "never")
	assert.Equal(t, starterapp.ExitRunFailed, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "command 1 (echo never) failed in session")
	// The server's machine code and request id name the failure, nothing of its message.
	assert.Regexp(t, `: SandboxAPIError: create sandbox: HTTP 400 INVALID_REQUEST \(request req-[0-9a-f]+\)\n$`, stderr)
	assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
}
