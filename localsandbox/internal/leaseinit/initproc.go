package leaseinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"unsafe"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
	"golang.org/x/sys/unix"
)

// The init hook and the supervisor.
//
// The server executes the init program (Program, a build of
// cmd/sandboxflow-init, or else its own binary) with argv[0] set to Arg0,
// and the package-level init function below takes over that process
// before main (or the test runner) ever runs. Two kinds of process start
// that way:
//
//   - a lease init (argv[2] == LeaseArg, leaseinit.go): pid 1 of a lease's
//     namespaces, for the life of the sandbox;
//   - the spawner (argv[2] == SpawnerArg, spawner.go): one per server, the
//     parent of its lease inits;
//   - a supervisor (this file): the parent of one managed process, a
//     child subreaper, so that orphans of the command's tree come back to
//     it. It forwards termination signals to every process of its tree,
//     reaps them, reports the command's exit at once but exits only when
//     none is left, so "the supervisor is gone" means "the whole tree has
//     exited". In namespace mode the lease init forks it inside the lease;
//     in process-group mode the server starts it on the host.
//
// The hook does nothing in any other process: a program that links this
// package (sandboxd, a test binary) behaves normally unless it was started
// with that exact argv[0].

// Arg0 marks an init process. argv[1] is the server's root directory, so
// that a server restarted on the same root can find the inits a crashed
// predecessor left behind (localsandbox's sweep.go).
const Arg0 = "sandboxflow-init"

// LeaseArg is argv[2] of a lease init.
const LeaseArg = "lease"

// VersionArg is argv[2] of the handshake: the program prints
// ProtocolVersion and exits, so that a server finds out before its first
// lease whether an init program speaks its protocol.
const VersionArg = "version"

// processName is Arg0 as PR_SET_NAME takes it: NUL-terminated, at most
// 16 bytes with the NUL (the kernel's TASK_COMM_LEN).
var processName = []byte(Arg0[:min(len(Arg0), 15)] + "\x00")

func init() {
	if len(os.Args) < 2 || os.Args[0] != Arg0 {
		return
	}
	// The process's name in ps, which the kernel took from the file
	// executed: "exe" for /proc/self/exe, a number for /proc/self/fd/N.
	// Package inits run on the main thread, whose name is the process's.
	unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&processName[0])), 0, 0, 0)
	// A lease's init and commands have a Linux login's umask, whatever the
	// server's: under an operator's 077, the lease's /dev and everything
	// its commands wrote were its root's alone (apt's _apt could not open
	// /dev/null).
	unix.Umask(0o022)
	if len(os.Args) >= 3 {
		switch os.Args[2] {
		case LeaseArg:
			os.Exit(runLeaseInit())
		case SpawnerArg:
			os.Exit(runSpawner())
		case VersionArg:
			os.Stdout.WriteString(ProtocolVersion + "\n")
			os.Exit(0)
		}
	}
	os.Exit(runSupervisor())
}

// The supervisor's file descriptors, as the server or the lease init
// arranges them.
const (
	initConfigFD = 3 // read: the JSON SupervisorConfig, then EOF
	initStatusFD = 4 // write: Status lines
)

type initFailure struct {
	kind string
	err  error
}

func (f *initFailure) Error() string { return f.err.Error() }

func runSupervisor() int {
	// Nothing may read its memory or descriptors (see runLeaseInit), and
	// the descriptors from the server must not reach the command (which
	// could write a false exit status).
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	unix.CloseRange(initConfigFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	status := os.NewFile(initStatusFD, "status")
	report := func(m Status) { status.Write(m.Encode()) }
	fail := func(err error) int {
		f := &initFailure{kind: FailSetup, err: err}
		errors.As(err, &f)
		report(Status{Failure: f.err.Error(), FailureKind: f.kind})
		return 1
	}

	var cfg SupervisorConfig
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
		return fail(&initFailure{FailCwd, fmt.Errorf("working directory %s: %w", cfg.Cwd, unwrapPathError(err))})
	}
	path, err := lookPath(cfg.Argv[0], cfg.Env)
	if err != nil {
		return fail(&initFailure{FailCommand, err})
	}

	// Subscribe before the command exists, so that no signal is lost.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwardedSignals()...)

	attr := &syscall.ProcAttr{Env: cfg.Env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}}
	master := -1
	if cfg.Terminal != nil {
		// The command's stdio is the terminal, its controlling terminal
		// in a session of its own: job control, ^C and SIGWINCH reach its
		// foreground process group.
		m, slave, err := openTerminal(cfg.Terminal)
		if err != nil {
			return fail(err)
		}
		master = m
		attr.Files = []uintptr{uintptr(slave), uintptr(slave), uintptr(slave)}
		attr.Sys.Setsid, attr.Sys.Setctty, attr.Sys.Ctty = true, true, 0
	}
	pid, err := syscall.ForkExec(path, cfg.Argv, attr)
	if master >= 0 {
		unix.Close(int(attr.Files[0])) // the command holds the slave now
	}
	if err != nil {
		unix.Close(master)
		return fail(&initFailure{FailCommand, fmt.Errorf("%s: %w", cfg.Argv[0], err)})
	}
	// The command owns its stdio now; the init keeps no copy, so that the
	// server sees end-of-file once the command's tree has closed them.
	if null, err := os.OpenFile("/dev/null", os.O_RDWR, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			unix.Dup3(int(null.Fd()), fd, 0)
		}
		null.Close()
	}
	if master >= 0 {
		err := sendTerminal(status, Status{Started: true, Pid: pid}, master)
		unix.Close(master)
		if err != nil {
			// Nobody can reach the command's terminal: end it.
			syscall.Kill(pid, syscall.SIGKILL)
			return fail(fmt.Errorf("sending the terminal: %w", err))
		}
	} else {
		report(Status{Started: true, Pid: pid})
	}

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
				report(Status{Exited: true, Signal: unix.SignalName(ws.Signal())})
			} else {
				report(Status{Exited: true, ExitCode: ws.ExitStatus()})
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
	search := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			search = v
		}
	}
	// filepath.SplitList, without importing path/filepath: its package init
	// runs late, and the init hook waits for everything it imports.
	var dirs []string
	if search != "" {
		dirs = strings.Split(search, string(os.PathListSeparator))
	}
	for _, dir := range dirs {
		if dir == "" {
			dir = "."
		}
		candidate := path.Join(dir, name)
		if executable(candidate) == nil {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

func executable(file string) error {
	fi, err := os.Stat(file)
	if err != nil {
		return unwrapPathError(err)
	}
	if fi.IsDir() {
		return errors.New("is a directory")
	}
	return unix.Access(file, unix.X_OK)
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
