package reliability

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// The size limits of a command (sandbox.MaxArgBytes, MaxArgvEnvBytes,
// MaxStdinBytes): what fits runs, once; what cannot is refused before any
// lease is created, as SandboxInvalidInput naming the limit.

// watchCreates counts the sandbox creates that reach the server.
func (e *env) watchCreates() {
	e.proxy.AddRule(faultproxy.Rule{Name: "creates", Method: http.MethodPost, Path: sandboxesPath, Fault: faultproxy.Pass()})
}

// ranAnyhow counts the managed processes that printed marker first,
// whatever their command line (a long script runs as `sh FILE`).
func (e *env) ranAnyhow(marker string) int {
	n := 0
	for _, r := range e.stack.Sandbox.History() {
		if !r.Exec && bytes.HasPrefix(r.Stdout, []byte(marker+"\n")) {
			n++
		}
	}
	return n
}

// argvRow runs a command whose argv holds n arguments of size bytes each:
// too much for one `sh -c` argument (128 KiB), within the execve budget.
func argvRow(t *testing.T, n, size int) {
	e := start(t, options{})
	e.watchCreates()
	marker := newMarker()
	argv := []string{"sh", "-c", "echo " + marker + `; getconf ARG_MAX; printf %s "$@" | wc -c`, "sh"}
	for i := range n {
		argv = append(argv, strings.Repeat(string(rune('a'+i%26)), size))
	}

	res, err := e.run(request(sandbox.Command{Argv: argv}))
	require.NoError(t, err)
	require.True(t, res.Succeeded(), "%+v", res.Result)
	lines := strings.Fields(res.Stdout)
	require.Len(t, lines, 3, res.Stdout)
	t.Logf("ARG_MAX in the lease: %s", lines[1])
	assert.Equal(t, fmt.Sprint(n*size), lines[2], "every byte of argv reached the command")
	assert.Equal(t, 1, e.ranAnyhow(marker), "the command ran once")
	assert.Zero(t, res.FreshLeases)
	e.requireFired("creates", 1)
}

// 200 KB of argv: 4 arguments of 50 KB.
func TestArgvOf200KB(t *testing.T) { argvRow(t, 4, 50_000) }

// 1 MB of argv: 10 arguments of 100 KB.
func TestArgvOf1MB(t *testing.T) { argvRow(t, 10, 100_000) }

// One argument of 200 KB can never be passed to a program on Linux
// (MAX_ARG_STRLEN): refused before a lease, naming the limit.
func TestArgumentOver128KiBIsRefusedBeforeALease(t *testing.T) {
	e := start(t, options{})
	e.watchCreates()
	marker := newMarker()
	cmd := command(marker, "true")
	cmd.Argv = append(cmd.Argv, strings.Repeat("a", 200_000))

	_, err := e.run(request(cmd))
	appErr := requireApplicationError(t, err, sandbox.TypeInvalidInput)
	assert.Contains(t, appErr.Error(), "argv[3] is 200000 bytes, more than the limit of 131071 bytes for one argument")
	e.requireFired("creates", 0)
	assert.Zero(t, e.ranAnyhow(marker))
}

// 10 MB of stdin is refused by the starter before anything starts, having
// read no more than the limit and a byte of it.
func TestStdinOf10MBIsRefusedBeforeALease(t *testing.T) {
	e := start(t, options{})
	e.watchCreates()
	marker := newMarker()
	in := &countingReader{n: 10 << 20}
	var stdout, stderr bytes.Buffer
	opts := client.Options{HostPort: e.stack.Temporal.FrontendHostPort(), Namespace: e.stack.Temporal.Namespace()}

	code := starterapp.Main(t.Context(), []string{"--stdin", "-", "--", "sh", "-c", "echo " + marker + "; wc -c"},
		starterapp.IO{Stdin: in, Stdout: &stdout, Stderr: &stderr}, opts, nil)

	assert.Equal(t, starterapp.ExitUsage, code, stderr.String())
	assert.Contains(t, stderr.String(), "invalid stdin: stdin is more than its limit of 524288 bytes (sandbox.MaxStdinBytes)")
	assert.Equal(t, int64(sandbox.MaxStdinBytes+1), in.read, "the starter read the limit and a byte, not 10 MB")
	e.requireFired("creates", 0)
	assert.Zero(t, e.ranAnyhow(marker))
}

// countingReader yields n bytes without holding them, counting what was
// read.
type countingReader struct{ n, read int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	if c.read >= c.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), c.n-c.read)
	c.read += k
	return int(k), nil
}
