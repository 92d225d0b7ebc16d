package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// sandboxPath is the path of one sandbox: DELETE there destroys it.
const sandboxPath = "/sandboxes/*"

// The lease's DELETE fails (503, retried by DestroyLease) for as long as
// the test wants: the starter prints the command's output and exits with
// its code all the same, and says on stderr that the run goes on releasing
// the lease. The run still ends only after the release, once the DELETE
// goes through.
func TestStarterDoesNotWaitForAFailingRelease(t *testing.T) {
	e := start(t, options{})
	for _, asJSON := range []bool{false, true} {
		name := "text"
		if asJSON {
			name = "json"
		}
		t.Run(name, func(t *testing.T) {
			rule := "destroy fails (" + name + ")"
			e.proxy.AddRule(faultproxy.Rule{Name: rule, Method: http.MethodDelete, Path: sandboxPath, Fault: faultproxy.Status(http.StatusServiceUnavailable)})
			workflowID := "reliability-result-first-" + name
			args := []string{"--workflow-id", workflowID, "--", "sh", "-c", "echo done; exit 3"}
			if asJSON {
				args = append([]string{"--json"}, args...)
			}

			s := e.startStarter(args...)
			s.wait(t, "with every DELETE failing, the starter did not exit") // it must not wait for the release

			assert.Equal(t, 3, s.code, "the command's exit code; stderr: %s", s.stderr.String())
			leaseID := e.runLease(workflowID)
			if asJSON {
				var got map[string]any
				require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &got), s.stdout.String())
				assert.Equal(t, "done\n", got["stdout"])
				assert.Equal(t, true, got["releasing"])
				assert.Equal(t, leaseID, got["leaseId"])
			} else {
				assert.Equal(t, "done\n", s.stdout.String())
			}
			assert.Contains(t, s.stderr.String(), "run "+workflowID+" goes on releasing lease "+leaseID)
			// The proof that the starter did not wait: the release cannot
			// have happened yet.
			assert.GreaterOrEqual(t, e.proxy.Fired(rule), 1, "the release was tried")
			assert.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, e.runStatus(workflowID), "the run is still releasing the lease")
			_, err := e.direct.GetLease(t.Context(), leaseID)
			require.NoError(t, err, "the lease is still there")

			e.proxy.ClearRules()
			res, err := e.result(e.stack.Client.GetWorkflow(t.Context(), workflowID, ""))
			require.NoError(t, err, "the run ends once the DELETE goes through")
			assert.Equal(t, []string{leaseID}, res.DestroyedLeases)
			e.assertLeaseGone(leaseID)
		})
	}
}

// With --wait-release the starter prints the output as soon as the
// command has ended, but exits only once the run has released the lease.
func TestStarterWaitsForTheReleaseWhenAsked(t *testing.T) {
	e := start(t, options{})
	const rule = "destroy fails"
	e.proxy.AddRule(faultproxy.Rule{Name: rule, Method: http.MethodDelete, Path: sandboxPath, Fault: faultproxy.Status(http.StatusServiceUnavailable)})
	workflowID := "reliability-wait-release"

	s := e.startStarter("--wait-release", "--workflow-id", workflowID, "--", "sh", "-c", "echo done; exit 3")
	<-s.stdout.when("done\n") // the output comes before the release
	// DestroyLease retries after 1 s and then 2 s more: by the third
	// failure the starter would have left, were it not waiting.
	require.Eventually(t, func() bool { return e.proxy.Fired(rule) >= 3 }, waitLong, poll)
	select {
	case <-s.done:
		t.Fatalf("the starter exited while the release still failed: %s", s.stderr.String())
	default:
	}

	e.proxy.ClearRules()
	s.wait(t, "the starter did not exit after the release")
	assert.Equal(t, 3, s.code, s.stderr.String())
	assert.Equal(t, "done\n", s.stdout.String())
	assert.Empty(t, s.stderr.String())
	assert.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, e.runStatus(workflowID), "the run had ended")
}

// runningStarter is starterapp.Main running against the env's stack.
type runningStarter struct {
	stdout *watchedBuffer
	stderr *watchedBuffer
	done   chan struct{} // closed when Main has returned
	code   int           // Main's exit code, once done
}

// startStarter runs the starter with args in the background, as the
// binary would against the env's Temporal server.
func (e *env) startStarter(args ...string) *runningStarter {
	s := &runningStarter{stdout: &watchedBuffer{}, stderr: &watchedBuffer{}, done: make(chan struct{})}
	opts := client.Options{HostPort: e.stack.Temporal.FrontendHostPort(), Namespace: e.stack.Temporal.Namespace()}
	go func() {
		defer close(s.done)
		s.code = starterapp.Main(e.t.Context(), args, starterapp.IO{Stdin: strings.NewReader(""), Stdout: s.stdout, Stderr: s.stderr}, opts, nil)
	}()
	e.t.Cleanup(func() { <-s.done }) // t.Context() has ended, so Main returns
	return s
}

// runStatus is the status of the workflow's latest run.
func (e *env) runStatus(workflowID string) enumspb.WorkflowExecutionStatus {
	e.t.Helper()
	desc, err := e.stack.Client.DescribeWorkflowExecution(e.t.Context(), workflowID, "")
	require.NoError(e.t, err)
	return desc.GetWorkflowExecutionInfo().GetStatus()
}

// runLease is the lease the run's command ran on, by its State.
func (e *env) runLease(workflowID string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), waitShort)
	defer cancel()
	value, err := e.stack.Client.QueryWorkflow(ctx, workflowID, "", workflows.StateQuery)
	require.NoError(e.t, err)
	var state workflows.State
	require.NoError(e.t, value.Get(&state))
	require.NotEmpty(e.t, state.LeaseID)
	return state.LeaseID
}

// wait waits for Main to return, and fails the test with msg if it does
// not in time.
func (s *runningStarter) wait(t *testing.T, msg string) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(waitLong):
		t.Fatalf("%s; stderr: %s", msg, s.stderr.String())
	}
}

// watchedBuffer is a buffer that tells when it holds given text.
type watchedBuffer struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	watchers map[string]chan struct{}
}

// when returns a channel closed once the buffer holds want.
func (w *watchedBuffer) when(want string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watchers == nil {
		w.watchers = map[string]chan struct{}{}
	}
	seen := make(chan struct{})
	w.watchers[want] = seen
	w.check()
	return seen
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	w.check()
	return n, err
}

// check closes the channels of the watchers whose text has come; w.mu is
// held.
func (w *watchedBuffer) check() {
	for want, seen := range w.watchers {
		if strings.Contains(w.buf.String(), want) {
			close(seen)
			delete(w.watchers, want)
		}
	}
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
