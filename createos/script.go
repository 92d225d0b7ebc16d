package createos

import (
	"path"
	"sort"
	"strings"
)

// The process the server starts for a command is `/bin/bash -lc SCRIPT`.
// SCRIPT waits for a start-gate file, so that the command runs only once
// its output stream is attached and none of its output can be missed, then
// enters the working directory, sets the variables and execs the command:
//
//	gate='/workspace/.sandboxflow/TOKEN.gate'
//	while [ ! -e "$gate" ]; do sleep 0.02; done
//	rm -f -- "$gate"
//	cd -- '/workspace/src' || exit 1
//	export NAME='value'
//	exec -- 'program' 'arg 1' 'it'\''s' < '/workspace/.sandboxflow/TOKEN.stdin'
//
// Every word that comes from the caller is single-quoted, so the shell
// expands nothing in it: quotes, spaces, $, backticks and newlines arrive
// as they are. Variables are exported by the shell rather than passed
// through env(1), whose arguments would make a program name containing
// '=' ambiguous. The API's own env field is never used: the hosted service
// rejects variables not declared when the sandbox was created.
const shell = "/bin/bash"

// scriptSpec is what a command's script needs. Paths are absolute.
type scriptSpec struct {
	gate  string
	dir   string
	env   map[string]string // names are valid (Command.Validate)
	argv  []string
	stdin string // the staged stdin file, or "" for none (/dev/null)
}

func (s scriptSpec) build() string {
	var b strings.Builder
	b.WriteString("gate=" + shellQuote(s.gate) + "\n")
	b.WriteString("while [ ! -e \"$gate\" ]; do sleep 0.02; done\n")
	b.WriteString("rm -f -- \"$gate\"\n")
	b.WriteString("cd -- " + shellQuote(s.dir) + " || exit 1\n")
	names := make([]string, 0, len(s.env))
	for name := range s.env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.WriteString("export " + name + "=" + shellQuote(s.env[name]) + "\n")
	}
	b.WriteString("exec --")
	for _, arg := range s.argv {
		b.WriteString(" " + shellQuote(arg))
	}
	stdin := "/dev/null"
	if s.stdin != "" {
		stdin = s.stdin
	}
	b.WriteString(" < " + shellQuote(stdin) + "\n")
	return b.String()
}

// shellQuote makes s one shell word that the shell takes literally. Inside
// single quotes nothing is special but the single quote itself, which is
// written by ending the quotes, adding an escaped quote and reopening them:
//
//	it's  →  'it'\''s'
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// stagingDir is where a lease's per-command files live: start gates and
// staged stdin.
func stagingDir(workspace string) string { return path.Join(workspace, ".sandboxflow") }

// gatePath and stdinPath name the files of the command with this token.
func gatePath(workspace, token string) string {
	return path.Join(stagingDir(workspace), token+".gate")
}

func stdinPath(workspace, token string) string {
	return path.Join(stagingDir(workspace), token+".stdin")
}

// workingDir resolves a command's cwd: relative to the workspace, which is
// also where an empty cwd leads.
func workingDir(workspace, cwd string) string {
	if path.IsAbs(cwd) {
		return path.Clean(cwd)
	}
	return path.Join(workspace, cwd)
}
