package leaseinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/confine"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
)

// The lease init: pid 1 of a lease.
//
// The server executes the init program as argv = [Arg0, root,
// LeaseArg] in fresh user, mount, PID, UTS, IPC and network namespaces
// (package machine, machine.go). Before it runs anything of the lease it
//
//   - is in a session of its own, without a controlling terminal (the
//     server starts it with setsid), and sees no host /dev/tty or
//     /dev/console: /dev is built from scratch (rootfs.go);
//   - marks every descriptor but 0, 1, 2 close-on-exec (close_range with
//     CLOSE_RANGE_CLOEXEC), its control socket (3) included, so that no
//     command inherits one; the server passes it nothing else. (It cannot
//     close them outright: by the time this runs the Go runtime may hold
//     descriptors of its own, such as its epoll instance.)
//   - makes itself non-dumpable, so that a command cannot read its memory
//     or descriptors through ptrace, /proc/1/fd or pidfd_getfd — provided
//     the command lacks CAP_SYS_PTRACE in the lease's user namespace, which
//     is confine's business (see confineChild);
//   - builds the lease's root file system (rootfs.go) and its loopback.
//
// Then it serves the server's requests: it forks each command inside the
// namespaces, reaps every process (orphans come to pid 1), reports an
// exec's exit on that exec's status pipe, and signals or kills a command's
// tree on request. It never exits on its own: the server kills it (and the
// kernel thereby every process of the lease) when the sandbox is destroyed,
// and it dies with the server (parent-death signal).

// machineCtlFD is the init's end of the control socket.
const machineCtlFD = 3

func runLeaseInit() int {
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	unix.CloseRange(machineCtlFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	unix.Setsid() // already a session leader when the server started it so
	ctl := machineCtlFD
	reply := func(r Reply) {
		b, _ := json.Marshal(r)
		unix.Sendmsg(ctl, b, nil, nil, 0)
	}

	buf := make([]byte, MaxRequestBytes)
	oob := make([]byte, unix.CmsgSpace(4*MaxRequestFDs))
	msg, fds, err := recvRequest(ctl, buf, oob)
	if err != nil {
		return 1 // the server is gone
	}
	var cfg Config
	if err := json.Unmarshal(msg, &cfg); err != nil {
		reply(Reply{Failure: "reading the configuration: " + err.Error()})
		return 1
	}
	err = buildRoot(&cfg, fds)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err == nil {
		err = applyRlimits(cfg.MaxProcs, cfg.MaxOpenFiles)
	}
	if err == nil {
		err = confineChild()
	}
	if err != nil {
		reply(Reply{Failure: err.Error()})
		return 1
	}

	// Signals from inside the lease reach pid 1 only where it handles them,
	// and the Go runtime handles every signal: catch (and drop) each one
	// whose handling would end the lease, the runtime's crash signals
	// (SIGSEGV, SIGABRT … sent by kill are not faults) among them. A caught
	// signal is reset to its default in the commands at exec.
	drop := make(chan os.Signal, 16)
	signal.Notify(drop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM,
		syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGILL, syscall.SIGABRT,
		syscall.SIGTRAP, syscall.SIGSYS, syscall.SIGPIPE, syscall.SIGXCPU, syscall.SIGXFSZ,
		syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGSTKFLT, syscall.SIGPWR)
	go func() {
		for range drop {
		}
	}()

	in := &leaseInit{cfg: &cfg, cmds: make(map[uint64]*initCmd), byPID: make(map[int]*initCmd), forked: make(chan struct{}, 1)}
	go in.reap()
	reply(Reply{Ready: true})
	for {
		msg, fds, err := recvRequest(ctl, buf, oob)
		if err != nil {
			return 0 // the server closed its end: the lease is over
		}
		var req Request
		if json.Unmarshal(msg, &req) != nil {
			closeAll(fds)
			continue
		}
		in.handle(&req, fds)
	}
}

// confineChild is where the lease's confinement is applied, once its root
// file system is built and before any command runs. It runs in the init
// itself: Go cannot run code between fork and exec, and no_new_privs, the
// capability bounding set and the seccomp filter (package confine) are all
// inherited by every process the init forks. confine.Apply locks this
// goroutine to its OS thread, whose capabilities are the ones a fork
// inherits; the init forks every command from this same goroutine (the
// request loop in runLeaseInit).
//
// The init is confined as well, which it can afford: what it does from now
// on (fork, exec, wait4, kill, reads and writes on its pipes) is allowed. A
// command cannot reach it: it is non-dumpable and nobody in the lease holds
// CAP_SYS_PTRACE, and ptrace, pidfd_getfd and process_vm_* are refused.
func confineChild() error { return confine.Apply(confine.Policy{}) }

// recvRequest reads one message and the descriptors attached to it
// (received close-on-exec).
func recvRequest(ctl int, buf, oob []byte) ([]byte, []int, error) {
	for {
		n, oobn, flags, _, err := unix.Recvmsg(ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if n == 0 && oobn == 0 {
			return nil, nil, errors.New("end of file")
		}
		var fds []int
		if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, c := range cmsgs {
				if got, err := unix.ParseUnixRights(&c); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			closeAll(fds)
			continue // not from our server: it never sends so much
		}
		return buf[:n], fds, nil
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// leaseInit is the init's table of the commands it started.
type leaseInit struct {
	cfg *Config

	mu    sync.Mutex // held across fork and registration, so reap finds every child
	cmds  map[uint64]*initCmd
	byPID map[int]*initCmd

	forked chan struct{} // a fork happened: wakes reap when it had no child
}

// initCmd is a command the init started: an exec or the supervisor of a
// managed process.
type initCmd struct {
	id     uint64
	kind   string
	pid    int
	status *os.File // an exec's status pipe, until its exit is reported
}

func (in *leaseInit) handle(req *Request, fds []int) {
	switch req.Op {
	case "spawn":
		in.spawn(req, fds)
	case "signal", "kill":
		closeAll(fds)
		in.mu.Lock()
		c := in.cmds[req.ID]
		in.mu.Unlock()
		if c == nil {
			return
		}
		switch {
		case req.Op == "signal" && c.kind == KindExec:
			syscall.Kill(-c.pid, syscall.Signal(req.Signal))
		case req.Op == "signal":
			syscall.Kill(c.pid, syscall.Signal(req.Signal)) // the supervisor forwards it
		case c.kind == KindExec:
			syscall.Kill(-c.pid, syscall.SIGKILL)
		default:
			// The supervisor's tree holds every descendant (it is their
			// subreaper): stop them all, then kill them.
			roots := []int{c.pid}
			proctree.Freeze(roots, KillConfirmTimeout/10)
			proctree.Signal(roots, syscall.SIGKILL)
		}
	default:
		closeAll(fds)
	}
}

// spawn starts a command with fds = stdin, stdout, stderr, status.
func (in *leaseInit) spawn(req *Request, fds []int) {
	if len(fds) != 4 {
		closeAll(fds)
		return
	}
	status := os.NewFile(uintptr(fds[3]), "status")
	report := func(m Status) { status.Write(m.Encode()) }
	defer func() {
		for _, fd := range fds[:3] {
			unix.Close(fd)
		}
	}()
	if len(req.Argv) == 0 {
		report(Status{Failure: "no command", FailureKind: FailSetup})
		status.Close()
		return
	}

	var (
		path  string
		argv  []string
		attr  = &syscall.ProcAttr{Env: req.Env}
		files = []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])}
	)
	var configW *os.File
	switch req.Kind {
	case KindExec:
		if err := checkDir(req.Cwd); err != nil {
			report(Status{Failure: fmt.Sprintf("working directory %s: %v", req.Cwd, err), FailureKind: FailCwd})
			status.Close()
			return
		}
		p, err := lookPathIn(req.Argv[0], req.Cwd, req.Env)
		if err != nil {
			report(Status{Failure: err.Error(), FailureKind: FailCommand})
			status.Close()
			return
		}
		path, argv = p, req.Argv
		attr.Dir = req.Cwd
		attr.Sys = &syscall.SysProcAttr{Setpgid: true}
	case KindProcess:
		// The supervisor is the init program again (the init's own
		// executable), in subreaper mode, inside the lease; it reports on
		// the status pipe itself.
		configR, w, err := os.Pipe()
		if err != nil {
			report(Status{Failure: err.Error(), FailureKind: FailSetup})
			status.Close()
			return
		}
		defer configR.Close()
		configW = w
		path, argv = "/proc/self/exe", []string{Arg0, in.cfg.Root}
		attr.Env = []string{"GORACE=atexit_sleep_ms=0"}
		files = append(files, configR.Fd(), status.Fd())
	default:
		status.Close()
		return
	}
	attr.Files = files

	in.mu.Lock()
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		in.mu.Unlock()
		if configW != nil {
			configW.Close()
		}
		report(Status{Failure: fmt.Sprintf("%s: %v", req.Argv[0], err), FailureKind: FailCommand})
		status.Close()
		return
	}
	c := &initCmd{id: req.ID, kind: req.Kind, pid: pid}
	in.cmds[c.id] = c
	in.byPID[pid] = c
	if req.Kind == KindExec {
		// Before reap, which waits for the lock, can report its exit.
		c.status = status
		report(Status{Started: true, Pid: pid})
	}
	in.mu.Unlock()
	select {
	case in.forked <- struct{}{}:
	default:
	}

	if req.Kind == KindExec {
		return
	}
	status.Close() // the supervisor has it
	cfg := SupervisorConfig{Argv: req.Argv, Cwd: req.Cwd, Env: req.Env, WorkspacePath: Workspace, Terminal: req.Terminal}
	go func() {
		json.NewEncoder(configW).Encode(cfg)
		configW.Close()
	}()
}

// reap waits for every process that comes to pid 1, and reports the exit
// of an exec to its status pipe.
func (in *leaseInit) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.ECHILD {
			<-in.forked // no child at all: wait for the next fork
			continue
		}
		if err != nil {
			return
		}
		in.mu.Lock()
		c := in.byPID[pid]
		if c != nil {
			delete(in.byPID, pid)
			delete(in.cmds, c.id)
		}
		in.mu.Unlock()
		if c == nil || c.status == nil {
			continue
		}
		m := Status{Exited: true, ExitCode: ws.ExitStatus()}
		if ws.Signaled() {
			m = Status{Exited: true, Signal: unix.SignalName(ws.Signal())}
		}
		b, _ := json.Marshal(m)
		c.status.Write(append(b, '\n'))
		c.status.Close()
	}
}

// checkDir reports why dir cannot be a working directory.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return unwrapPathError(err)
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	return nil
}

// lookPathIn finds a command the way execvp in cwd would.
func lookPathIn(name, cwd string, env []string) (string, error) {
	if !path.IsAbs(name) && strings.Contains(name, "/") {
		p, err := lookPath(path.Join(cwd, name), env)
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, errors.Unwrap(err))
		}
		return p, nil
	}
	return lookPath(name, env)
}
