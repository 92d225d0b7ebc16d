// Package template reads the Dockerfile of a template (POST /v1/templates,
// docs/CREATEOS-API.md §3.11) into the steps its build runs.
//
// The subset is the hosted service's: one FROM of a known image or
// template, then RUN, ENV, WORKDIR, USER and ARG. Anything else — COPY,
// ADD, CMD, a second FROM, an unknown word — fails the build with an
// *Error that names the line and the instruction, before any step runs.
// Comments (#), blank lines and lines continued by a trailing backslash
// are read as Docker reads them.
package template

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// MaxSteps bounds the instructions of one Dockerfile.
const MaxSteps = 200

// Supported are the instructions of the subset.
var Supported = []string{"FROM", "RUN", "ENV", "WORKDIR", "USER", "ARG"}

// Error is why a Dockerfile cannot be built: Line (1-based; 0 for the
// file as a whole) and what is wrong there.
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return e.Msg
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// Step is one thing a build does in its build lease: a RUN, or the
// creation of a WORKDIR. It carries what the instructions before it set.
type Step struct {
	Line int
	// Text is the instruction as written (continuations joined), for the
	// build log.
	Text string
	// Argv is the command: a RUN's shell form runs under /bin/sh -c, its
	// exec form as given; a WORKDIR's is mkdir -p of it, as root.
	Argv []string
	// Env are the variables of the ENV and ARG instructions before it.
	Env map[string]string
	// Dir is the working directory ("/" before any WORKDIR); User the
	// user it runs as ("" = root).
	Dir, User string
}

// Dockerfile is a parsed Dockerfile.
type Dockerfile struct {
	// From is the image or template the build starts from ("" when the
	// file has no FROM: the request's base then).
	From  string
	Steps []Step
	// Env, Dir and User are what the last instructions set.
	Env       map[string]string
	Dir, User string

	args map[string]string // of the ARGs so far, below Env in a step's variables
}

// Parse reads src.
func Parse(src string) (*Dockerfile, error) {
	df := &Dockerfile{Env: map[string]string{}, Dir: "/", args: map[string]string{}}
	lines := logicalLines(src)
	if len(lines) > MaxSteps {
		return nil, &Error{0, fmt.Sprintf("at most %d instructions", MaxSteps)}
	}
	for i, ln := range lines {
		word, rest, _ := strings.Cut(ln.text, " ")
		if w, r, ok := strings.Cut(ln.text, "\t"); ok && len(w) < len(word) {
			word, rest = w, r
		}
		rest = strings.TrimSpace(rest)
		fail := func(format string, a ...any) (*Dockerfile, error) {
			return nil, &Error{ln.line, fmt.Sprintf(format, a...)}
		}
		word = strings.ToUpper(word)
		if !slices.Contains(Supported, word) {
			if slices.Contains(unsupported, word) {
				return fail("%s is not supported (a template's Dockerfile has %s)", word, strings.Join(Supported, ", "))
			}
			return fail("unknown instruction %q", clip(word))
		}
		switch word {
		case "FROM":
			if i != 0 {
				return fail("FROM must be the first instruction, and the only FROM")
			}
			f := strings.Fields(rest)
			if len(f) != 1 || strings.HasPrefix(f[0], "--") {
				return fail("FROM takes one image or template name (no flags, no AS)")
			}
			df.From = f[0]
		case "RUN":
			if rest == "" {
				return fail("RUN needs a command")
			}
			argv := []string{"/bin/sh", "-c", rest}
			if strings.HasPrefix(rest, "[") {
				if err := json.Unmarshal([]byte(rest), &argv); err != nil || len(argv) == 0 {
					return fail("RUN's exec form must be a JSON array of strings")
				}
			}
			df.step(ln, argv)
		case "ENV", "ARG":
			pairs, err := envPairs(word, rest)
			if err != nil {
				return fail("%v", err)
			}
			for _, kv := range pairs {
				if word == "ARG" {
					if !kv.set {
						continue // no build arguments are passed: an ARG without default is unset
					}
					df.args[kv.k] = kv.v
				} else {
					df.Env[kv.k] = kv.v
				}
			}
		case "WORKDIR":
			if rest == "" || strings.ContainsRune(rest, 0) {
				return fail("WORKDIR needs a path")
			}
			df.Dir = path.Join(df.Dir, unquote(rest))
			if !path.IsAbs(df.Dir) {
				df.Dir = "/" + df.Dir
			}
			df.step(ln, []string{"mkdir", "-p", "--", df.Dir})
			st := &df.Steps[len(df.Steps)-1]
			st.Dir, st.User = "/", "" // made as root, as Docker makes it
		case "USER":
			f := strings.Fields(rest)
			if len(f) != 1 || strings.Contains(f[0], ":") {
				return fail("USER takes one user (its own group; user:group is not supported)")
			}
			df.User = f[0]
		}
	}
	if len(lines) == 0 {
		return nil, &Error{0, "the Dockerfile is empty"}
	}
	return df, nil
}

// unsupported are Docker's instructions outside the subset, named as such.
var unsupported = []string{"COPY", "ADD", "CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK",
	"ONBUILD", "STOPSIGNAL", "SHELL", "MAINTAINER"}

// step appends a step with what the instructions so far set.
func (df *Dockerfile) step(ln logicalLine, argv []string) {
	env := maps.Clone(df.args)
	maps.Copy(env, df.Env)
	df.Steps = append(df.Steps, Step{Line: ln.line, Text: ln.text, Argv: argv, Env: env, Dir: df.Dir, User: df.User})
}

type logicalLine struct {
	line int // of its first physical line
	text string
}

// logicalLines joins continued lines and drops comments and blank lines.
func logicalLines(src string) []logicalLine {
	var out []logicalLine
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n") {
		t := strings.TrimSpace(raw)
		if strings.HasPrefix(t, "#") || (t == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(t, "\\"); ok {
			cur.WriteString(body)
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(t)
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, logicalLine{start, s})
		}
		cur.Reset()
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, logicalLine{start, s})
	}
	return out
}

type envPair struct {
	k, v string
	set  bool
}

// envPairs reads ENV's and ARG's "K=V K2=V2", ENV's legacy "K V", ARG's
// "K".
func envPairs(word, rest string) ([]envPair, error) {
	if k, v, ok := strings.Cut(rest, " "); ok && word == "ENV" && !strings.Contains(k, "=") {
		if !validName(k) {
			return nil, fmt.Errorf("ENV: bad variable name %q", clip(k))
		}
		return []envPair{{k, unquote(strings.TrimSpace(v)), true}}, nil
	}
	toks, err := words(rest)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", word, err)
	}
	if len(toks) == 0 {
		return nil, fmt.Errorf("%s needs a variable", word)
	}
	var out []envPair
	for _, t := range toks {
		k, v, set := strings.Cut(t, "=")
		if !validName(k) {
			return nil, fmt.Errorf("%s: bad variable name %q", word, clip(k))
		}
		if !set && word == "ENV" {
			return nil, fmt.Errorf("ENV: %s has no value", k)
		}
		out = append(out, envPair{k, v, set})
	}
	return out, nil
}

// words splits s at blanks outside quotes, removing the quotes and the
// backslashes that escape a character.
func words(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in := false
	var quote rune
	for i := 0; i < len(s); i++ {
		c := rune(s[i])
		switch {
		case c == '\\' && quote != '\'' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			in = true
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '"' || c == '\''):
			quote, in = c, true
		case quote == 0 && (c == ' ' || c == '\t'):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(s[i])
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote")
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}

// unquote removes one pair of surrounding double or single quotes.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

func validName(k string) bool {
	if k == "" || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for _, c := range k {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// clip quotes at most 64 bytes of what the Dockerfile said.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
