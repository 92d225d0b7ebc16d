package starterapp

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

// resultOf is the Result of process proc whose stdout is all, keeping its
// last n bytes, as the provider makes it.
func resultOf(proc, all string, n int) sandbox.Result {
	start := max(0, len(all)-n)
	return sandbox.Result{ProcessID: proc, Stdout: all[start:], StdoutStart: int64(start), Truncated: start > 0}
}

func newTestPrinter() (*livePrinter, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	return newLivePrinter(IO{Stdout: &out, Stderr: &errOut}, nil), &out, &errOut
}

func TestLivePrinterPrintsEachByteOnceInOrder(t *testing.T) {
	p, out, errOut := newTestPrinter()
	p.show("sb/p1", activities.ExecuteProgress{Stdout: tailOf("line 1\n", 100)})
	p.show("sb/p1", activities.ExecuteProgress{Stdout: tailOf("line 1\n", 100)}) // the same heartbeat again
	p.show("sb/p1", activities.ExecuteProgress{Stdout: tailOf("line 1\nline 2\n", 100), Stderr: tailOf("warn\n", 100)})
	p.finish(sandbox.Result{ProcessID: "p1", Stdout: "line 1\nline 2\nline 3\n", Stderr: "warn\n"}, "sb")
	assert.Equal(t, "line 1\nline 2\nline 3\n", out.String())
	assert.Equal(t, "warn\n", errOut.String())
}

func TestLivePrinterSaysHowManyBytesItSkipped(t *testing.T) {
	p, out, errOut := newTestPrinter()
	all := "aaaa" + "bbbb" + "cccc"
	p.show("sb/p1", activities.ExecuteProgress{Stdout: tailOf(all[:4], 4)})
	p.show("sb/p1", activities.ExecuteProgress{Stdout: tailOf(all, 4)}) // bbbb never seen
	assert.Equal(t, "aaaacccc", out.String())
	assert.Equal(t, "[… 4 bytes skipped]\n", errOut.String())
	assert.True(t, p.skipped)
}

func TestLivePrinterJoinsATruncatedResultAtItsOffset(t *testing.T) {
	// The stream repeats itself, so that no overlap of text can say where
	// the Result's tail belongs: only its offset can.
	all := strings.Repeat("tick\n", 20)
	for name, tc := range map[string]struct {
		printed    int // bytes printed live
		kept       int // bytes the Result keeps
		wantNotice string
	}{
		"the tail overlaps what was printed":   {printed: 62, kept: 50},
		"the tail starts where printing ended": {printed: 60, kept: 40},
		"the tail starts after a gap":          {printed: 30, kept: 40, wantNotice: "[… 30 bytes skipped]\n"},
		"everything was printed live":          {printed: 100, kept: 50},
		"nothing was printed live":             {printed: 0, kept: 25, wantNotice: "[… 75 bytes skipped]\n"},
	} {
		t.Run(name, func(t *testing.T) {
			p, out, errOut := newTestPrinter()
			if tc.printed > 0 {
				p.show("sb/p1", activities.ExecuteProgress{Stdout: tailOf(all[:tc.printed], 100)})
			}
			p.finish(resultOf("p1", all, tc.kept), "sb")
			want := all
			if tc.wantNotice != "" {
				skippedTo := len(all) - tc.kept
				want = all[:tc.printed] + all[skippedTo:]
			}
			assert.Equal(t, want, out.String(), "each byte once, in order")
			assert.Equal(t, tc.wantNotice, errOut.String())
		})
	}
}

func TestLivePrinterSaysWhenTheCommandRunsAnew(t *testing.T) {
	p, out, errOut := newTestPrinter()
	p.show("sb/p1", activities.ExecuteProgress{Stdout: tailOf("first try\n", 100)})
	p.show("sb/p2", activities.ExecuteProgress{Stdout: tailOf("second\n", 100)})
	p.finish(sandbox.Result{ProcessID: "p2", Stdout: "second\n"}, "sb")
	assert.Equal(t, "first try\nsecond\n", out.String())
	assert.Contains(t, errOut.String(), "runs anew")
}

func TestLivePrinterPrintsAResultOfAnotherProcessWhole(t *testing.T) {
	// The command ran anew (on a fresh lease, where process ids may repeat)
	// and ended before any heartbeat of the new process was seen.
	p, out, errOut := newTestPrinter()
	p.show("sb-1/p1", activities.ExecuteProgress{Stdout: tailOf("first try\n", 100)})
	p.finish(sandbox.Result{ProcessID: "p1", Stdout: "second try\n"}, "sb-2")
	assert.Equal(t, "first try\nsecond try\n", out.String())
	assert.Contains(t, errOut.String(), "runs anew")
}

func TestLivePrinterWithoutLiveOutputPrintsTheResult(t *testing.T) {
	p, out, errOut := newTestPrinter()
	p.finish(sandbox.Result{ProcessID: "p1", Stdout: "all\n", Stderr: "err\n"}, "sb")
	assert.Equal(t, "all\n", out.String())
	assert.Equal(t, "err\n", errOut.String())
}

// A template build's log goes to stderr as its heartbeats grow, each line
// once, and leaves the command's streams alone.
func TestLivePrinterPrintsTheBuildLogOnce(t *testing.T) {
	p, out, errOut := newTestPrinter()
	assert.True(t, p.showBuild(activities.TemplateProgress{Name: "sf-1", Log: tailOf("step 1\n", 100)}))
	assert.False(t, p.showBuild(activities.TemplateProgress{Name: "sf-1", Log: tailOf("step 1\n", 100)}))
	p.showBuild(activities.TemplateProgress{Name: "sf-1", Log: tailOf("step 1\nstep 2\n", 100)})
	p.show("sb/p1", activities.ExecuteProgress{Stderr: tailOf("warn\n", 100)})
	assert.Equal(t, "step 1\nstep 2\nwarn\n", errOut.String())
	assert.Empty(t, out.String())
}
