package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// typescriptExamples is the TypeScript project whose programs
// docs/POLYGLOT.md links: its package.json pins the @temporalio packages,
// its package-lock.json everything they pull in.
const typescriptExamples = "testdata/typescript"

// The TypeScript examples run against the dev stack with the real
// @temporalio packages from npm: RunCommand from a TypeScript client, a
// TypeScript workflow on a TypeScript worker that runs RunCommand as a
// child, a session's execute and close Updates, and a typed failure with
// its details. Each leaks nothing, and every answer they got, as it came
// over the wire, fits its message of docs/schema/sandboxflow.schema.json.
func TestTypeScriptExamples(t *testing.T) {
	node := testenv.RequireCommand(t, "node")
	dir := buildTypeScriptExamples(t, node)
	var checks []schemaCheck
	// run runs a program and decodes what it printed into out; messages
	// name the schema's message of each field of it to check.
	run := func(t *testing.T, program string, out any, messages map[string]string) {
		t.Helper()
		t.Cleanup(func() { assertNothingLeaked(t) })
		stdout := runNode(t, node, dir, program, nil,
			"TEMPORAL_ADDRESS="+stackOf(t).Temporal.FrontendHostPort(),
			"TEMPORAL_NAMESPACE="+stackOf(t).Temporal.Namespace())
		require.NoError(t, json.Unmarshal(stdout, out), "%s wrote %q", program, stdout)
		var fields map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(stdout, &fields))
		for field, message := range messages {
			require.Contains(t, fields, field, program)
			checks = append(checks, schemaCheck{Message: message, Value: fields[field], Source: program + "." + field})
		}
	}

	t.Run("RunCommand", func(t *testing.T) {
		var got struct{ Early, Final workflows.Result }
		run(t, "runcommand", &got, map[string]string{"early": "RunCommandResult", "final": "RunCommandResult"})
		assert.Equal(t, "hello from typescript\n", got.Early.Stdout, "the result Update")
		assert.Equal(t, got.Early.Stdout, got.Final.Stdout)
		assert.Zero(t, got.Final.ExitCode)
		assert.Equal(t, []string{got.Final.LeaseID}, got.Final.DestroyedLeases)
	})
	t.Run("ChildWorkflow", func(t *testing.T) {
		var got struct{ Result workflows.Result }
		run(t, "child", &got, map[string]string{"result": "RunCommandResult"})
		assert.Equal(t, "built by a child\n", got.Result.Stdout)
		assert.NotEmpty(t, got.Result.LeaseID)
	})
	t.Run("Session", func(t *testing.T) {
		var got struct {
			First, Second workflows.SessionResult
			State         workflows.SessionState
			Summary       workflows.SessionSummary
		}
		run(t, "session", &got, map[string]string{
			"first": "SessionExecuteResult", "second": "SessionExecuteResult", "state": "SessionState", "summary": "SessionCloseResult"})
		assert.Equal(t, "kept\n", got.Second.Stdout, "the second command saw the first one's file")
		assert.Equal(t, []int{1, 2}, []int{got.First.Seq, got.Second.Seq})
		assert.Equal(t, got.First.LeaseID, got.Second.LeaseID, "one lease")
		assert.Equal(t, 2, got.State.Commands)
		assert.Equal(t, 2, got.Summary.Commands)
		assert.Equal(t, []string{got.First.LeaseID}, got.Summary.DestroyedLeases)
	})
	t.Run("TypedFailure", func(t *testing.T) {
		var got struct {
			Type         string
			NonRetryable bool
			Details      sandbox.FailureDetails
		}
		run(t, "failure", &got, map[string]string{"details": "FailureDetails"})
		assert.Equal(t, sandbox.TypeInvalidInput, got.Type)
		assert.True(t, got.NonRetryable)
		assert.Equal(t, sandbox.FailureDetails{Kind: sandbox.TypeInvalidInput, Field: "command.timeout", Reason: got.Details.Reason}, got.Details)
		assert.NotEmpty(t, got.Details.Reason)
	})
	t.Run("AnswersFitTheSchema", func(t *testing.T) {
		require.Equal(t, 8, len(checks), "every answer above")
		// The check can fail: a result whose exit code is a string does not fit.
		checks = append(checks, schemaCheck{Message: "RunCommandResult", Value: json.RawMessage(`{"exitCode":"0","leaseId":"sb","freshLeases":0}`), Source: "control"})
		in, err := json.Marshal(checks)
		require.NoError(t, err)
		schema, err := filepath.Abs("../../docs/schema/sandboxflow.schema.json")
		require.NoError(t, err)
		lines := bytes.Split(bytes.TrimSpace(runNode(t, node, dir, "check-schema", in, "SANDBOXFLOW_SCHEMA="+schema)), []byte("\n"))
		require.Len(t, lines, len(checks))
		for i, line := range lines {
			var r struct {
				OK     bool
				Errors string
			}
			require.NoError(t, json.Unmarshal(line, &r))
			want := checks[i].Source != "control"
			assert.Equal(t, want, r.OK, "%s against %s: %s", checks[i].Source, checks[i].Message, r.Errors)
		}
	})
}

// A TypeScript client that holds no key runs a command on an encrypting
// stack through the stack's codec server as its remote codec
// (src/remote-codec.ts): the command runs, its result comes back decoded,
// and the Temporal server holds the input as ciphertext. Without the codec
// the worker refuses the input (TestEncryptingWorkerRefusesPlaintextInput).
func TestTypeScriptRemoteCodec(t *testing.T) {
	node := testenv.RequireCommand(t, "node")
	dir := buildTypeScriptExamples(t, node)
	keys, err := codec.GenerateKeys("ts-1")
	require.NoError(t, err)
	s, _ := startOwnStack(t, stack.Options{Temporal: temporalserver.Options{UIPort: temporalserver.NoUI}, Codec: keys})
	require.NotEmpty(t, s.CodecURL)
	stdout := runNode(t, node, dir, "remote-codec", nil,
		"TEMPORAL_ADDRESS="+s.Temporal.FrontendHostPort(),
		"TEMPORAL_NAMESPACE="+s.Temporal.Namespace(),
		"SANDBOXFLOW_CODEC_URL="+s.CodecURL)
	var got struct {
		Result         workflows.Result
		StoredEncoding string
	}
	require.NoError(t, json.Unmarshal(stdout, &got), "remote-codec wrote %q", stdout)
	assert.Equal(t, "encrypted from typescript\n", got.Result.Stdout)
	assert.Zero(t, got.Result.ExitCode)
	assert.Equal(t, "binary/encrypted", got.StoredEncoding, "the history holds the input as ciphertext")
}

// schemaCheck is a value that must fit a message of the schema
// (check-schema.ts).
type schemaCheck struct {
	Message string          `json:"message"`
	Value   json.RawMessage `json:"value"`
	Source  string          `json:"-"`
}

// runNode runs dist/program.js of the examples in dir with stdin and env
// added to the test's, and returns what it printed.
func runNode(t *testing.T, node, dir, program string, stdin []byte, env ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("dist", program+".js"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "%s: %s", program, stderr.String())
	return stdout
}

// buildTypeScriptExamples installs the examples' packages, compiles the
// examples with the pinned TypeScript, and returns the directory to run
// them in (dist/*.js).
func buildTypeScriptExamples(t *testing.T, node string) string {
	t.Helper()
	modules := installTypeScriptPackages(t)
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(filepath.Join(dir, "src"), os.DirFS(filepath.Join(typescriptExamples, "src"))))
	tsconfig, err := os.ReadFile(filepath.Join(typescriptExamples, "tsconfig.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tsconfig.json"), tsconfig, 0o644))
	require.NoError(t, os.Symlink(modules, filepath.Join(dir, "node_modules")))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tsc := exec.CommandContext(ctx, node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", ".")
	tsc.Dir = dir
	out, err := tsc.CombinedOutput()
	require.NoError(t, err, "tsc: %s", out)
	return dir
}

// installTypeScriptPackages installs the examples' locked packages once per
// lockfile, into the user's cache (npm's own cache makes a reinstall
// offline), and returns their node_modules. A lock on the directory keeps
// two test processes from installing into it at once. Without npm, or
// without the registry, the test skips (fails under CI=true).
func installTypeScriptPackages(t *testing.T) string {
	t.Helper()
	npm := testenv.RequireCommand(t, "npm")
	lock, err := os.ReadFile(filepath.Join(typescriptExamples, "package-lock.json"))
	require.NoError(t, err)
	sum := sha256.Sum256(lock)
	cache, err := os.UserCacheDir()
	require.NoError(t, err)
	dir := filepath.Join(cache, "sandboxflow", "typescript-"+hex.EncodeToString(sum[:8]))
	require.NoError(t, os.MkdirAll(dir, 0o755))

	f, err := os.Open(dir)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX))
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)

	done := filepath.Join(dir, "installed")
	if _, err := os.Stat(done); err == nil {
		return filepath.Join(dir, "node_modules")
	}
	for _, name := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(typescriptExamples, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Missing(t, "npm could not install the TypeScript examples' packages (is the npm registry reachable?): "+string(out))
	}
	require.NoError(t, os.WriteFile(done, nil, 0o644))
	return filepath.Join(dir, "node_modules")
}
