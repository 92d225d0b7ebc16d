// Package template reads the Dockerfile of a template (POST /v1/templates,
// docs/CREATEOS-API.md §3.11) into the steps its build runs and the
// Config its leases start with.
//
// The subset is the hosted service's: one FROM of a known image or
// template, then RUN, ENV, WORKDIR, USER and ARG. Anything else — COPY,
// ADD, CMD, a second FROM, an unknown word — fails the build with an
// *Error that names the line and the instruction, before any step runs.
// Comments (#), blank lines and lines continued by a trailing backslash
// are read as Docker reads them, and so are $NAME and ${NAME} in ENV,
// ARG, WORKDIR and USER (an unset variable is empty), so that
// `ENV PATH=/opt/tool/bin:$PATH` extends the PATH the build has.
//
// The final ENV and WORKDIR are the template's Config, which its leases
// start with, as a Docker image's do. The final USER is not: sandboxd
// runs a lease's commands as its root and has no notion of a command's
// user, so a Dockerfile that ends as another user fails (USER root after
// the steps that need the user is fine).
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

// maxEnvBytes bounds what the variables of a build hold together (names
// and values of its ENVs and ARGs, over the base's), and so what one
// expansion may produce: without it, ENV A=$A$A doubles A at each line,
// and 40 such lines ask the server for a TiB at Parse. A command's
// environment holds at most a few MiB anyway (execve's E2BIG).
const maxEnvBytes = 1 << 20

// errTooLarge is an expansion or a set of variables past maxEnvBytes.
var errTooLarge = fmt.Errorf("the build's variables would hold more than %d bytes", maxEnvBytes)

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

// Config is what a template's Dockerfile leaves set for the leases started
// from it, and for the templates built FROM it: the variables of its
// ENVs (beneath a create's envs and a command's own) and its last
// WORKDIR (the working directory of a command that names none).
type Config struct {
	Env     map[string]string `json:"env,omitempty"`
	WorkDir string            `json:"workdir,omitempty"`
}

// Dockerfile is a parsed Dockerfile.
type Dockerfile struct {
	// From is the image or template the build starts from ("" when the
	// file has no FROM: the request's base then).
	From  string
	lines []logicalLine
}

// Plan is what a build of a Dockerfile on a base runs and leaves.
type Plan struct {
	Steps []Step
	// Config is what the last instructions set, over the base's.
	Config Config
}

// Parse reads src. Every instruction is checked here, so that what is
// wrong fails before any step runs.
func Parse(src string) (*Dockerfile, error) {
	lines := logicalLines(src)
	if len(lines) > MaxSteps {
		return nil, &Error{0, fmt.Sprintf("at most %d instructions", MaxSteps)}
	}
	if len(lines) == 0 {
		return nil, &Error{0, "the Dockerfile is empty"}
	}
	df := &Dockerfile{lines: lines}
	if _, err := df.Plan(Config{}, nil); err != nil {
		return nil, err
	}
	return df, nil
}

// Plan is the build of df on base, the Config of what its FROM names.
// environ are the variables every command of the build lease has
// beneath the ENVs (PATH, HOME, …), which $NAME may name too.
func (df *Dockerfile) Plan(base Config, environ map[string]string) (Plan, error) {
	b := planner{env: maps.Clone(base.Env), dir: base.WorkDir, workdir: base.WorkDir, args: map[string]string{}, environ: environ}
	if b.env == nil {
		b.env = map[string]string{}
	}
	if b.dir == "" {
		b.dir = "/" // where Docker's steps run without a WORKDIR
	}
	userLine := 0
	for i, ln := range df.lines {
		word, rest, _ := strings.Cut(ln.text, " ")
		if w, r, ok := strings.Cut(ln.text, "\t"); ok && len(w) < len(word) {
			word, rest = w, r
		}
		rest = strings.TrimSpace(rest)
		fail := func(format string, a ...any) (Plan, error) {
			return Plan{}, &Error{ln.line, fmt.Sprintf(format, a...)}
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
			b.step(ln, argv)
		case "ENV", "ARG":
			// Each pair sees the ones before it, as in Docker.
			pairs, err := envPairs(word, rest, b.lookup)
			if err != nil {
				return fail("%v", err)
			}
			for _, kv := range pairs {
				if word == "ARG" {
					if !kv.set {
						continue // no build arguments are passed: an ARG without default is unset
					}
					b.args[kv.k] = kv.v
				} else {
					b.env[kv.k] = kv.v
				}
			}
			if b.varBytes() > maxEnvBytes {
				return fail("%s: %v", word, errTooLarge)
			}
		case "WORKDIR":
			if rest == "" || strings.ContainsRune(rest, 0) {
				return fail("WORKDIR needs a path")
			}
			// What the base sets is not known when Parse checks the
			// file: a path of unset variables is the directory itself.
			dir, err := expand(unquote(rest), b.lookup)
			if err != nil {
				return fail("WORKDIR: %v", err)
			}
			b.dir = path.Join(b.dir, dir)
			if !path.IsAbs(b.dir) {
				b.dir = "/" + b.dir
			}
			b.workdir = b.dir
			b.step(ln, []string{"mkdir", "-p", "--", b.dir})
			st := &b.steps[len(b.steps)-1]
			st.Dir, st.User = "/", "" // made as root, as Docker makes it
		case "USER":
			user, err := expand(rest, b.lookup)
			if err != nil {
				return fail("USER: %v", err)
			}
			f := strings.Fields(user)
			if len(f) != 1 || strings.Contains(f[0], ":") {
				return fail("USER takes one user (its own group; user:group is not supported)")
			}
			b.user, userLine = f[0], ln.line
		}
	}
	if b.user != "" && b.user != "root" && b.user != "0" {
		return Plan{}, &Error{userLine, fmt.Sprintf("USER %s: a template cannot end as another user than root: "+
			"sandboxd runs its sandboxes' commands as their root, not as a template's user "+
			"(end the Dockerfile with USER root; the steps before it run as USER says)", clip(b.user))}
	}
	cfg := Config{Env: b.env, WorkDir: b.workdir}
	if len(cfg.Env) == 0 {
		cfg.Env = nil
	}
	return Plan{Steps: b.steps, Config: cfg}, nil
}

// planner is the state of a Plan between instructions.
type planner struct {
	env     map[string]string // of the ENVs so far, over the base's
	args    map[string]string // of the ARGs so far, below env in a step's variables
	environ map[string]string // the lease's own, below both
	dir     string            // where the next step runs
	// workdir is the last WORKDIR's, or the base's: "" when neither set
	// one, and a command without cwd starts where a lease's do.
	workdir string
	user    string // "" = root
	steps   []Step
}

// varBytes is what the variables of the ENVs and ARGs so far hold.
func (b *planner) varBytes() int {
	n := 0
	for _, m := range []map[string]string{b.env, b.args} {
		for k, v := range m {
			n += len(k) + len(v)
		}
	}
	return n
}

// lookup is what $NAME means at this point of the build.
func (b *planner) lookup(name string) string {
	if v, ok := b.env[name]; ok {
		return v
	}
	if v, ok := b.args[name]; ok {
		return v
	}
	return b.environ[name]
}

// unsupported are Docker's instructions outside the subset, named as such.
var unsupported = []string{"COPY", "ADD", "CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK",
	"ONBUILD", "STOPSIGNAL", "SHELL", "MAINTAINER"}

// step appends a step with what the instructions so far set.
func (b *planner) step(ln logicalLine, argv []string) {
	env := maps.Clone(b.args)
	maps.Copy(env, b.env)
	b.steps = append(b.steps, Step{Line: ln.line, Text: ln.text, Argv: argv, Env: env, Dir: b.dir, User: b.user})
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
// "K", expanding variables by lookup.
func envPairs(word, rest string, lookup func(string) string) ([]envPair, error) {
	if k, v, ok := strings.Cut(rest, " "); ok && word == "ENV" && !strings.Contains(k, "=") {
		if !validName(k) {
			return nil, fmt.Errorf("ENV: bad variable name %q", clip(k))
		}
		v, err := expand(unquote(strings.TrimSpace(v)), lookup)
		if err != nil {
			return nil, fmt.Errorf("ENV: %v", err)
		}
		return []envPair{{k, v, true}}, nil
	}
	toks, err := words(rest, lookup)
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
// backslashes that escape a character, and expanding variables by lookup
// outside single quotes; the words hold at most maxEnvBytes together.
func words(s string, lookup func(string) string) ([]string, error) {
	var out []string
	var cur strings.Builder
	done := 0 // the bytes of the words in out
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
		case c == '$' && quote != '\'':
			name, next, err := variable(s, i)
			if err != nil {
				return nil, err
			}
			if name == "" {
				cur.WriteByte('$')
			} else {
				cur.WriteString(lookup(name))
				i = next - 1
				if done+cur.Len() > maxEnvBytes {
					return nil, errTooLarge
				}
			}
			in = true
		case quote == 0 && (c == ' ' || c == '\t'):
			if in {
				out = append(out, cur.String())
				done += cur.Len()
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

// expand replaces $NAME and ${NAME} in s by lookup; \$ is a '$'. The
// result holds at most maxEnvBytes.
func expand(s string, lookup func(string) string) (string, error) {
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && s[i+1] == '$':
			out.WriteByte('$')
			i++
		case s[i] == '$':
			name, next, err := variable(s, i)
			if err != nil {
				return "", err
			}
			if name == "" {
				out.WriteByte('$')
				continue
			}
			out.WriteString(lookup(name))
			i = next - 1
			if out.Len() > maxEnvBytes {
				return "", errTooLarge
			}
		default:
			out.WriteByte(s[i])
		}
	}
	return out.String(), nil
}

// variable reads the variable reference at s[i] == '$': its name ("" when
// the '$' starts none) and the index after it. Only $NAME and ${NAME}
// are read; ${NAME:-word} and the other forms are refused by name rather
// than misread.
func variable(s string, i int) (name string, next int, err error) {
	j := i + 1
	if j < len(s) && s[j] == '{' {
		end := strings.IndexByte(s[j:], '}')
		if end < 0 {
			return "", 0, fmt.Errorf("unterminated ${")
		}
		name = s[j+1 : j+end]
		if !validName(name) {
			return "", 0, fmt.Errorf("${%s}: only $NAME and ${NAME} are supported", clip(name))
		}
		return name, j + end + 1, nil
	}
	for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || j > i+1 && s[j] >= '0' && s[j] <= '9') {
		j++
	}
	return s[i+1 : j], j, nil
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
