package createos

import (
	"context"
	"path"
	"sort"
	"strconv"
	"strings"
)

// The process the server starts for a command is `/bin/sh -c SCRIPT`, or
// `/bin/sh FILE` for a script too long to go inline (see processArgs).
// SCRIPT waits at a start gate, so that the command runs only once its
// output stream is attached and none of its output can be missed, then
// enters the working directory, sets the variables and execs the command:
//
//	IFS= read -r gate && [ "$gate" = 'TOKEN' ] || { echo '…' >&2; exit 125; }
//	cd -- '/workspace/src' || exit 1
//	export NAME='value'
//	exec 'program' 'arg 1' 'it'\''s' < '/workspace/.sandboxflow/TOKEN.stdin'
//
// The gate is the process's own stdin, a pipe that the server holds open:
// the shell blocks reading it, without polling, until the client writes
// the run's token and a newline to it (POST …/input) once the stream is
// attached. A process whose stdin ends without the token never runs the
// command: an orphan whose creation was never confirmed waits there until
// its lease is destroyed. The token is random, so a line written to
// another process's stdin cannot open this one.
//
// Every word that comes from the caller is single-quoted, so the shell
// expands nothing in it: quotes, spaces, $, backticks and newlines arrive
// as they are. Variables are exported by the shell rather than passed
// through env(1), whose arguments would make a program name containing
// '=' ambiguous. The API's own env field is never used: the hosted service
// rejects variables not declared when the sandbox was created.
//
// The shell is plain sh, not a login shell: a login shell's profile costs
// more than the command `true` itself (about 17 ms against 2 ms on the
// local server), and every image has /bin/sh, not every one bash. A
// command that needs a login environment (a PATH set by a profile, say)
// asks for it: `bash -lc '…'`.
const shell = "/bin/sh"

// scriptSpec is what a command's script needs. Paths are absolute.
type scriptSpec struct {
	token string // the line that opens the gate
	dir   string
	env   map[string]string // names are valid (Command.Validate)
	argv  []string
	stdin string // the staged stdin file, or "" for none (/dev/null)
}

// gateClosedStatus is the exit status of a script whose stdin ended
// without its token: the command did not run.
const gateClosedStatus = 125

func (s scriptSpec) build() string {
	var b strings.Builder
	b.WriteString("IFS= read -r gate && [ \"$gate\" = " + shellQuote(s.token) + " ] || " +
		"{ echo 'sandboxflow: the start gate closed without opening; the command did not run' >&2; exit " +
		strconv.Itoa(gateClosedStatus) + "; }\n")
	b.WriteString("cd -- " + shellQuote(s.dir) + " || exit 1\n")
	names := make([]string, 0, len(s.env))
	for name := range s.env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.WriteString("export " + name + "=" + shellQuote(s.env[name]) + "\n")
	}
	// The shells disagree on `exec --` (dash runs a program named "--") and
	// on `exec -name` (bash takes it for options): a program whose name
	// begins with '-' runs as a child of the shell instead, which exits
	// with its status.
	if !strings.HasPrefix(s.argv[0], "-") {
		b.WriteString("exec ")
	}
	for i, arg := range s.argv {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(shellQuote(arg))
	}
	stdin := "/dev/null"
	if s.stdin != "" {
		stdin = s.stdin
	}
	b.WriteString(" < " + shellQuote(stdin) + "\n")
	return b.String()
}

// maxInlineScript is the longest script passed inline, as the argument
// of `sh -c`. Linux refuses any one execve argument over 128 KiB
// (sandbox.MaxArgBytes), so a command whose words or variables add up to
// more could not start inline; and the create request of a managed process
// is a JSON body for which the hosted service documents no limit
// (docs/CREATEOS-API.md §3.12), unlike its file uploads' raw bodies
// (§3.5), which the SDKs use for large transfers. A longer script is
// uploaded as a file in the staging directory, like stdin, and the
// process is `sh FILE`: then only the kernel's limit on argv and
// environment together (sandbox.MaxArgvEnvBytes) applies, when the script
// execs the command. The common short command costs no upload.
const maxInlineScript = 64 << 10

// processArgs are the arguments of the shell that runs the script with
// this token: `-c SCRIPT`, or, for a script longer than maxInlineScript,
// the path of the script uploaded as a file (which the run's cleanup
// removes). The start gate is the same either way: the shell reads its
// script from the file and the gate from its stdin.
func (r *run) processArgs(ctx context.Context, script string) ([]string, error) {
	if len(script) <= maxInlineScript {
		return []string{"-c", script}, nil
	}
	file := scriptPath(r.workspace, r.token)
	r.staged = true
	if err := r.c.putFile(ctx, r.leaseID, file, []byte(script)); err != nil {
		return nil, err
	}
	return []string{file}, nil
}

// gateLine is what opens the gate of the script with this token.
func gateLine(token string) []byte { return []byte(token + "\n") }

// shellQuote makes s one shell word that the shell takes literally. Inside
// single quotes nothing is special but the single quote itself, which is
// written by ending the quotes, adding an escaped quote and reopening them:
//
//	it's  →  'it'\''s'
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// stagingDir is where a lease's per-command files live: staged stdin and
// long scripts (and
// the start-gate files of earlier versions, see legacyGatePath).
func stagingDir(workspace string) string { return path.Join(workspace, ".sandboxflow") }

// stdinPath names the staged stdin of the command with this token.
func stdinPath(workspace, token string) string {
	return path.Join(stagingDir(workspace), token+".stdin")
}

// refusedPath is the evidence that the process of the command with this
// token was killed behind its start gate because Observer.Started refused
// it: an Attach that finds the process gone lets its caller run the
// command again only when this file exists (sandbox.ErrNeverStarted). It
// outlives the run's cleanup for that reason, and stays (an empty file)
// until the lease is destroyed: until the command's next process is
// recorded, every retry must find it.
func refusedPath(workspace, token string) string {
	return path.Join(stagingDir(workspace), token+".refused")
}

// scriptPath names the uploaded script of the command with this token.
func scriptPath(workspace, token string) string {
	return path.Join(stagingDir(workspace), token+".sh")
}

// legacyGatePath is the start-gate file that the scripts of earlier
// versions of this client (`/bin/bash -lc`) polled for. Attach writes it
// too, so that a process started by an earlier version and left behind its
// gate — its worker died before opening it, and a new one took over — is
// not stuck there.
func legacyGatePath(workspace, token string) string {
	return path.Join(stagingDir(workspace), token+".gate")
}

// workingDir resolves a command's cwd: relative to the workspace, which is
// also where an empty cwd leads.
func workingDir(workspace, cwd string) string {
	if path.IsAbs(cwd) {
		return path.Clean(cwd)
	}
	return path.Join(workspace, cwd)
}
