package localsandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
	"golang.org/x/sys/unix"
)

// The init hook and the supervisor.
//
// The server re-executes its own binary (/proc/self/exe) with argv[0] set
// to initArg0, and the package-level init function below takes over that
// process before main (or the test runner) ever runs. Two kinds of process
// start that way:
//
//   - a lease init (argv[2] == leaseInitArg, machine_init.go): pid 1 of a
//     lease's namespaces, for the life of the sandbox;
//   - a supervisor (this file): the parent of one managed process, a child
//     subreaper, so that orphans of the command's tree come back to it. It
//     forwards termination signals to every process of its tree, reaps them,
//     reports the command's exit at once but exits only when none is left,
//     so "the supervisor is gone" means "the whole tree has exited". In
//     namespace mode the lease init forks it inside the lease; in
//     process-group mode the server starts it on the host.
//
// The hook does nothing in any other process: a program that links this
// package (sandboxd, a test binary) behaves normally unless it was started
// with that exact argv[0].

// initArg0 marks an init process. argv[1] is the server's root directory, so
// that a server restarted on the same root can find the inits a crashed
// predecessor left behind (see sweep.go).
const initArg0 = "sandboxflow-init"

// The supervisor's file descriptors, as the server or the lease init
// arranges them.
const (
	initConfigFD = 3 // read: the JSON initConfig, then EOF
	initStatusFD = 4 // write: initMessage lines
)

// initConfig is what the server tells a supervisor to do.
type initConfig struct {
	Argv []string `json:"argv"`
	Cwd  string   `json:"cwd"` // absolute, as the command sees the file system
	Env  []string `json:"env"`
	// WorkspacePath is where relative working directories start.
	WorkspacePath string `json:"workspace_path"`
	MaxProcs      uint64 `json:"max_procs,omitempty"`
	MaxOpenFiles  uint64 `json:"max_open_files,omitempty"`
}

// initMessage is one line the init writes on its status descriptor: first
// Started or a Failure, later the command's exit status.
type initMessage struct {
	Started bool `json:"started,omitempty"`
	// Pid is the started command's, as its supervisor sees it.
	Pid int `json:"pid,omitempty"`
	// Failure says why the command could not start; FailureKind is
	// "cwd", "command" (not found / not executable) or "setup".
	Failure     string `json:"failure,omitempty"`
	FailureKind string `json:"failure_kind,omitempty"`
	Exited      bool   `json:"exited,omitempty"`
	ExitCode    int    `json:"exit_code,omitempty"`
	Signal      string `json:"signal,omitempty"`
}

// maxFailureBytes bounds the Failure text of a status message, so that a
// failure quoting a long command line (or path) still fits in
// maxStatusLine however JSON escapes it (at most 6 bytes a byte).
const maxFailureBytes = 512

// encode returns m as one status line, its Failure clipped.
func (m initMessage) encode() []byte {
	m.Failure = clip(m.Failure, maxFailureBytes)
	b, _ := json.Marshal(m)
	return append(b, '\n')
}

// decodeStatusLine parses one status line (without its newline). A line
// longer than maxStatusLine, or one that is not a message, is not ok: the
// caller treats it as a protocol failure, never as an exit status.
func decodeStatusLine(line []byte) (initMessage, bool) {
	var msg initMessage
	if len(line) > maxStatusLine || json.Unmarshal(line, &msg) != nil {
		return initMessage{}, false
	}
	return msg, true
}

func init() {
	if len(os.Args) < 2 || os.Args[0] != initArg0 {
		return
	}
	if len(os.Args) >= 3 && os.Args[2] == leaseInitArg {
		os.Exit(runLeaseInit())
	}
	os.Exit(runInit())
}

// The init's failure kinds.
const (
	failCwd     = "cwd"
	failCommand = "command"
	failSetup   = "setup"
)

type initFailure struct {
	kind string
	err  error
}

func (f *initFailure) Error() string { return f.err.Error() }

func runInit() int {
	// Nothing may read its memory or descriptors (see runLeaseInit), and
	// the descriptors from the server must not reach the command (which
	// could write a false exit status).
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	unix.CloseRange(initConfigFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	status := os.NewFile(initStatusFD, "status")
	report := func(m initMessage) { status.Write(m.encode()) }
	fail := func(err error) int {
		f := &initFailure{kind: failSetup, err: err}
		errors.As(err, &f)
		report(initMessage{Failure: f.err.Error(), FailureKind: f.kind})
		return 1
	}

	var cfg initConfig
	cfgFile := os.NewFile(initConfigFD, "config")
	if err := json.NewDecoder(cfgFile).Decode(&cfg); err != nil {
		return fail(fmt.Errorf("reading the configuration: %w", err))
	}
	cfgFile.Close()
	if len(cfg.Argv) == 0 {
		return fail(errors.New("no command"))
	}

	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("becoming a subreaper: %w", err))
	}
	if err := applyRlimits(cfg.MaxProcs, cfg.MaxOpenFiles); err != nil {
		return fail(err)
	}
	if err := os.Chdir(cfg.Cwd); err != nil {
		return fail(&initFailure{failCwd, fmt.Errorf("working directory %s: %w", cfg.Cwd, unwrapPathError(err))})
	}
	path, err := lookPath(cfg.Argv[0], cfg.Env)
	if err != nil {
		return fail(&initFailure{failCommand, err})
	}

	// Subscribe before the command exists, so that no signal is lost.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwardedSignals()...)

	attr := &syscall.ProcAttr{Env: cfg.Env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}}
	pid, err := syscall.ForkExec(path, cfg.Argv, attr)
	if err != nil {
		return fail(&initFailure{failCommand, fmt.Errorf("%s: %w", cfg.Argv[0], err)})
	}
	// The command owns its stdio now; the init keeps no copy, so that the
	// server sees end-of-file once the command's tree has closed them.
	if null, err := os.OpenFile("/dev/null", os.O_RDWR, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			unix.Dup3(int(null.Fd()), fd, 0)
		}
		null.Close()
	}
	report(initMessage{Started: true, Pid: pid})

	go forwardSignals(sigs)
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.ECHILD:
			// Nobody is left: the subreaper inherited every orphan.
			return 0
		case err != nil:
			return 1
		}
		if wpid == pid {
			if ws.Signaled() {
				report(initMessage{Exited: true, Signal: unix.SignalName(ws.Signal())})
			} else {
				report(initMessage{Exited: true, ExitCode: ws.ExitStatus()})
			}
		}
	}
}

// forwardedSignals are the signals the supervisor passes on to its tree.
// SIGKILL and SIGSTOP need no forwarding: whoever kills or freezes a tree
// does it to every process of it.
func forwardedSignals() []os.Signal {
	return []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM}
}

func forwardSignals(sigs <-chan os.Signal) {
	for sig := range sigs {
		s := sig.(syscall.Signal)
		if table, err := proctree.Read(); err == nil {
			self := os.Getpid()
			for _, pid := range table.Tree(self) {
				if pid != self {
					syscall.Kill(pid, s)
				}
			}
		}
	}
}

// applyRlimits sets RLIMIT_NPROC and RLIMIT_NOFILE (zero: unchanged) and
// no core dumps, for the calling process and what it starts.
func applyRlimits(maxProcs, maxOpenFiles uint64) error {
	// syscall.Setrlimit (not unix.Setrlimit) so that the Go runtime does not
	// restore its own RLIMIT_NOFILE in the command.
	for _, l := range []struct {
		name     string
		resource int
		value    uint64
	}{
		{"RLIMIT_NPROC", unix.RLIMIT_NPROC, maxProcs},
		{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, maxOpenFiles},
		{"RLIMIT_CORE", unix.RLIMIT_CORE, 0},
	} {
		if l.value == 0 && l.resource != unix.RLIMIT_CORE {
			continue
		}
		if err := syscall.Setrlimit(l.resource, &syscall.Rlimit{Cur: l.value, Max: l.value}); err != nil {
			return fmt.Errorf("setting %s: %w", l.name, err)
		}
	}
	return nil
}

// lookPath finds a command the way execvp would, using the PATH of the
// command's environment.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return name, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		candidate := filepath.Join(dir, name)
		if executable(candidate) == nil {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return unwrapPathError(err)
	}
	if fi.IsDir() {
		return errors.New("is a directory")
	}
	return unix.Access(path, unix.X_OK)
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
