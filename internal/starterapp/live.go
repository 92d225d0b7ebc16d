package starterapp

import (
	"context"
	"fmt"
	"io"
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
//	p.poll(ctx, c, workflowID, runID) // while the command runs
//	p.finish(result, leaseID)         // once its Result is known
type livePrinter struct {
	stdio IO
	dc    converter.DataConverter
	// process is the process whose output is printed (processKey); a new
	// one means the command runs anew.
	process string
	// ignore is a process whose output an earlier printer printed.
	ignore string
	out    [2]printedStream // stdout, stderr
	// build is the template build's log (activities.TemplateProgress),
	// printed on stderr before the command runs.
	build printedStream
	// skipped is set once output was skipped (and a notice said so).
	skipped bool
	// beforePrint, if not nil, is called before live output is printed
	// (to clear the progress line).
	beforePrint func()
}

// printedStream is how much of one stream the starter has printed.
type printedStream struct {
	w io.Writer
	// upTo is the stream offset printed up to.
	upTo int64
}

func newLivePrinter(stdio IO, dc converter.DataConverter) *livePrinter {
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	return &livePrinter{stdio: stdio, dc: dc, out: [2]printedStream{{w: stdio.Stdout}, {w: stdio.Stderr}}, build: printedStream{w: stdio.Stderr}}
}

// processKey names a process's output streams: process ids are the
// server's, unique within a lease.
func processKey(leaseID, processID string) string { return leaseID + "/" + processID }

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
		if pa.GetHeartbeatDetails() == nil {
			continue
		}
		if pa.GetActivityType().GetName() == activities.NameEnsureTemplate {
			var build activities.TemplateProgress
			if p.dc.FromPayloads(pa.GetHeartbeatDetails(), &build) == nil {
				printed = p.showBuild(build) || printed
			}
			continue
		}
		if pa.GetActivityType().GetName() != activities.NameExecute {
			continue
		}
		var progress activities.ExecuteProgress
		if p.dc.FromPayloads(pa.GetHeartbeatDetails(), &progress) != nil || progress.Process.ID == "" {
			continue
		}
		key := processKey(progress.LeaseID, progress.Process.ID)
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
	if key != p.process {
		return progress.Stdout.End > 0 || progress.Stderr.End > 0
	}
	return progress.Stdout.End > p.out[0].upTo || progress.Stderr.End > p.out[1].upTo
}

// showBuild prints on stderr what a template build's heartbeat adds to
// its log.
func (p *livePrinter) showBuild(build activities.TemplateProgress) bool {
	if build.Log.End <= p.build.upTo {
		return false
	}
	if p.beforePrint != nil {
		p.beforePrint()
	}
	return p.printTo(&p.build, build.Log.Text, build.Log.Start())
}

// show prints what progress, recorded of the process key, adds.
func (p *livePrinter) show(key string, progress activities.ExecuteProgress) bool {
	p.follow(key)
	a := p.print(0, progress.Stdout.Text, progress.Stdout.Start())
	b := p.print(1, progress.Stderr.Text, progress.Stderr.Start())
	return a || b
}

// follow makes key the process whose output is printed. When another
// process's output was printed before, the command runs anew (a retry
// started it again): a notice says so, and its output starts again.
func (p *livePrinter) follow(key string) {
	if key == p.process {
		return
	}
	if p.process != "" && (p.out[0].upTo > 0 || p.out[1].upTo > 0) {
		fmt.Fprintln(p.stdio.Stderr, "[… the command runs anew; its output starts again]")
	}
	p.process = key
	p.out[0].upTo, p.out[1].upTo = 0, 0
}

// print prints what text, the part of stream i from offset start, adds
// to what was printed, and a notice when it skips output that was not
// seen. It reports whether it printed anything.
func (p *livePrinter) print(i int, text string, start int64) bool {
	return p.printTo(&p.out[i], text, start)
}

// printTo is print to any stream the printer follows.
func (p *livePrinter) printTo(s *printedStream, text string, start int64) bool {
	end := start + int64(len(text))
	if end <= s.upTo {
		return false
	}
	if start > s.upTo {
		fmt.Fprintf(p.stdio.Stderr, "[… %d bytes skipped]\n", start-s.upTo)
		p.skipped = true
	} else {
		text = text[s.upTo-start:]
	}
	io.WriteString(s.w, text)
	s.upTo = end
	return true
}

// finish prints what the command's final Result (of a process on lease
// leaseID) holds of the output that was not printed live, and returns the
// process it followed, for the next command's printer to ignore. The
// Result says where each tail starts in its stream, so the join is exact.
func (p *livePrinter) finish(res sandbox.Result, leaseID string) (followed string) {
	if res.ProcessID != "" {
		p.follow(processKey(leaseID, res.ProcessID))
	}
	p.print(0, res.Stdout, res.StdoutStart)
	p.print(1, res.Stderr, res.StderrStart)
	return p.process
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
