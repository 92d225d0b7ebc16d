package sandbox

import "time"

// Result is how a command ended and the tail of what it printed.
type Result struct {
	// ProcessID is the server's id of the process that ran the command.
	ProcessID string `json:"processId,omitempty"`
	// ExitCode is the exit status when the command exited on its own. It is
	// zero when Signal is set.
	ExitCode int `json:"exitCode"`
	// Signal names the signal that ended the command ("SIGKILL"), if any.
	Signal string `json:"signal,omitempty"`
	// TimedOut is set when the command ran out of time and was killed.
	TimedOut bool `json:"timedOut,omitempty"`
	// Stdout and Stderr hold the last bytes of each stream, decoded as UTF-8
	// (invalid sequences become U+FFFD).
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
	// StdoutStart and StderrStart are the offsets in each stream of the
	// first byte of Stdout and of Stderr: how much output came before the
	// tail kept (0 when the whole stream is kept). They count bytes of
	// decoded text, as the Chunks delivered to an Observer hold it, so a
	// tail joins exactly to the output an observer has shown already.
	StdoutStart int64 `json:"stdoutStart,omitempty"`
	StderrStart int64 `json:"stderrStart,omitempty"`
	// Truncated is set when Stdout or Stderr holds only a tail of the
	// stream, or when output was lost before it could be read.
	Truncated bool `json:"truncated,omitempty"`
	// Starts is how many times the command was started: the processes
	// created for it and recorded in Temporal, across Execute's attempts
	// and the fresh leases of compensation: 1, unless the command had to
	// run again on a fresh lease (a kill that could not be confirmed, a
	// lease that vanished, a lost host: docs/RELIABILITY.md, "Exactly
	// once"). Set by the activities and the workflows, not by a Provider.
	Starts int `json:"starts,omitempty"`
}

// ShellExitCode is the status a shell would report for the command: the
// exit code, 124 for a timeout (as timeout(1) does) and 128+n for signal n.
func (r Result) ShellExitCode() int {
	switch {
	case r.TimedOut:
		return 124
	case r.Signal != "":
		return 128 + SignalNumber(r.Signal)
	default:
		return r.ExitCode
	}
}

// Succeeded reports whether the command exited with status zero.
func (r Result) Succeeded() bool { return !r.TimedOut && r.Signal == "" && r.ExitCode == 0 }

// Process identifies a command started by Execute: enough to attach to it
// again after the caller died.
type Process struct {
	// ID is the server's process id.
	ID string `json:"id"`
	// Token opens the run's start gate and names the files staged in the
	// lease for it (its stdin), so that a later Attach can open the gate and
	// remove them.
	Token string `json:"token,omitempty"`
	// Deadline is when the command's timeout expires; zero means none.
	Deadline time.Time `json:"deadline,omitzero"`
}

// Stream names an output stream.
type Stream string

// The two output streams of a process.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Chunk is a piece of live output.
type Chunk struct {
	// Seq is the server's sequence number of the frame the chunk came from;
	// it counts 1, 2, 3… per process across both streams.
	Seq int64
	// Stream says where the bytes were written.
	Stream Stream
	// Text is the decoded output. A character split across frames is
	// delivered whole with the later frame, so Text may be empty.
	Text string
	// Bytes is the number of raw bytes the frame carried.
	Bytes int
}

// Observer learns what happens to a running command. Its methods are called
// in order from one goroutine and must return promptly.
type Observer interface {
	// Started reports the process as soon as the server has created it,
	// before the command can run: the command is held back until Started
	// returns, so that whoever must be able to find the process again (a
	// retry that re-attaches) knows it first. An error stops the run before
	// the command can start: the process is killed and the run fails with
	// that error (or, if the kill is not confirmed, a *CleanupError).
	Started(Process) error
	// Output receives output as it arrives. A replayed frame is never
	// delivered twice.
	Output(Chunk)
}

// linuxSignals numbers the signals of Linux on x86 and arm, where sandboxes
// run, whatever system the client itself runs on.
var linuxSignals = map[string]int{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12,
	"SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15, "SIGSTKFLT": 16, "SIGCHLD": 17,
	"SIGCONT": 18, "SIGSTOP": 19, "SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22,
	"SIGURG": 23, "SIGXCPU": 24, "SIGXFSZ": 25, "SIGVTALRM": 26, "SIGPROF": 27,
	"SIGWINCH": 28, "SIGIO": 29, "SIGPWR": 30, "SIGSYS": 31,
}

// SignalNumber returns the Linux number of a signal name such as "SIGKILL",
// or 0 when the name is unknown.
func SignalNumber(name string) int { return linuxSignals[name] }
