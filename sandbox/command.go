package sandbox

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Command is a program to run in a sandbox. It is not interpreted by a
// shell: Argv[0] is the program and the rest are its arguments, passed as
// they are.
type Command struct {
	// Argv is the program and its arguments. Argv[0] must not be empty.
	// Each argument is at most MaxArgBytes, and argv and Env together at
	// most MaxArgvEnvBytes.
	Argv []string `json:"argv"`
	// Cwd is the working directory. A relative path is relative to the lease's
	// workspace; empty means the workspace itself.
	Cwd string `json:"cwd,omitempty"`
	// Env adds variables to the command's environment. Names must match
	// [A-Za-z_][A-Za-z0-9_]*.
	Env map[string]string `json:"env,omitempty"`
	// Stdin, if not empty, is the command's standard input, at most
	// MaxStdinBytes. Otherwise the command reads end-of-file.
	Stdin []byte `json:"stdin,omitempty"`
	// Timeout bounds the command's run time; zero means no limit. A command
	// that runs out of time is killed and its Result has TimedOut set.
	Timeout time.Duration `json:"timeout,omitempty"`
}

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidEnvName reports whether name can be an environment variable name.
func ValidEnvName(name string) bool { return envNamePattern.MatchString(name) }

// Validate checks the command without sending anything, its sizes
// included (limits.go). It returns an *InvalidInputError naming the first
// field at fault. Error text never contains an environment value.
func (c Command) Validate() error {
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return &InvalidInputError{Field: "argv", Reason: "a command needs a program name"}
	}
	for i, arg := range c.Argv {
		if strings.ContainsRune(arg, 0) {
			return &InvalidInputError{Field: fmt.Sprintf("argv[%d]", i), Reason: "contains a NUL byte"}
		}
	}
	if strings.ContainsRune(c.Cwd, 0) {
		return &InvalidInputError{Field: "cwd", Reason: "contains a NUL byte"}
	}
	for name, value := range c.Env {
		if !ValidEnvName(name) {
			return &InvalidInputError{Field: "env", Reason: fmt.Sprintf("%q is not a valid variable name", name)}
		}
		if strings.ContainsRune(value, 0) {
			return &InvalidInputError{Field: "env", Reason: fmt.Sprintf("the value of %s contains a NUL byte", name)}
		}
	}
	if c.Timeout < 0 {
		return &InvalidInputError{Field: "timeout", Reason: "must not be negative"}
	}
	return c.checkSizes()
}

// String shows the command as a shell would read it, for summaries and
// logs. It never shows environment values or stdin.
func (c Command) String() string {
	quoted := make([]string, len(c.Argv))
	for i, arg := range c.Argv {
		quoted[i] = displayQuote(arg)
	}
	return strings.Join(quoted, " ")
}

// displayQuote quotes arg for display only when it would otherwise be
// ambiguous.
func displayQuote(arg string) string {
	if arg != "" && strings.IndexFunc(arg, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == '/' || r == '=' || r == ':' || r == ',' || r == '+' || r == '@' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0 {
		return arg
	}
	return "'" + strings.ReplaceAll(arg, "'", `'\''`) + "'"
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)

// ValidID reports whether id can be a sandbox or process id: 1 to 200
// characters of A-Z, a-z, 0-9, '_' and '-'.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// CheckID returns an *InvalidInputError when id is not a valid id. kind
// names it in the error ("lease id", "process id").
func CheckID(kind, id string) error {
	if ValidID(id) {
		return nil
	}
	return &InvalidInputError{Field: kind, Reason: "must be 1 to 200 characters of A-Z, a-z, 0-9, '_' or '-'"}
}
