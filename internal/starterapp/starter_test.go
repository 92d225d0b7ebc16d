package starterapp

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

func TestParseArgsBuildsTheRequest(t *testing.T) {
	stdinFile := filepath.Join(t.TempDir(), "in")
	require.NoError(t, os.WriteFile(stdinFile, []byte("input"), 0o600))
	o, err := parseArgs([]string{
		"--cwd", "src", "--env", "A=1", "--env", "B=x=y", "--secret-env", "TOKEN=deploy",
		"--stdin", stdinFile, "--timeout", "90s", "--shape", "s-1vcpu-1gb", "--rootfs", "devbox:1",
		"--workflow-id", "wf-1", "--task-queue", "q", "--keep-lease", "--json", "--wait-release",
		"--", "make", "-j2", "--", "test",
	}, nil)
	require.NoError(t, err)
	assert.Equal(t, sandbox.Command{
		Argv: []string{"make", "-j2", "--", "test"}, Cwd: "src",
		Env: map[string]string{"A": "1", "B": "x=y"}, Stdin: []byte("input"), Timeout: 90 * time.Second,
	}, o.request.Command)
	assert.Equal(t, map[string]string{"TOKEN": "deploy"}, o.request.SecretEnv)
	assert.Equal(t, "s-1vcpu-1gb", o.request.Lease.Shape)
	assert.Equal(t, "devbox:1", o.request.Lease.Rootfs)
	assert.True(t, o.request.KeepLease)
	assert.Equal(t, "wf-1", o.workflowID)
	assert.Equal(t, "q", o.taskQueue)
	assert.True(t, o.json)
	assert.True(t, o.waitRelease)
}

func TestParseArgsReadsStdinFromDash(t *testing.T) {
	o, err := parseArgs([]string{"--stdin", "-", "--", "cat"}, strings.NewReader("piped"))
	require.NoError(t, err)
	assert.Equal(t, []byte("piped"), o.request.Command.Stdin)
	assert.Equal(t, workflows.DefaultTaskQueue, o.taskQueue)
	assert.True(t, strings.HasPrefix(o.workflowID, "sandboxflow-"))
}

func TestUsageErrorsAreOneClearLine(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"missing dashes": {[]string{"echo", "hi"}, "missing `--` before the command"},
		"no command":     {[]string{"--json", "--"}, "no command after `--`"},
		"unknown flag":   {[]string{"--frobnicate", "--", "true"}, "flag provided but not defined: -frobnicate"},
		"bad env":        {[]string{"--env", "NOEQUALS", "--", "true"}, "--env takes K=V"},
		"bad env name":   {[]string{"--env", "BAD;KEY=1", "--", "true"}, `"BAD;KEY" is not a valid variable name`},
		"stray argument": {[]string{"oops", "--", "true"}, `unexpected argument "oops"`},
	} {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := Main(context.Background(), tc.args, IO{Stderr: &stderr}, client.Options{HostPort: "127.0.0.1:1"}, nil)
			assert.Equal(t, ExitUsage, code)
			assert.Contains(t, stderr.String(), tc.want)
			assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one line: %q", stderr.String())
		})
	}
}

func TestSecretLikeEnvValuesAreNotEchoed(t *testing.T) {
	var stderr bytes.Buffer
	Main(context.Background(), []string{"--env", "hunter2", "--", "true"}, IO{Stderr: &stderr}, client.Options{}, nil)
	assert.NotContains(t, stderr.String(), "hunter2")
}

func TestTemporalUnreachableIsOneClearLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now

	var stderr bytes.Buffer
	code := Main(context.Background(), []string{"--", "true"}, IO{Stderr: &stderr}, client.Options{HostPort: addr}, nil)
	assert.Equal(t, ExitRunFailed, code)
	assert.Contains(t, stderr.String(), "cannot reach Temporal at "+addr)
	assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one line: %q", stderr.String())
}

func TestParseArgsBuildsASession(t *testing.T) {
	script := filepath.Join(t.TempDir(), "steps")
	require.NoError(t, os.WriteFile(script, []byte("# build, then test\nmake build\n\n  make test  \n"), 0o600))
	o, err := parseArgs([]string{"--env", "A=1", "--stdin", "-", "--then", "ls -l", "--script", script, "--", "git", "clone", "x"}, strings.NewReader("in"))
	require.NoError(t, err)
	require.True(t, o.session())
	cmds := o.commands()
	require.Len(t, cmds, 4)
	assert.Equal(t, []string{"git", "clone", "x"}, cmds[0].Argv)
	assert.Equal(t, []byte("in"), cmds[0].Stdin, "the first command gets stdin")
	for i, line := range []string{"ls -l", "make build", "make test"} {
		assert.Equal(t, []string{"sh", "-c", line}, cmds[i+1].Argv)
		assert.Nil(t, cmds[i+1].Stdin, "only the first command gets stdin")
		assert.Equal(t, map[string]string{"A": "1"}, cmds[i+1].Env, "every command gets the environment")
	}

	o, err = parseArgs([]string{"--script", script}, nil)
	require.NoError(t, err, "a script needs no first command")
	assert.Len(t, o.commands(), 2)
}

func TestSessionUsageErrors(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, []byte("# nothing\n\n"), 0o600))
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"empty script":      {[]string{"--script", empty}, "holds no command"},
		"missing script":    {[]string{"--script", filepath.Join(t.TempDir(), "none")}, "--script: open"},
		"detached session":  {[]string{"--detach", "--then", "true", "--", "true"}, "a session (--then, --script) ends with its lease"},
		"NUL in a then":     {[]string{"--then", "echo a\x00b", "--", "true"}, "contains a NUL byte"},
		"no command at all": {[]string{"--json"}, "missing `--` before the command"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseArgs(tc.args, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// endless is a reader of n bytes that never holds them: it counts what
// was read.
type endless struct{ n, read int64 }

func (e *endless) Read(p []byte) (int, error) {
	if e.read >= e.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), e.n-e.read)
	e.read += k
	return int(k), nil
}

// Stdin larger than sandbox.MaxStdinBytes is refused as SandboxInvalidInput
// before anything starts, and without being read whole: a file by its
// size, a pipe after the limit. (Reading it all first held 100 MB in
// memory before Temporal refused it.)
func TestParseArgsRefusesLargeStdinWithoutReadingIt(t *testing.T) {
	file := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(file)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(100<<20)) // sparse: 100 MB that cost no disk
	require.NoError(t, f.Close())

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = parseArgs([]string{"--stdin", file, "--", "cat"}, nil)
	runtime.ReadMemStats(&after)
	var invalid *sandbox.InvalidInputError
	require.ErrorAs(t, err, &invalid)
	assert.Equal(t, "stdin", invalid.Field)
	assert.Contains(t, err.Error(), "104857600 bytes, more than its limit of 524288 bytes")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "the file was not read")

	pipe := &endless{n: 10 << 20}
	_, err = parseArgs([]string{"--stdin", "-", "--", "cat"}, pipe)
	require.ErrorAs(t, err, &invalid)
	assert.Equal(t, "stdin", invalid.Field)
	assert.Equal(t, int64(sandbox.MaxStdinBytes+1), pipe.read, "read up to the limit and a byte")

	o, err := parseArgs([]string{"--stdin", "-", "--", "cat"}, &endless{n: sandbox.MaxStdinBytes})
	require.NoError(t, err)
	assert.Len(t, o.request.Command.Stdin, sandbox.MaxStdinBytes, "the limit itself passes")
}

// --dockerfile puts the file in the request, which refuses it with
// --rootfs before anything starts; a session's request takes it too.
func TestParseArgsReadsTheDockerfile(t *testing.T) {
	dockerfile := filepath.Join(t.TempDir(), "Dockerfile")
	require.NoError(t, os.WriteFile(dockerfile, []byte("FROM devbox:1\nRUN echo baked > /opt/baked\n"), 0o600))
	o, err := parseArgs([]string{"--dockerfile", dockerfile, "--", "cat", "/opt/baked"}, nil)
	require.NoError(t, err)
	assert.Equal(t, "FROM devbox:1\nRUN echo baked > /opt/baked\n", o.request.Dockerfile)

	_, err = parseArgs([]string{"--dockerfile", dockerfile, "--rootfs", "devbox:1", "--", "true"}, nil)
	assert.True(t, sandbox.IsInvalidInputError(err), "%v", err)
	o, err = parseArgs([]string{"--dockerfile", dockerfile, "--then", "true", "--", "true"}, nil)
	require.NoError(t, err)
	assert.Equal(t, "FROM devbox:1\nRUN echo baked > /opt/baked\n", o.sessionRequest().Dockerfile)
	require.NoError(t, o.sessionRequest().Validate())

	big := filepath.Join(t.TempDir(), "Big")
	require.NoError(t, os.WriteFile(big, make([]byte, sandbox.MaxDockerfileBytes+1), 0o600))
	_, err = parseArgs([]string{"--dockerfile", big, "--", "true"}, nil)
	assert.ErrorContains(t, err, "over 65536 bytes")
}
