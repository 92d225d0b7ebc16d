package localsandbox

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
)

// ProcessRecord is what History remembers of a process that ran: managed
// processes and one-shot execs alike, also after their lease is gone.
type ProcessRecord struct {
	LeaseID   string
	ProcessID string
	// Argv is the command as it was run, cut to its first headBytes (4 KiB)
	// and maxHistoryArgs arguments: an argument cut short ends in
	// "…(+N bytes)", and "…(+N more args)" stands for those left out. History
	// is a test hook: Argv may hold secrets passed on a command line, so it
	// is never logged.
	Argv []string
	// Exec is set for a one-shot exec.
	Exec  bool
	Start time.Time
	// End is when the process's tree was gone; zero while it runs.
	End time.Time
	// ExitCode and Signal are the main process's exit status, once End is set.
	ExitCode int
	Signal   string
	// Stdout is the first 4 KiB of the process's stdout.
	Stdout []byte
}

// history keeps the newest records, at most max.
type history struct {
	mu      sync.Mutex
	max     int
	records []*ProcessRecord
}

// maxHistoryArgs is the most arguments a record keeps of a command line.
const maxHistoryArgs = 64

func (h *history) add(r ProcessRecord) *ProcessRecord {
	r.Argv = boundArgv(r.Argv)
	h.mu.Lock()
	defer h.mu.Unlock()
	rec := &r
	h.records = append(h.records, rec)
	if len(h.records) > h.max {
		h.records[0] = nil
		h.records = h.records[1:]
	}
	return rec
}

func (h *history) remove(r *ProcessRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i := slices.Index(h.records, r); i >= 0 {
		h.records = slices.Delete(h.records, i, i+1)
	}
}

func (h *history) appendStdout(r *ProcessRecord, data []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if room := headBytes - len(r.Stdout); room > 0 {
		r.Stdout = append(r.Stdout, data[:min(room, len(data))]...)
	}
}

func (h *history) finish(r *ProcessRecord, st journal.ExitStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.End = time.Now()
	r.ExitCode, r.Signal = st.Code, st.Signal
}

func (h *history) snapshot() []ProcessRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]ProcessRecord, len(h.records))
	for i, r := range h.records {
		out[i] = *r
		out[i].Argv = slices.Clone(r.Argv)
		out[i].Stdout = slices.Clone(r.Stdout)
	}
	return out
}

// boundArgv is what a record keeps of argv: at most headBytes of its text in
// at most maxHistoryArgs arguments, copied, so that a record never holds on
// to a request's command line.
func boundArgv(argv []string) []string {
	out := make([]string, 0, min(len(argv), maxHistoryArgs+1))
	room := headBytes
	for i, a := range argv {
		cut := i
		switch {
		case i == maxHistoryArgs:
		case len(a) > room:
			out = append(out, clip(a, room))
			cut++
		default:
			out = append(out, strings.Clone(a))
			room -= len(a)
			continue
		}
		if rest := len(argv) - cut; rest > 0 {
			out = append(out, fmt.Sprintf("…(+%d more args)", rest))
		}
		break
	}
	return out
}
