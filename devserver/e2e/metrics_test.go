package e2e

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// Two real runs through the fault proxy make every one of our counters
// move — a lost process-create response (a cleanup error, then a
// compensation), four failed connects (a connection-exhaustion retry), and
// an orphan planted under the second run's label (a suspected leak that its
// sweep destroys) — and the worker's /metrics shows each, exactly, beside
// the SDK's own metrics.
func TestMetricsShowTheCountersAfterARun(t *testing.T) {
	s, _ := startOwnStack(t, stack.Options{
		Temporal:   temporalserver.Options{UIPort: temporalserver.NoUI},
		FaultProxy: true,
		Worker: workerapp.Config{
			MetricsListen:     "127.0.0.1:0",
			HeartbeatInterval: 500 * time.Millisecond,
			Sandbox:           createos.Config{OperationTimeout: 10 * time.Second},
		},
	})
	require.NotEmpty(t, s.MetricsURL)
	direct, err := s.Provider(createos.Config{})
	require.NoError(t, err)

	// Run 1: the first process create's response is lost, then the fresh
	// lease's first four connects fail.
	s.Proxy.AddRule(faultproxy.Rule{Name: "lost create", Method: http.MethodPost, Path: "/sandboxes/*/processes", Times: 1, Fault: faultproxy.DropResponse()})
	s.Proxy.AddRule(faultproxy.Rule{Name: "503", Method: http.MethodGet, Path: "/sandboxes/*/processes/*/connect", Times: 2, Fault: faultproxy.Status(http.StatusServiceUnavailable)})
	s.Proxy.AddRule(faultproxy.Rule{Name: "429", Method: http.MethodGet, Path: "/sandboxes/*/processes/*/connect", Times: 2, Fault: faultproxy.Status(http.StatusTooManyRequests)})
	first := startRun(t, s, sandbox.Command{Argv: []string{"sh", "-c", "echo hello; echo oops >&2"}})
	var res workflows.Result
	require.NoError(t, first.Get(t.Context(), &res))
	require.Equal(t, "hello\n", res.Stdout)
	require.Equal(t, 1, res.FreshLeases, "one compensation")
	for _, rule := range []string{"lost create", "503", "429"} {
		require.Positive(t, s.Proxy.Fired(rule), "fault %q fired", rule)
	}

	// Run 2: held until an orphan labelled with its run exists.
	second := startRun(t, s, sandbox.Command{Argv: []string{"sh", "-c", "while [ ! -e released ]; do sleep 0.05; done; echo released"}})
	labels := map[string]string{activities.LabelRun: second.GetRunID()}
	var held sandbox.Lease
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		leases, err := direct.ListLeases(t.Context(), labels)
		require.NoError(c, err)
		require.Len(c, leases, 1)
		held = leases[0]
		require.Equal(c, sandbox.StatusRunning, held.Status)
	}, 30*time.Second, 20*time.Millisecond, "the second run has its lease")
	_, err = direct.CreateLease(t.Context(), sandbox.LeaseSpec{Labels: map[string]string{
		activities.LabelRun: second.GetRunID(), activities.LabelGeneration: "0",
	}})
	require.NoError(t, err, "plant an orphan")
	touched, err := direct.Execute(t.Context(), held, sandbox.Command{Argv: []string{"touch", "released"}}, nil)
	require.NoError(t, err)
	require.True(t, touched.Succeeded())
	require.NoError(t, second.Get(t.Context(), &res))
	require.Equal(t, "released\n", res.Stdout)

	// The SDK counts a completed workflow after the server has taken the
	// completing task, so Get can return before the counter moves: wait for
	// it, then read every counter from that one exposition.
	var text string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		text = string(httpGet(t, s.MetricsURL))
		n, _ := sumSamples(text, "temporal_workflow_completed_total", `workflow_type="sandboxflow.RunCommand"`)
		require.GreaterOrEqual(c, n, 2.0)
	}, 30*time.Second, 20*time.Millisecond, "the worker has counted both completions")
	for _, want := range []struct {
		metric string
		labels []string
		value  float64
	}{
		{"sandboxflow_leases_created_total", nil, 3},
		{"sandboxflow_compensations_total", []string{`activity_type="sandboxflow.AcquireFreshLease"`}, 1},
		{"sandboxflow_cleanup_errors_total", []string{`reason="creation_unconfirmed"`, `activity_type="sandboxflow.Execute"`}, 1},
		{"sandboxflow_connection_exhaustion_retries_total", []string{`activity_type="sandboxflow.Execute"`}, 1},
		{"sandboxflow_leaks_suspected_total", []string{`activity_type="sandboxflow.DestroyLease"`}, 1},
		{"sandboxflow_output_bytes_total", []string{`stream="stdout"`}, float64(len("hello\n") + len("released\n"))},
		{"sandboxflow_output_bytes_total", []string{`stream="stderr"`}, float64(len("oops\n"))},
		{"sandboxflow_command_duration_seconds_count", nil, 2},
		{"temporal_workflow_completed_total", []string{`workflow_type="sandboxflow.RunCommand"`}, 2},
	} {
		got, found := sumSamples(text, want.metric, want.labels...)
		assert.True(t, found, "%s%v is on /metrics", want.metric, want.labels)
		assert.Equal(t, want.value, got, "%s%v", want.metric, want.labels)
	}
	// Every lease created is destroyed once, and the orphan.
	destroyed, _ := sumSamples(text, "sandboxflow_leases_destroyed_total")
	assert.Equal(t, float64(3+1), destroyed)
	for _, sdk := range []string{"temporal_activity_execution_latency_seconds_count", "temporal_request_total", "temporal_workflow_task_execution_latency_seconds_count"} {
		n, _ := sumSamples(text, sdk)
		assert.Positive(t, n, "the SDK's %s", sdk)
	}
}

// startRun starts RunCommand on s with short retry backoffs.
func startRun(t *testing.T, s *stack.Stack, cmd sandbox.Command) client.WorkflowRun {
	t.Helper()
	retry := &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: time.Second, MaximumAttempts: 4}
	fast := &workflows.ActivityOptions{StartToCloseTimeout: time.Minute, HeartbeatTimeout: 10 * time.Second, RetryPolicy: retry}
	run, err := s.Client.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{TaskQueue: workflows.DefaultTaskQueue},
		workflows.WorkflowName, workflows.Request{Command: cmd, ActivityOptions: &workflows.ActivityOverrides{
			CreateLease: fast, AcquireFreshLease: fast, Execute: fast, DestroyLease: fast,
		}})
	require.NoError(t, err)
	return run
}

// sumSamples adds up the samples of metric (the full sample name, as
// exposed) whose labels include every one of labels (`name="value"`).
func sumSamples(exposition, metric string, labels ...string) (sum float64, found bool) {
	sc := bufio.NewScanner(strings.NewReader(exposition))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labelText := ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			name, labelText, rest = line[:i], line[i+1:j], strings.TrimSpace(line[j+1:])
		}
		if name != metric {
			continue
		}
		matches := true
		for _, l := range labels {
			matches = matches && strings.Contains(","+labelText+",", ","+l+",")
		}
		if !matches {
			continue
		}
		value, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		sum, found = sum+value, true
	}
	return sum, found
}
