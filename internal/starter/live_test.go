package starter

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// tailOf is the heartbeat tail of a stream whose whole text is all, keeping
// its last n bytes.
func tailOf(all string, n int) activities.OutputTail {
	return activities.OutputTail{Text: all[max(0, len(all)-n):], End: int64(len(all))}
}

func newTestPrinter() (*livePrinter, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	return newLivePrinter(IO{Stdout: &out, Stderr: &errOut}, nil), &out, &errOut
}

func TestLivePrinterPrintsEachByteOnceInOrder(t *testing.T) {
	p, out, errOut := newTestPrinter()
	p.show("run/5", activities.ExecuteProgress{Stdout: tailOf("line 1\n", 100)})
	p.show("run/5", activities.ExecuteProgress{Stdout: tailOf("line 1\n", 100)}) // the same heartbeat again
	p.show("run/5", activities.ExecuteProgress{Stdout: tailOf("line 1\nline 2\n", 100), Stderr: tailOf("warn\n", 100)})
	p.finish(sandbox.Result{Stdout: "line 1\nline 2\nline 3\n", Stderr: "warn\n"})
	assert.Equal(t, "line 1\nline 2\nline 3\n", out.String())
	assert.Equal(t, "warn\n", errOut.String())
}

func TestLivePrinterSaysHowManyBytesItSkipped(t *testing.T) {
	p, out, errOut := newTestPrinter()
	all := "aaaa" + "bbbb" + "cccc"
	p.show("run/5", activities.ExecuteProgress{Stdout: tailOf(all[:4], 4)})
	p.show("run/5", activities.ExecuteProgress{Stdout: tailOf(all, 4)}) // bbbb never seen
	assert.Equal(t, "aaaacccc", out.String())
	assert.Equal(t, "[… 4 bytes skipped]\n", errOut.String())
}

func TestLivePrinterJoinsATruncatedResultWithoutRepeats(t *testing.T) {
	p, out, errOut := newTestPrinter()
	all := strings.Repeat("x", 50) + "line 1\nline 2\nline 3\n"
	p.show("run/5", activities.ExecuteProgress{Stdout: tailOf(all[:57], 10)})
	// The result holds the last 20 bytes only, which overlap what was
	// printed by "\n" (line 1's end).
	p.finish(sandbox.Result{Stdout: all[len(all)-20:], Truncated: true})
	assert.Equal(t, all[47:], out.String())
	assert.Equal(t, "[… 47 bytes skipped]\n", errOut.String())
}

func TestLivePrinterSaysWhenTheCommandRunsAnew(t *testing.T) {
	p, out, errOut := newTestPrinter()
	p.show("run/5", activities.ExecuteProgress{Stdout: tailOf("first try\n", 100)})
	p.show("run/9", activities.ExecuteProgress{Stdout: tailOf("second\n", 100)})
	p.finish(sandbox.Result{Stdout: "second\n"})
	assert.Equal(t, "first try\nsecond\n", out.String())
	assert.Contains(t, errOut.String(), "runs anew")
}

func TestLivePrinterWithoutLiveOutputPrintsTheResult(t *testing.T) {
	p, out, errOut := newTestPrinter()
	p.finish(sandbox.Result{Stdout: "all\n", Stderr: "err\n"})
	assert.Equal(t, "all\n", out.String())
	assert.Equal(t, "err\n", errOut.String())
}
