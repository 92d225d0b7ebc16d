package sandboxtest

import (
	"log/slog"
	"os"

	sdklog "go.temporal.io/sdk/log"
	sdktestsuite "go.temporal.io/sdk/testsuite"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// NewWorkflowEnvironment returns a test workflow environment of the
// Temporal SDK with RunCommand and its activities over provider
// registered, logging warnings and errors only (to stderr): unit tests of
// workflows that run commands, with a fake, mocked or real provider. To
// configure the environment yourself, call workflows.RegisterWorkflows and
// register activities.Activities with TestEnvironmentHeartbeats.
func NewWorkflowEnvironment(provider sandbox.Provider) *sdktestsuite.TestWorkflowEnvironment {
	var suite sdktestsuite.WorkflowTestSuite
	suite.SetLogger(sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	env := suite.NewTestWorkflowEnvironment()
	workflows.RegisterWorkflows(env)
	// No Temporal server to record a process on: heartbeats stay in memory.
	(&activities.Activities{Provider: provider, Heartbeats: activities.TestEnvironmentHeartbeats{}}).Register(env)
	return env
}
