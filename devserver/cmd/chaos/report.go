package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// typedErrors are the error types a run may fail with: the sandbox
// taxonomy and the workflow's own.
var typedErrors = func() map[string]bool {
	types := map[string]bool{workflows.TypeCompensationExhausted: true}
	for _, k := range sandbox.Kinds() {
		types[k.Type] = true
	}
	return types
}()

// report is what the soak found.
type report struct {
	runs, succeeded int
	typed           map[string]int // failures by error type
	typedDetails    []string       // one line per typed failure
	lost            []string       // runs that neither completed nor failed with a typed error
	wrongOutput     []string       // runs that completed with output other than the command's
	compensations   int            // fresh leases taken, over all runs
	// leases counts the lease activities by name (CreateLease: first
	// creates; AcquireFreshLease: compensations): scheduled and
	// completed.
	leases       map[string]*activityCount
	leakedLeases int
	orphans      int // processes of the server's sandboxes alive on the machine, or counted by the server
	// duplicates counts the commands that ran more than once; the extra
	// runs are classified by what explains them.
	duplicates  int
	extra       map[string]int
	unexplained []string
	faults      map[string]int // faults injected, by kind
	wall        time.Duration
	// On a fleet: the runs that ended on each host, the hosts killed, and
	// the leases runs gave up with a lost host.
	perHost    map[string]int
	kills      int
	lostLeases int
}

// Classes of extra runs of a command.
const (
	extraUnconfirmedKill = "compensation after an unconfirmed kill"
	extraVanishedLease   = "compensation after the lease vanished"
	extraHostLost        = "compensation after its host was lost"
	extraExhaustion      = "retry after the output connection was exhausted"
	extraUnexplained     = "unexplained"
)

func (r *report) failed() bool {
	return r.leakedLeases > 0 || r.orphans > 0 || len(r.lost) > 0 || len(r.wrongOutput) > 0
}

// analyse checks what the runs left behind and classifies their outcomes.
func analyse(ctx context.Context, w *world, outcomes []*outcome) (*report, error) {
	r := &report{runs: len(outcomes), typed: map[string]int{}, extra: map[string]int{}, faults: map[string]int{},
		leases:  map[string]*activityCount{activities.NameCreateLease: {}, activities.NameAcquireFreshLease: {}},
		perHost: map[string]int{}, kills: w.kills}
	if err := r.countLeaks(w.servers); err != nil {
		return nil, err
	}
	var faultLog []faultproxy.Event
	var history []localsandbox.ProcessRecord
	for i, proxy := range w.proxies {
		faultLog = append(faultLog, proxy.Log()...)
		history = append(history, w.servers[i].History()...)
	}
	for _, e := range faultLog {
		r.faults[e.Rule]++
	}
	ranBy := runsByMarker(history)
	for _, o := range outcomes {
		r.classify(o)
		if len(w.hosts) > 0 && o.err == nil {
			r.perHost[o.result.LeaseHost]++
			r.lostLeases += len(o.result.LostLeases)
		}
		if o.run == nil {
			continue
		}
		h, err := readHistory(ctx, w.stack, o)
		if err != nil {
			return nil, err
		}
		r.compensations += h.leases[activities.NameAcquireFreshLease].scheduled
		for name, c := range h.leases {
			r.leases[name].add(c)
		}
		if ran := ranBy[o.marker]; len(ran) > 1 {
			r.duplicates++
			r.explain(o, ran, h, faultLog)
		}
	}
	return r, nil
}

// countLeaks waits a little for the servers to settle (every run has
// ended, but the last kills may still be confirming), then counts what is
// left.
func (r *report) countLeaks(servers []*localsandbox.Server) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.leakedLeases, r.orphans = 0, 0
		for _, srv := range servers {
			stats, err := srv.Stats()
			if err != nil {
				return err
			}
			pids, err := localsandbox.SandboxProcesses(srv.Root())
			if err != nil {
				return err
			}
			r.leakedLeases += stats.Leases
			r.orphans += max(stats.Processes, len(pids))
		}
		if (r.leakedLeases == 0 && r.orphans == 0) || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// classify sorts a run by its outcome.
func (r *report) classify(o *outcome) {
	if o.err == nil {
		r.succeeded++
		if o.result.Stdout != o.expected || o.result.ExitCode != 0 {
			r.wrongOutput = append(r.wrongOutput, fmt.Sprintf("%s: exit %d signal %q stdout %q", o.marker, o.result.ExitCode, o.result.Signal, o.result.Stdout))
		}
		return
	}
	var appErr *temporal.ApplicationError
	if errors.As(o.err, &appErr) && typedErrors[appErr.Type()] {
		r.typed[appErr.Type()]++
		r.typedDetails = append(r.typedDetails, fmt.Sprintf("%s: %v", o.marker, o.err))
		return
	}
	r.lost = append(r.lost, fmt.Sprintf("%s: %v", o.marker, o.err))
}

// markerPattern finds a run's marker in the script of its processes.
var markerPattern = regexp.MustCompile(`echo (RAN-[A-Z2-7]{16});`)

// runsByMarker returns, for each marker, the records of the processes that
// really ran the command (they printed the marker), oldest first.
func runsByMarker(records []localsandbox.ProcessRecord) map[string][]localsandbox.ProcessRecord {
	out := map[string][]localsandbox.ProcessRecord{}
	for _, rec := range records {
		if rec.Exec {
			continue
		}
		m := markerPattern.FindStringSubmatch(strings.Join(rec.Argv, " "))
		if m != nil && bytes.HasPrefix(rec.Stdout, []byte(m[1]+"\n")) {
			out[m[1]] = append(out[m[1]], rec)
		}
	}
	for _, recs := range out {
		slices.SortFunc(recs, func(a, b localsandbox.ProcessRecord) int { return a.Start.Compare(b.Start) })
	}
	return out
}

// activityCount counts activities of one kind: scheduled, completed
// (after any number of attempts), and how the others ended.
type activityCount struct {
	scheduled, completed int
	failed               map[string]int // by failure type, "timeout" for a timeout
}

func (c *activityCount) fail(how string) {
	if c.failed == nil {
		c.failed = map[string]int{}
	}
	c.failed[how]++
}

func (c *activityCount) add(o *activityCount) {
	c.scheduled += o.scheduled
	c.completed += o.completed
	for how, n := range o.failed {
		for range n {
			c.fail(how)
		}
	}
}

// rate renders completed/scheduled and the failures.
func (c *activityCount) rate() string {
	if c.scheduled == 0 {
		return "none"
	}
	return fmt.Sprintf("%d/%d (%.0f%%)%s", c.completed, c.scheduled, 100*float64(c.completed)/float64(c.scheduled), breakdown(c.failed))
}

// runHistory is what a workflow's history tells of its compensations.
type runHistory struct {
	// leases counts its CreateLease and AcquireFreshLease activities.
	leases map[string]*activityCount
	// killUnconfirmed holds the leases on which an Execute could not
	// confirm the kill of its command's process.
	killUnconfirmed map[string]bool
	// leaseVanished is set when an Execute found its lease gone.
	leaseVanished bool
	// hostLost is set when an activity on a lease timed out waiting for
	// its host (on a fleet).
	hostLost bool
}

func readHistory(ctx context.Context, s *stack.Stack, o *outcome) (runHistory, error) {
	h := runHistory{killUnconfirmed: map[string]bool{},
		leases: map[string]*activityCount{activities.NameCreateLease: {}, activities.NameAcquireFreshLease: {}}}
	names := map[int64]string{}
	it := s.Client.GetWorkflowHistory(ctx, o.run.GetID(), o.run.GetRunID(), false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		event, err := it.Next()
		if err != nil {
			return h, fmt.Errorf("history of %s: %w", o.run.GetID(), err)
		}
		if a := event.GetActivityTaskScheduledEventAttributes(); a != nil {
			names[event.GetEventId()] = a.GetActivityType().GetName()
			if c := h.leases[a.GetActivityType().GetName()]; c != nil {
				c.scheduled++
			}
		}
		if a := event.GetActivityTaskCompletedEventAttributes(); a != nil {
			if c := h.leases[names[a.GetScheduledEventId()]]; c != nil {
				c.completed++
			}
		}
		if a := event.GetActivityTaskTimedOutEventAttributes(); a != nil {
			if c := h.leases[names[a.GetScheduledEventId()]]; c != nil {
				c.fail("timeout")
			}
			if a.GetFailure().GetTimeoutFailureInfo().GetTimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START {
				h.hostLost = true
			}
		}
		a := event.GetActivityTaskFailedEventAttributes()
		if a != nil {
			if c := h.leases[names[a.GetScheduledEventId()]]; c != nil {
				c.fail(a.GetFailure().GetApplicationFailureInfo().GetType())
			}
		}
		if a == nil || names[a.GetScheduledEventId()] != activities.NameExecute {
			continue
		}
		info := a.GetFailure().GetApplicationFailureInfo()
		switch info.GetType() {
		case sandbox.TypeCleanup:
			var d activities.CleanupDetails
			if err := converter.GetDefaultDataConverter().FromPayloads(info.GetDetails(), &d); err != nil {
				return h, err
			}
			if d.Reason == sandbox.TerminationUnconfirmed {
				h.killUnconfirmed[d.LeaseID] = true
			}
		case sandbox.TypeLeaseGone:
			h.leaseVanished = true
		}
	}
	return h, nil
}

// explain classifies each extra run of a command: the run before it was
// on a lease found unusable (then compensation took a fresh one), or on
// the same lease after its output connection was exhausted (four
// connects lost in a row, then the Execute retry started it again).
func (r *report) explain(o *outcome, ran []localsandbox.ProcessRecord, h runHistory, faultLog []faultproxy.Event) {
	for i := 1; i < len(ran); i++ {
		before, again := ran[i-1], ran[i]
		class := extraUnexplained
		switch {
		case before.LeaseID != again.LeaseID && h.killUnconfirmed[before.LeaseID]:
			class = extraUnconfirmedKill
		case before.LeaseID != again.LeaseID && h.leaseVanished:
			class = extraVanishedLease
		case before.LeaseID != again.LeaseID && h.hostLost:
			class = extraHostLost
		case before.LeaseID == again.LeaseID && connectFaults(faultLog, before.ProcessID) >= 4:
			class = extraExhaustion
		}
		r.extra[class]++
		if class == extraUnexplained {
			r.unexplained = append(r.unexplained, fmt.Sprintf("%s (%s): ran again as %s/%s after %s/%s",
				o.marker, o.run.GetID(), again.LeaseID, again.ProcessID, before.LeaseID, before.ProcessID))
		}
	}
}

// connectFaults counts the faults injected into the output streams of a
// process.
func connectFaults(log []faultproxy.Event, pid string) int {
	n := 0
	for _, e := range log {
		if strings.HasSuffix(e.Path, "/processes/"+pid+"/connect") {
			n++
		}
	}
	return n
}

// print writes the report as markdown.
func (r *report) print(w io.Writer, cfg config) {
	fmt.Fprintf(w, "## Chaos soak: %d runs, fault rate %.2f, concurrency %d, seed %d", r.runs, cfg.rate, cfg.concurrency, cfg.seed)
	if cfg.hosts > 0 {
		fmt.Fprintf(w, ", %d hosts of %d leases", cfg.hosts, cfg.capacity)
		if cfg.killEvery > 0 {
			fmt.Fprintf(w, ", one at a time killed for %s, %s after the last came back", hostDown, cfg.killEvery)
		}
	}
	fmt.Fprint(w, "\n\n")
	fmt.Fprintln(w, "| | |")
	fmt.Fprintln(w, "|---|---|")
	fmt.Fprintf(w, "| runs | %d |\n", r.runs)
	fmt.Fprintf(w, "| succeeded | %d |\n", r.succeeded)
	fmt.Fprintf(w, "| typed failures | %d%s |\n", sum(r.typed), breakdown(r.typed))
	fmt.Fprintf(w, "| fresh leases (compensations, sum of FreshLeases) | %d |\n", r.compensations)
	first, fresh := r.leases[activities.NameCreateLease], r.leases[activities.NameAcquireFreshLease]
	fmt.Fprintf(w, "| first creates that succeeded (CreateLease) | %s |\n", first.rate())
	fmt.Fprintf(w, "| fresh leases that succeeded (AcquireFreshLease) | %s |\n", fresh.rate())
	fmt.Fprintf(w, "| leaked leases | %d |\n", r.leakedLeases)
	fmt.Fprintf(w, "| orphan processes | %d |\n", r.orphans)
	fmt.Fprintf(w, "| duplicate executions | %d commands, %d extra runs%s |\n", r.duplicates, sum(r.extra), breakdown(r.extra))
	fmt.Fprintf(w, "| lost results | %d |\n", len(r.lost))
	fmt.Fprintf(w, "| wrong output | %d |\n", len(r.wrongOutput))
	fmt.Fprintf(w, "| faults injected | %d%s |\n", sum(r.faults), breakdown(r.faults))
	if len(r.perHost) > 0 {
		fmt.Fprintf(w, "| runs that succeeded, by the host they ended on | %s |\n", strings.TrimPrefix(breakdown(r.perHost), " "))
		fmt.Fprintf(w, "| hosts killed | %d |\n", r.kills)
		fmt.Fprintf(w, "| leases given up with a lost host (LostLeases) | %d |\n", r.lostLeases)
	}
	fmt.Fprintf(w, "| wall time | %s |\n", r.wall.Round(100*time.Millisecond))
	sections := []section{
		{"Lost results", r.lost},
		{"Wrong output", r.wrongOutput},
		{"Unexplained duplicate executions", r.unexplained},
	}
	if cfg.verbose {
		sections = append(sections, section{"Typed failures", r.typedDetails})
	}
	for _, section := range sections {
		if len(section.lines) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### %s\n\n", section.title)
		for _, l := range section.lines {
			fmt.Fprintf(w, "- %s\n", l)
		}
	}
}

// section is a list of runs under a title, after the table.
type section struct {
	title string
	lines []string
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// breakdown renders counts by name: " (a: 2, b: 1)", the largest first.
func breakdown(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	names := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s: %d", n, m[n])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
