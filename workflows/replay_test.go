package workflows

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// TestReplayRecordedHistories replays histories of real runs (recorded by
// devserver/cmd/histories) through the current workflow code. A change
// that would break running workflows — a different sequence of commands
// without workflow.GetVersion — fails here.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob("testdata/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files, "no recorded histories")
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			replayer := worker.NewWorkflowReplayer()
			replayer.RegisterWorkflowWithOptions(RunCommand, workflow.RegisterOptions{Name: WorkflowName})
			replayer.RegisterWorkflowWithOptions(SessionWorkflow, workflow.RegisterOptions{Name: SessionWorkflowName})
			logger := sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))
			f, err := os.Open(file)
			require.NoError(t, err)
			defer f.Close()
			history, err := client.HistoryFromJSON(f, client.HistoryJSONOptions{})
			require.NoError(t, err)
			// The id the recorder gave the run (devserver/cmd/histories):
			// a fork's child id derives from it.
			id := "history-" + strings.TrimSuffix(filepath.Base(file), ".json")
			require.NoError(t, replayer.ReplayWorkflowHistoryWithOptions(logger, history,
				worker.ReplayWorkflowHistoryOptions{OriginalExecution: workflow.Execution{ID: id}}))
		})
	}
}
