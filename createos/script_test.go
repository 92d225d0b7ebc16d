package createos

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runScript runs a command's script as the server would, with the real
// /bin/sh, in a temporary workspace, and opens its gate once it runs.
func runScript(t *testing.T, workspace string, spec scriptSpec) (stdout string, exitCode int) {
	t.Helper()
	return runGated(t, workspace, spec, func(stdin io.WriteCloser) {
		_, err := stdin.Write(gateLine("TOKEN")) // the client opens the gate
		require.NoError(t, err)
	})
}

// runGated runs the script with a pipe for its stdin, which gate writes
// to; the pipe stays open until the script exits, as the server's does.
func runGated(t *testing.T, workspace string, spec scriptSpec, gate func(stdin io.WriteCloser)) (stdout string, exitCode int) {
	t.Helper()
	testenv.RequireFile(t, shell)
	spec.token = "TOKEN"
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-c", spec.build())
	cmd.Dir = workspace
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	gate(stdin)
	err = cmd.Wait()
	stdin.Close()
	var exit *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &exit, out.String())
		exitCode = exit.ExitCode()
	}
	return out.String(), exitCode
}

func TestScriptQuotingWithRealShell(t *testing.T) {
	workspace := filepath.Join(t.TempDir(), "work space")
	require.NoError(t, os.MkdirAll(filepath.Join(workspace, "sub dir"), 0o755))
	stdinFile := stdinPath(workspace, "TOKEN")
	require.NoError(t, os.MkdirAll(filepath.Dir(stdinFile), 0o755))
	require.NoError(t, os.WriteFile(stdinFile, []byte("from stdin\n"), 0o644))
	args := []string{
		`it's`, `a b`, `$HOME`, "`id`", "line1\nline2", `\`, `"q"`, `*`, `-n`, ``,
		`;exit 9`, `$(exit 9)`, `'`, `''`, "tab\there", `!event`, `~`, `a=b`, "é ✓",
	}
	value := "$(echo pwned)'x\"y`z`\nnext"
	report := `printf '[%s]\n' "$@"; printf 'pwd=%s\n' "$PWD"; printf 'V1=[%s]\n' "$V1"; cat`

	out, code := runScript(t, workspace, scriptSpec{
		dir:   workingDir(workspace, "sub dir"),
		env:   map[string]string{"V1": value, "_EMPTY": ""},
		argv:  append([]string{"/bin/sh", "-c", report, "argv0"}, args...),
		stdin: stdinFile,
	})

	var want strings.Builder
	for _, a := range args {
		want.WriteString("[" + a + "]\n")
	}
	want.WriteString("pwd=" + filepath.Join(workspace, "sub dir") + "\n")
	want.WriteString("V1=[" + value + "]\n")
	want.WriteString("from stdin\n")
	assert.Equal(t, 0, code)
	assert.Equal(t, want.String(), out)
}

func TestScriptProgramNames(t *testing.T) {
	workspace := t.TempDir()
	for _, name := range []string{"x=y", "-dash", "it's"} {
		prog := filepath.Join(workspace, name)
		require.NoError(t, os.WriteFile(prog, []byte("#!/bin/sh\necho ran \"$@\"; exit 4\n"), 0o755))

		out, code := runScript(t, workspace, scriptSpec{dir: workspace, argv: []string{"./" + name, "arg"}})
		assert.Equal(t, "ran arg\n", out, name)
		assert.Equal(t, 4, code, name)
	}
	// A bare name that begins with '-', found on PATH: no shell's exec
	// takes it (see build).
	out, code := runScript(t, workspace, scriptSpec{dir: workspace, env: map[string]string{"PATH": workspace + ":/usr/bin:/bin"},
		argv: []string{"-dash", "arg"}})
	assert.Equal(t, "ran arg\n", out)
	assert.Equal(t, 4, code)
	if _, err := os.Stat("/bin/echo"); err == nil { // env(1) would take this for an assignment
		out, code := runScript(t, workspace, scriptSpec{dir: workspace, env: map[string]string{"A": "1"}, argv: []string{"/bin/echo", "B=2"}})
		assert.Equal(t, "B=2\n", out)
		assert.Zero(t, code)
	}
}

func TestScriptFailures(t *testing.T) {
	workspace := t.TempDir()

	out, code := runScript(t, workspace, scriptSpec{dir: filepath.Join(workspace, "missing"), argv: []string{"true"}})
	assert.Equal(t, 1, code, "a missing cwd fails")
	assert.Contains(t, out, "missing")

	_, code = runScript(t, workspace, scriptSpec{dir: workspace, argv: []string{"no-such-program-here"}})
	assert.Equal(t, 127, code)

	out, code = runScript(t, workspace, scriptSpec{dir: workspace, argv: []string{"cat"}})
	assert.Zero(t, code)
	assert.Empty(t, out, "without stdin the command reads /dev/null")
}

// The command runs only after the token's line: a stdin that ends
// without it, or brings another line, ends the script before the
// command, with gateClosedStatus.
func TestScriptGate(t *testing.T) {
	workspace := t.TempDir()
	spec := scriptSpec{dir: workspace, argv: []string{"touch", "ran"}}
	for name, gate := range map[string]func(io.WriteCloser){
		"stdin ends":   func(stdin io.WriteCloser) { stdin.Close() },
		"another line": func(stdin io.WriteCloser) { io.WriteString(stdin, "TOKEN2\n") },
		"no newline":   func(stdin io.WriteCloser) { io.WriteString(stdin, "TOKEN"); stdin.Close() },
		"a prefix":     func(stdin io.WriteCloser) { io.WriteString(stdin, "TOK\nTOKEN\n") },
	} {
		out, code := runGated(t, workspace, spec, gate)
		assert.Equal(t, gateClosedStatus, code, name)
		assert.Contains(t, out, "the command did not run", name)
		assert.NoFileExists(t, filepath.Join(workspace, "ran"), name)
	}

	// The token twice (a repeated gate write) runs the command once, which
	// reads /dev/null, not the second line.
	spec.argv = []string{"cat"}
	out, code := runGated(t, workspace, spec, func(stdin io.WriteCloser) {
		io.WriteString(stdin, "TOKEN\nTOKEN\n")
	})
	assert.Zero(t, code)
	assert.Empty(t, out)
}

func TestShellQuote(t *testing.T) {
	assert.Equal(t, `''`, shellQuote(""))
	assert.Equal(t, `'a b'`, shellQuote("a b"))
	assert.Equal(t, `'it'\''s'`, shellQuote("it's"))
	assert.Equal(t, `'$x'`, shellQuote("$x"))
}

func TestWorkingDir(t *testing.T) {
	assert.Equal(t, "/workspace", workingDir("/workspace", ""))
	assert.Equal(t, "/workspace/src", workingDir("/workspace", "src"))
	assert.Equal(t, "/workspace/src", workingDir("/workspace", "./src/"))
	assert.Equal(t, "/tmp", workingDir("/workspace", "/tmp/"))
}

// A command whose words add up to more than one execve argument may hold
// (128 KiB) cannot start as `sh -c SCRIPT`; run from a file, the script
// hands the kernel only the command's own argv, which may be up to
// sandbox.MaxArgvEnvBytes. Both with the real /bin/sh and the gate.
func TestLongScriptRunsFromAFileWithRealShell(t *testing.T) {
	if _, err := os.Stat(shell); err != nil {
		t.Skip("no " + shell)
	}
	workspace := t.TempDir()
	argv := []string{"/bin/sh", "-c", `printf %s "$@" | wc -c`, "sh"}
	for i := 0; i < 8; i++ {
		argv = append(argv, strings.Repeat(string(rune('a'+i)), 100_000))
	}
	script := scriptSpec{token: "TOKEN", dir: workspace, argv: argv}.build()
	require.Greater(t, len(script), maxInlineScript)

	inline := exec.CommandContext(t.Context(), shell, "-c", script)
	require.ErrorContains(t, inline.Start(), "argument list too long", "the fault this avoids")

	file := filepath.Join(workspace, "TOKEN.sh")
	require.NoError(t, os.WriteFile(file, []byte(script), 0o600))
	cmd := exec.CommandContext(t.Context(), shell, file)
	cmd.Dir = workspace
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Stdin = strings.NewReader(string(gateLine("TOKEN")))
	require.NoError(t, cmd.Run(), out.String())
	assert.Equal(t, "800000", strings.TrimSpace(out.String()))
}
