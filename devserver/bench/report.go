// Package bench measures sandboxflow against floors taken in the same run:
// every figure of its table is a ratio to what the same machine does, at
// the same moment, without the part being measured. Figures on a shared
// machine drift; ratios taken side by side drift much less.
//
// The program devserver/cmd/bench runs the measurements and prints the
// table (`make bench`).
package bench

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Value is a measured quantity and its unit ("ms", "runs/s", "MB/s", "MiB",
// or one of countUnits).
type Value struct {
	V    float64
	Unit string
}

// countUnits are the units of things counted (P0): a whole number of them
// prints without decimals.
var countUnits = map[string]bool{"RPCs": true, "tasks": true, "events": true, "requests": true}

func (v Value) String() string {
	switch {
	case math.IsNaN(v.V):
		return "n/a"
	case v.V >= 100 || countUnits[v.Unit] && v.V == math.Trunc(v.V):
		return fmt.Sprintf("%.0f %s", v.V, v.Unit)
	case v.V >= 10:
		return fmt.Sprintf("%.1f %s", v.V, v.Unit)
	}
	return fmt.Sprintf("%.2f %s", v.V, v.Unit)
}

// Target is what a row's ratio (figure ÷ floor) must satisfy. A zero bound
// is no bound; a Target with no bound at all makes an informational row.
type Target struct {
	// MaxRatio: the figure is at most this many times its floor (costs:
	// latency, memory).
	MaxRatio float64
	// MinRatio: the figure is at least this fraction of its floor (rates:
	// throughput).
	MinRatio float64
	// MinFigure: the figure itself is at least this much, in its own unit.
	MinFigure float64
	// MaxFigure: the figure itself is at most this much, in its own unit
	// (an absolute budget, such as 100 ms for a create and destroy).
	MaxFigure float64
}

func (t Target) none() bool {
	return t.MaxRatio == 0 && t.MinRatio == 0 && t.MinFigure == 0 && t.MaxFigure == 0
}

func (t Target) describe(unit string) string {
	var parts []string
	if t.MaxRatio > 0 {
		parts = append(parts, fmt.Sprintf("≤ %g×", t.MaxRatio))
	}
	if t.MinRatio > 0 {
		parts = append(parts, fmt.Sprintf("≥ %g×", t.MinRatio))
	}
	if t.MinFigure > 0 {
		parts = append(parts, fmt.Sprintf("≥ %g %s", t.MinFigure, unit))
	}
	if t.MaxFigure > 0 {
		parts = append(parts, fmt.Sprintf("≤ %g %s", t.MaxFigure, unit))
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, " and ")
}

// Row is one line of the table: a figure beside its floor.
type Row struct {
	// Name says what the figure is, FloorName what its floor is.
	Name      string
	Figure    Value
	FloorName string
	Floor     Value
	Target    Target
}

// Ratio is Figure ÷ Floor.
func (r Row) Ratio() float64 { return r.Figure.V / r.Floor.V }

// Met reports whether the row meets its target; an informational row
// (no target) is never "met".
func (r Row) Met() bool {
	t, ratio := r.Target, r.Ratio()
	if t.none() || math.IsNaN(ratio) || math.IsInf(ratio, 0) {
		return false
	}
	return (t.MaxRatio == 0 || ratio <= t.MaxRatio) &&
		(t.MinRatio == 0 || ratio >= t.MinRatio) &&
		(t.MinFigure == 0 || r.Figure.V >= t.MinFigure) &&
		(t.MaxFigure == 0 || r.Figure.V <= t.MaxFigure)
}

func (r Row) verdict() string {
	switch {
	case r.Target.none():
		return "info"
	case r.Met():
		return "met"
	}
	return "**not met**"
}

// Machine describes where the table was measured.
type Machine struct {
	CPUs      int
	CPUModel  string
	GoVersion string
	// LoadBefore and LoadAfter are /proc/loadavg's 1-minute figure when the
	// measurements began and ended: a hint of how busy the machine was.
	LoadBefore, LoadAfter string
}

// Report is the whole table.
type Report struct {
	Machine  Machine
	Date     time.Time
	Duration time.Duration
	Rows     []Row
	// Notes are printed under the table (failures of a part, say).
	Notes []string
}

// Markdown renders the report as a markdown table with its machine line.
func (rep Report) Markdown() string {
	var b strings.Builder
	m := rep.Machine
	fmt.Fprintf(&b, "Measured %s on %d × %s, %s; load average %s before, %s after; took %s.\n\n",
		rep.Date.UTC().Format("2006-01-02 15:04 MST"), m.CPUs, m.CPUModel, m.GoVersion,
		m.LoadBefore, m.LoadAfter, rep.Duration.Round(time.Second))
	b.WriteString("| Row | Figure | Floor | Ratio | Target | Met |\n")
	b.WriteString("|---|---:|---|---:|---|---|\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s (%s) | %s | %s | %s |\n",
			r.Name, r.Figure, r.Floor, r.FloorName, formatRatio(r.Ratio()), r.Target.describe(r.Figure.Unit), r.verdict())
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "\n%s\n", n)
	}
	return b.String()
}

func formatRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	if x >= 10 {
		return fmt.Sprintf("%.1f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}
