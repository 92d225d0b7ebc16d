package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRowVerdicts(t *testing.T) {
	ms := func(v float64) Value { return Value{v, "ms"} }
	rate := func(v float64) Value { return Value{v, "runs/s"} }
	for _, c := range []struct {
		name string
		row  Row
		want string
	}{
		{"cost within its bound", Row{Figure: ms(150), Floor: ms(100), Target: Target{MaxRatio: 2}}, "met"},
		{"cost over its bound", Row{Figure: ms(250), Floor: ms(100), Target: Target{MaxRatio: 2}}, "**not met**"},
		{"rate and figure enough", Row{Figure: rate(60), Floor: rate(90), Target: Target{MinRatio: 0.6, MinFigure: 50}}, "met"},
		{"rate enough, figure not", Row{Figure: rate(40), Floor: rate(50), Target: Target{MinRatio: 0.6, MinFigure: 50}}, "**not met**"},
		{"figure enough, rate not", Row{Figure: rate(55), Floor: rate(100), Target: Target{MinRatio: 0.6, MinFigure: 50}}, "**not met**"},
		{"within its budget", Row{Figure: ms(90), Floor: ms(5), Target: Target{MaxFigure: 100}}, "met"},
		{"over its budget", Row{Figure: ms(110), Floor: ms(5), Target: Target{MaxFigure: 100}}, "**not met**"},
		{"no floor", Row{Figure: ms(1), Floor: ms(0), Target: Target{MaxRatio: 2}}, "**not met**"},
		{"no target", Row{Figure: ms(1), Floor: ms(2)}, "info"},
	} {
		assert.Equal(t, c.want, c.row.verdict(), c.name)
	}
}

func TestReportMarkdown(t *testing.T) {
	rep := Report{
		Machine:  Machine{CPUs: 2, CPUModel: "Some CPU", GoVersion: "go1.26.8", LoadBefore: "0.10", LoadAfter: "0.20"},
		Date:     time.Date(2026, 11, 29, 15, 4, 0, 0, time.UTC),
		Duration: 90 * time.Second,
		Rows: []Row{{Name: "P1 x", Figure: Value{160, "ms"}, FloorName: "direct provider", Floor: Value{80, "ms"},
			Target: Target{MaxRatio: 2}}},
		Notes: []string{"a note"},
	}
	md := rep.Markdown()
	assert.Contains(t, md, "Measured 2026-11-29 15:04 UTC on 2 × Some CPU, go1.26.8; load average 0.10 before, 0.20 after; took 1m30s.")
	assert.Contains(t, md, "| P1 x | 160 ms | 80.0 ms (direct provider) | 2.00× | ≤ 2× | met |\n")
	assert.True(t, strings.HasSuffix(md, "\na note\n"), md)
}

func TestValuesOfCountsAreWhole(t *testing.T) {
	assert.Equal(t, "4 tasks", Value{4, "tasks"}.String())
	assert.Equal(t, "14.3 RPCs", Value{14.3, "RPCs"}.String())
	assert.Equal(t, "4.00 ms", Value{4, "ms"}.String(), "a duration keeps its decimals")
}

func TestTargetDescribe(t *testing.T) {
	assert.Equal(t, "≤ 100 ms", Target{MaxFigure: 100}.describe("ms"))
	assert.Equal(t, "≥ 0.6× and ≥ 50 runs/s", Target{MinRatio: 0.6, MinFigure: 50}.describe("runs/s"))
	assert.Equal(t, "—", Target{}.describe("ms"))
}

func TestParseBenchmarks(t *testing.T) {
	out := `goos: linux
BenchmarkDecodeOutput/frame=1KiB-2         	  276448	      2066 ns/op	 495.72 MB/s	    1317 B/op	       2 allocs/op
BenchmarkJournal/live/chunk=256B-2         	 1325918	       479.6 ns/op	 533.78 MB/s	     372 B/op	       1 allocs/op
BenchmarkNoBytes-2                         	 1000	       1.0 ns/op
PASS
ok  	github.com/sandboxflow/sandboxflow/createos	4.0s
`
	rates, err := parseBenchmarks([]byte(out))
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{
		"BenchmarkDecodeOutput/frame=1KiB": 495.72,
		"BenchmarkJournal/live/chunk=256B": 533.78,
	}, rates)
}

func TestQuantile(t *testing.T) {
	samples := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	assert.Equal(t, time.Duration(5), Quantile(samples, 0.5))
	assert.Equal(t, time.Duration(10), Quantile(samples, 0.95))
	assert.Equal(t, time.Duration(1), Quantile(samples, 0.01))
	assert.Zero(t, Quantile(nil, 0.5))
	assert.Equal(t, []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}, samples, "the samples are left in their order")
}
