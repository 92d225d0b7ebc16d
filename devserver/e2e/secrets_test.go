package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
)

// A real command uses a secret by reference and the worker uses the
// sandbox API key for every request; neither appears in any event of the
// run's history, stored without a codec, nor anywhere in the whole log of
// the stack at debug level (worker, SDK, sandbox server, Temporal server),
// nor in what the starter prints — while the command provably received the
// secret.
func TestSecretsAndTheAPIKeyNeverReachHistoryOrLogs(t *testing.T) {
	const prefix = "SANDBOXFLOW_E2E_SECRET_"
	secret := "s3cret-" + rand.Text()
	t.Setenv(prefix+"deploy_token", secret)
	s, logs := startOwnStack(t, stack.Options{
		Temporal: temporalserver.Options{UIPort: temporalserver.NoUI, LogLevel: slog.LevelDebug},
		Worker:   workerapp.Config{SecretPrefix: prefix},
	})
	apiKey := s.SandboxAPIKey
	require.NotEmpty(t, apiKey)

	// The command prints a hash and the length of the secret, not the
	// secret: the run shows it received the value without leaking it.
	code, stdout, stderr, workflowID, runID := runStarterOn(t, s, "",
		"--secret-env", "TOKEN=deploy_token", "--", "sh", "-c", `printf %s "$TOKEN" | sha256sum; echo "${#TOKEN}"`)
	require.Equal(t, 0, code, stderr)
	sum := sha256.Sum256([]byte(secret))
	require.Equal(t, fmt.Sprintf("%s  -\n%d\n", hex.EncodeToString(sum[:]), len(secret)), stdout, "the command received the secret")

	// Two failing runs go through the error paths: a secret the worker
	// does not have, and a request the sandbox server rejects.
	codeMissing, _, stderrMissing, missingWF, missingRun := runStarterOn(t, s, "",
		"--secret-env", "TOKEN=not_on_this_worker", "--", "true")
	require.Equal(t, starterapp.ExitRunFailed, codeMissing)
	assert.Contains(t, stderrMissing, "SandboxInvalidInput")
	assert.Contains(t, stderrMissing, "not_on_this_worker", "the error names the secret, not a value")
	codeRejected, _, stderrRejected, rejectedWF, rejectedRun := runStarterOn(t, s, "", "--shape", "s-no-such-shape", "--", "true")
	require.Equal(t, starterapp.ExitRunFailed, codeRejected)
	assert.Contains(t, stderrRejected, "HTTP 400")

	plain := plainClient(t, s)
	var history, historyJSON []byte
	for _, run := range [][2]string{{workflowID, runID}, {missingWF, missingRun}, {rejectedWF, rejectedRun}} {
		wire, js, _ := storedHistory(t, plain, run[0], run[1])
		history, historyJSON = append(history, wire...), append(historyJSON, js...)
	}
	// Not a blind scan: the plain history holds what it may hold — the
	// secret's name and the command's output, the hash.
	require.True(t, bytes.Contains(history, []byte("deploy_token")), "the secret's name travels in history")
	require.True(t, bytes.Contains(history, []byte(hex.EncodeToString(sum[:]))), "the output is in the plain history")

	// The whole log, including the stack's shutdown.
	require.NoError(t, s.Stop())
	log := logs.String()
	require.Contains(t, log, "level=DEBUG", "the log was captured at debug level")
	require.Contains(t, log, "process started", "the sandbox server's log is in it")
	require.Contains(t, log, "ActivityType=sandboxflow.Execute", "and the worker's")
	require.Contains(t, log, "not_on_this_worker", "with the error of the missing secret")

	for name, value := range map[string]string{"the secret": secret, "the sandbox API key": apiKey} {
		for _, form := range []string{value, base64.StdEncoding.EncodeToString([]byte(value))} {
			assert.False(t, bytes.Contains(history, []byte(form)), "%s is in the stored history", name)
			assert.False(t, bytes.Contains(historyJSON, []byte(form)), "%s is in the stored history (JSON)", name)
			assert.False(t, strings.Contains(log, form), "%s is in the log", name)
			for _, out := range []string{stdout, stderr, stderrMissing, stderrRejected} {
				assert.False(t, strings.Contains(out, form), "%s is in what the starter printed", name)
			}
		}
	}
	t.Logf("scanned %d bytes of history and %d bytes of log", len(history)+len(historyJSON), len(log))
}
