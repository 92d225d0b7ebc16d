package starter

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// livePollInterval is how often the starter asks Temporal for the running
// command's output. What it finds is as fresh as Execute's last heartbeat:
// Execute asks for one as soon as output arrives, but the worker's SDK holds
// heartbeats back for up to its MaxHeartbeatThrottleInterval (2 s on
// sandboxflow's worker), so live output lags the command by up to a few
// seconds.
const livePollInterval = 500 * time.Millisecond

// livePrinter prints a running command's output as Execute's heartbeats
// carry it (activities.ExecuteProgress, on the workflow's pending Execute
// activity), and then what is left of it from the final Result, each byte
// once and in order.
//
//	p := newLivePrinter(stdio, dataConverter)
//	p.poll(ctx, c, workflowID, runID) // while the workflow runs
//	p.finish(result)                  // when it has ended
type livePrinter struct {
	stdio IO
	dc    converter.DataConverter
	// activity is the Execute activity whose output is printed (workflow
	// run and activity id); a new one means the command runs anew.
	activity string
	// ignore is an activity whose output an earlier printer printed.
	ignore string
	out    [2]printedStream // stdout, stderr
	// beforePrint, if not nil, is called before live output is printed
	// (to clear the progress line).
	beforePrint func()
}

// printedStream is how much of one stream the starter has printed.
type printedStream struct {
	w io.Writer
	// upTo is the stream offset printed up to.
	upTo int64
	// tail is the end of what was printed, at most twice
	// activities.LiveTailBytes, to join the final Result's tail to it.
	tail string
}

func newLivePrinter(stdio IO, dc converter.DataConverter) *livePrinter {
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	return &livePrinter{stdio: stdio, dc: dc, out: [2]printedStream{{w: stdio.Stdout}, {w: stdio.Stderr}}}
}

// poll asks Temporal once for the workflow's pending Execute activity and
// prints the output its heartbeat carries that is not printed yet. runID
// "" means the workflow's latest run (a session continues as new). It
// reports whether it printed anything. Failures are ignored: the next poll
// or the final Result catches up.
func (p *livePrinter) poll(ctx context.Context, c client.Client, workflowID, runID string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := c.DescribeWorkflowExecution(ctx, workflowID, runID)
	if err != nil {
		return false
	}
	printed := false
	for _, pa := range resp.GetPendingActivities() {
		if pa.GetActivityType().GetName() != activities.NameExecute || pa.GetHeartbeatDetails() == nil {
			continue
		}
		var progress activities.ExecuteProgress
		if p.dc.FromPayloads(pa.GetHeartbeatDetails(), &progress) != nil {
			continue
		}
		key := resp.GetWorkflowExecutionInfo().GetExecution().GetRunId() + "/" + pa.GetActivityId()
		if key == p.ignore {
			continue
		}
		if p.beforePrint != nil && p.adds(key, progress) {
			p.beforePrint()
		}
		printed = p.show(key, progress) || printed
	}
	return printed
}

// adds reports whether show would print anything.
func (p *livePrinter) adds(key string, progress activities.ExecuteProgress) bool {
	if key != p.activity {
		return progress.Stdout.End > 0 || progress.Stderr.End > 0
	}
	return progress.Stdout.End > p.out[0].upTo || progress.Stderr.End > p.out[1].upTo
}

// show prints what progress, recorded by the activity key, adds.
func (p *livePrinter) show(key string, progress activities.ExecuteProgress) bool {
	if key != p.activity {
		if p.activity != "" && (p.out[0].upTo > 0 || p.out[1].upTo > 0) {
			fmt.Fprintln(p.stdio.Stderr, "[… the command runs anew; its output starts again]")
		}
		p.activity = key
		p.out[0].upTo, p.out[0].tail = 0, ""
		p.out[1].upTo, p.out[1].tail = 0, ""
	}
	a := p.out[0].live(progress.Stdout, p.stdio.Stderr)
	b := p.out[1].live(progress.Stderr, p.stdio.Stderr)
	return a || b
}

// live prints what tail adds to the stream, and a notice on notices when
// it skips output that no heartbeat carried.
func (s *printedStream) live(tail activities.OutputTail, notices io.Writer) bool {
	if tail.End <= s.upTo {
		return false
	}
	text := tail.Text
	if start := tail.Start(); start > s.upTo {
		fmt.Fprintf(notices, "[… %d bytes skipped]\n", start-s.upTo)
	} else {
		text = text[s.upTo-start:]
	}
	s.write(text)
	s.upTo = tail.End
	return true
}

func (s *printedStream) write(text string) {
	io.WriteString(s.w, text)
	s.tail += text
	if keep := 2 * activities.LiveTailBytes; len(s.tail) > keep {
		s.tail = s.tail[len(s.tail)-keep:]
	}
}

// finish prints what the final Result holds of the output that was not
// printed live, and returns the activity it followed, for the next
// command's printer to ignore.
func (p *livePrinter) finish(res sandbox.Result) (followed string) {
	p.out[0].rest(res.Stdout, res.Truncated, p.stdio.Stderr)
	p.out[1].rest(res.Stderr, res.Truncated, p.stdio.Stderr)
	return p.activity
}

// rest prints the part of final, the end of the stream, that follows what
// was printed. An untruncated final is the whole stream, so the offset
// says where; a truncated one is joined where what was printed ends and
// final begins alike (the longest such overlap), and when they do not
// overlap the output between them is lost, which a notice says.
func (s *printedStream) rest(final string, truncated bool, notices io.Writer) {
	switch {
	case s.upTo == 0:
		s.write(final)
	case !truncated && int64(len(final)) >= s.upTo:
		s.write(final[s.upTo:])
	default:
		k := overlap(s.tail, final)
		if k == 0 && final != "" {
			fmt.Fprintln(notices, "[… output skipped]")
		}
		s.write(final[k:])
	}
}

// overlap returns the length of the longest suffix of printed that is a
// prefix of final.
func overlap(printed, final string) int {
	for k := min(len(printed), len(final)); k > 0; k-- {
		if strings.HasSuffix(printed, final[:k]) {
			return k
		}
	}
	return 0
}

// follow polls the session's latest run for live's command until the
// returned stop is called; stop returns once live no longer prints. A nil
// live follows nothing.
func follow(ctx context.Context, c client.Client, workflowID string, live *livePrinter) (stop func()) {
	if live == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		ticker := time.NewTicker(livePollInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				live.poll(ctx, c, workflowID, "")
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
