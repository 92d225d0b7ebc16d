package temporalserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
)

var (
	leaseIDKey = temporal.NewSearchAttributeKeyKeyword("SandboxLeaseID")
	phaseKey   = temporal.NewSearchAttributeKeyKeyword("SandboxPhase")
)

func keywords(names ...string) map[string]enumspb.IndexedValueType {
	attrs := map[string]enumspb.IndexedValueType{}
	for _, n := range names {
		attrs[n] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
	}
	return attrs
}

// leaseWorkflow runs one activity, then tags itself with the lease ID.
func leaseWorkflow(ctx workflow.Context, leaseID string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second})
	var out string
	if err := workflow.ExecuteActivity(ctx, echoActivity, "ran in "+leaseID).Get(ctx, &out); err != nil {
		return "", err
	}
	return out, workflow.UpsertTypedSearchAttributes(ctx, leaseIDKey.ValueSet(leaseID))
}

func echoActivity(_ context.Context, s string) (string, error) { return s, nil }

// phaseWorkflow tags itself with the lease ID, waits for a "phase" signal,
// then tags itself with the phase it received.
func phaseWorkflow(ctx workflow.Context, leaseID string) (string, error) {
	if err := workflow.UpsertTypedSearchAttributes(ctx, leaseIDKey.ValueSet(leaseID)); err != nil {
		return "", err
	}
	var phase string
	workflow.GetSignalChannel(ctx, "phase").Receive(ctx, &phase)
	return phase, workflow.UpsertTypedSearchAttributes(ctx, phaseKey.ValueSet(phase))
}

// quietLogger keeps SDK client and worker chatter out of test output.
var quietLogger = sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

func dial(t *testing.T, srv *temporalserver.Server) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: srv.FrontendHostPort(), Namespace: srv.Namespace(), Logger: quietLogger})
	require.NoError(t, err)
	return c
}

func startWorker(t *testing.T, c client.Client, taskQueue string) worker.Worker {
	t.Helper()
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflow(leaseWorkflow)
	w.RegisterWorkflow(phaseWorkflow)
	w.RegisterActivity(echoActivity)
	require.NoError(t, w.Start())
	return w
}

// findRuns polls a visibility list query until it returns want runs:
// visibility is updated asynchronously, after the history event.
func findRuns(t *testing.T, c client.Client, query string, want int) []string {
	t.Helper()
	var runs []string
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		resp, err := c.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		require.NoError(ct, err)
		runs = runs[:0]
		for _, e := range resp.GetExecutions() {
			runs = append(runs, e.GetExecution().GetWorkflowId()+"/"+e.GetExecution().GetRunId())
		}
		require.Len(ct, runs, want)
	}, 15*time.Second, 100*time.Millisecond, "query %s", query)
	return runs
}

func TestInMemoryServerRunsWorkflowsAndServesUI(t *testing.T) {
	ctx := context.Background()
	srv, err := temporalserver.Start(ctx, temporalserver.Options{SearchAttributes: keywords("SandboxLeaseID")})
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Stop()) }()
	require.Equal(t, "default", srv.Namespace())

	c := dial(t, srv)
	defer c.Close()
	w := startWorker(t, c, "tq")
	defer w.Stop()

	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "lease-wf", TaskQueue: "tq"}, leaseWorkflow, "lease-1")
	require.NoError(t, err)
	var out string
	require.NoError(t, run.Get(ctx, &out))
	require.Equal(t, "ran in lease-1", out)

	runs := findRuns(t, c, `SandboxLeaseID = "lease-1"`, 1)
	require.Equal(t, "lease-wf/"+run.GetRunID(), runs[0])
	findRuns(t, c, `SandboxLeaseID = "other-lease"`, 0)

	// The Web UI: its pages are the single-page app's index.html...
	for _, page := range []string{srv.UIURL(), srv.RunURL("lease-wf", run.GetRunID())} {
		body, ctype := get(t, page)
		require.Contains(t, ctype, "text/html", page)
		require.Contains(t, body, "<html", page)
	}
	require.Equal(t, srv.UIURL()+"/namespaces/default/workflows/lease-wf/"+run.GetRunID()+"/history",
		srv.RunURL("lease-wf", run.GetRunID()))
	// ...and its HTTP API reaches this server's frontend.
	body, _ := get(t, srv.UIURL()+"/api/v1/namespaces/default/workflows/lease-wf")
	require.Contains(t, body, run.GetRunID())
}

func get(t *testing.T, url string) (body, contentType string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", url, b)
	return string(b), resp.Header.Get("Content-Type")
}

// TestPersistedServerRestartMidRun is the property the reliability tests rely
// on: with a database file, the server can be stopped while a workflow runs
// and started again on the same file and port, and the workflow carries on.
// The second start also registers a search attribute the first did not know.
func TestPersistedServerRestartMidRun(t *testing.T) {
	ctx := context.Background()
	opts := temporalserver.Options{
		DBFile:           filepath.Join(t.TempDir(), "temporal.db"),
		UIPort:           temporalserver.NoUI,
		SearchAttributes: keywords("SandboxLeaseID"),
	}
	srv, err := temporalserver.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() }) // if the test fails before it stops srv
	require.Empty(t, srv.UIURL())
	require.Empty(t, srv.RunURL("wf", "run"))

	c := dial(t, srv)
	w := startWorker(t, c, "tq")
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "phase-wf", TaskQueue: "tq"}, phaseWorkflow, "lease-2")
	require.NoError(t, err)
	// Its first workflow task has run: the workflow now waits for the signal.
	findRuns(t, c, `SandboxLeaseID = "lease-2" AND ExecutionStatus = "Running"`, 1)
	w.Stop()
	c.Close()
	require.NoError(t, srv.Stop())
	require.NoError(t, srv.Stop(), "Stop is idempotent")

	// Same file, same port, one more search attribute.
	_, port, err := net.SplitHostPort(srv.FrontendHostPort())
	require.NoError(t, err)
	opts.FrontendPort, err = strconv.Atoi(port)
	require.NoError(t, err)
	opts.SearchAttributes = keywords("SandboxLeaseID", "SandboxPhase")
	srv2, err := temporalserver.Start(ctx, opts)
	require.NoError(t, err)
	defer func() { require.NoError(t, srv2.Stop()) }()
	require.Equal(t, srv.FrontendHostPort(), srv2.FrontendHostPort())

	c = dial(t, srv2)
	defer c.Close()
	desc, err := c.DescribeWorkflowExecution(ctx, "phase-wf", "")
	require.NoError(t, err)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, desc.GetWorkflowExecutionInfo().GetStatus())

	w = startWorker(t, c, "tq")
	defer w.Stop()
	require.NoError(t, c.SignalWorkflow(ctx, "phase-wf", "", "phase", "done"))
	var phase string
	require.NoError(t, c.GetWorkflow(ctx, "phase-wf", run.GetRunID()).Get(ctx, &phase))
	require.Equal(t, "done", phase)
	runs := findRuns(t, c, `SandboxPhase = "done" AND SandboxLeaseID = "lease-2"`, 1)
	require.Equal(t, "phase-wf/"+run.GetRunID(), runs[0])
}

func TestStartFailsFastOnTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port

	for name, opts := range map[string]temporalserver.Options{
		"frontend": {FrontendPort: port, UIPort: temporalserver.NoUI},
		"UI":       {UIPort: port},
	} {
		t.Run(name, func(t *testing.T) {
			opts.DBFile = filepath.Join(t.TempDir(), "temporal.db")
			srv, err := temporalserver.Start(context.Background(), opts)
			if err == nil {
				_ = srv.Stop()
			}
			var inUse *temporalserver.PortInUseError
			require.ErrorAs(t, err, &inUse)
			require.Equal(t, port, inUse.Port)
			require.Equal(t, name, inUse.Service)
			require.ErrorContains(t, err, fmt.Sprintf("port %d is in use", port))
			require.NoFileExists(t, opts.DBFile, "nothing is written before the ports are checked")
		})
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	for name, opts := range map[string]temporalserver.Options{
		"IP":                          {IP: "localhost"},
		"UI port":                     {UIPort: -2},
		"frontend port":               {FrontendPort: 70000},
		"reserved search attribute":   {SearchAttributes: keywords("WorkflowId")},
		"untyped search attribute":    {SearchAttributes: map[string]enumspb.IndexedValueType{"X": enumspb.INDEXED_VALUE_TYPE_UNSPECIFIED}},
		"missing DB directory":        {DBFile: filepath.Join(t.TempDir(), "no", "such", "dir", "temporal.db"), UIPort: temporalserver.NoUI},
		"DB file name not a URI path": {DBFile: filepath.Join(t.TempDir(), "what?.db"), UIPort: temporalserver.NoUI},
	} {
		t.Run(name, func(t *testing.T) {
			srv, err := temporalserver.Start(context.Background(), opts)
			if err == nil {
				_ = srv.Stop()
			}
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), "temporalserver: "), err.Error())
			require.False(t, errors.As(err, new(*temporalserver.PortInUseError)))
		})
	}
}

// BenchmarkStart measures Start, up to the moment the namespace is usable,
// and reports Stop's duration alongside.
func BenchmarkStart(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts func(b *testing.B) temporalserver.Options
	}{
		{"memory", func(*testing.B) temporalserver.Options { return temporalserver.Options{UIPort: temporalserver.NoUI} }},
		{"memory+UI", func(*testing.B) temporalserver.Options { return temporalserver.Options{} }},
		{"new DB file", func(b *testing.B) temporalserver.Options {
			return temporalserver.Options{UIPort: temporalserver.NoUI, DBFile: filepath.Join(b.TempDir(), "t.db")}
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var stopping time.Duration
			for b.Loop() {
				srv, err := temporalserver.Start(context.Background(), bc.opts(b))
				require.NoError(b, err)
				b.StopTimer()
				t0 := time.Now()
				require.NoError(b, srv.Stop())
				stopping += time.Since(t0)
				b.StartTimer()
			}
			b.ReportMetric(float64(stopping.Milliseconds())/float64(b.N), "stop-ms/op")
		})
	}
}
