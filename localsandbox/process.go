package localsandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
	"golang.org/x/sys/unix"
)

// process is a managed process: a command under its init, the init's
// namespaces (or subreaper) holding the command's whole tree.
type process struct {
	id      string
	lease   *lease
	oneShot bool // a one-shot exec, not listed under /processes
	// cmd is the supervisor on the host (process-group mode); in namespace
	// mode the command is machineID of the lease's machine instead.
	cmd       *exec.Cmd
	machine   *machine.Machine
	machineID uint64
	// untilExit: the journal is complete at the main process's exit (an
	// exec in a lease, whose background processes may keep its pipes).
	untilExit bool
	journal   *journal.Journal
	record    *ProcessRecord // owned by the server's history; guarded by history.mu

	// What the API shows of it: the command, its working directory, when
	// it started and its pid (in the lease's pid namespace; on the host in
	// process-group mode).
	argv    []string
	cwd     string
	created time.Time
	pid     int

	inputSeq    atomic.Int64 // the writes to its stdin so far
	terminating atomic.Bool  // a DELETE is ending its tree

	// size is the terminal's size as asked at create: a process on a
	// terminal (kind "pty") has one, a process on pipes none.
	size *leaseinit.WinSize

	stdinMu sync.Mutex
	stdin   *os.File // nil once closed; a terminal's master for a pty process
	// terminal is the master of a pty process's terminal, for resize,
	// until the process's tree is gone (the pump reads a copy of its own).
	terminal *os.File

	startCh    chan leaseinit.Status // the init's first message
	mainExited chan struct{}         // closed once the exit status is known
	done       chan struct{}         // closed once the tree is gone and the journal complete

	mu       sync.Mutex
	exit     *journal.ExitStatus
	finished time.Time // when exit was set

	retired bool // filed by lease.retireLocked; guarded by lease.mu
}

// startError is a command that could not start for a reason its caller
// can fix (a missing program or working directory).
type startError struct{ msg string }

func (e *startError) Error() string { return e.msg }

// spawn starts argv in the lease: through its lease init in namespace
// mode, under a new supervisor on the host in process-group mode; with a
// size, on a terminal that the supervisor opens where it runs. It returns
// once the command runs, or a *startError when it could not be started
// because of its argv or cwd.
func (s *Server) spawn(l *lease, argv []string, cwd string, env []string, oneShot bool, size *leaseinit.WinSize) (*process, error) {
	files, err := newInitFiles()
	if err != nil {
		return nil, err
	}
	p := &process{
		lease:      l,
		oneShot:    oneShot,
		argv:       argv,
		cwd:        l.resolveCwd(cwd),
		created:    time.Now(),
		size:       size,
		startCh:    make(chan leaseinit.Status, 1),
		mainExited: make(chan struct{}),
		done:       make(chan struct{}),
	}
	if l.machine != nil {
		kind := leaseinit.KindProcess
		if oneShot {
			kind = leaseinit.KindExec
		}
		p.machine = l.machine
		p.untilExit = oneShot
		fds := []int{int(files.stdinR.Fd()), int(files.stdoutW.Fd()), int(files.stderrW.Fd()), int(files.statusW.Fd())}
		p.machineID, err = l.machine.Spawn(kind, argv, p.cwd, env, size, fds)
		if errors.Is(err, machine.ErrCommandTooLong) {
			err = &startError{err.Error()}
		}
		if err != nil {
			files.closeAll()
			return nil, err
		}
	} else if p.cmd, err = s.startSupervisor(l, argv, cwd, env, size, files); err != nil {
		files.closeAll()
		return nil, err
	}
	files.closeChildEnds() // ours would keep the pipes open

	p.id = newID("proc-")
	p.journal = journal.New(s.opts.JournalBytes, s.opts.StallTimeout)
	p.record = s.history.add(ProcessRecord{LeaseID: l.id, ProcessID: p.id, Argv: argv, Exec: oneShot, Start: time.Now()})
	if size != nil {
		files.stdinW.Close() // the command reads its terminal, never this pipe
	} else {
		p.stdin = files.stdinW
	}
	pumpDone := make(chan struct{})
	s.workers.Add(2)
	go func() {
		defer s.workers.Done()
		defer close(pumpDone)
		p.pump(s, files.stdoutR, files.stderrR, files.statusR)
	}()
	go func() {
		defer s.workers.Done()
		if p.cmd != nil {
			p.cmd.Wait()
		}
		<-pumpDone
		p.finish(s)
	}()

	timer := time.NewTimer(leaseinit.StartTimeout)
	defer timer.Stop()
	var msg leaseinit.Status
	select {
	case msg = <-p.startCh:
	case <-p.done:
		select {
		case msg = <-p.startCh: // it started, and was quick about all of it
		default:
			s.history.remove(p.record)
			return nil, errors.New("the init ended before it started the command")
		}
	case <-timer.C:
		p.kill()
		<-p.done
		s.history.remove(p.record)
		return nil, errors.New("the init did not start the command in time")
	}
	if msg.Started {
		p.pid = msg.Pid
		s.started.Add(1)
		return p, nil
	}
	<-p.done
	s.history.remove(p.record)
	if msg.FailureKind == leaseinit.FailCwd || msg.FailureKind == leaseinit.FailCommand {
		return nil, &startError{msg.Failure}
	}
	return nil, fmt.Errorf("setting up the sandbox: %s", msg.Failure)
}

// startSupervisor starts argv under a new supervisor on the host, for
// process-group mode.
func (s *Server) startSupervisor(l *lease, argv []string, cwd string, env []string, size *leaseinit.WinSize, files *initFiles) (*exec.Cmd, error) {
	cfg := leaseinit.SupervisorConfig{
		Terminal:      size,
		Argv:          argv,
		Cwd:           l.resolveCwd(cwd),
		Env:           env,
		WorkspacePath: l.workspaceHost,
		MaxProcs:      uint64(s.opts.MaxProcesses),
		MaxOpenFiles:  uint64(s.opts.MaxOpenFiles),
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	configR, configW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer configR.Close()
	cmd := &exec.Cmd{
		Path: s.init.path,
		Args: []string{leaseinit.Arg0, s.opts.Root},
		// Nothing of the server's environment. A race-detector build of the
		// server would otherwise pause every init for a second at exit.
		Env:        []string{"GORACE=atexit_sleep_ms=0"},
		Stdin:      files.stdinR,
		Stdout:     files.stdoutW,
		Stderr:     files.stderrW,
		ExtraFiles: []*os.File{configR, files.statusW},
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:   true,
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(s.hostUID), Gid: uint32(s.hostGID), Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		configW.Close()
		return nil, fmt.Errorf("starting the init: %w", err)
	}
	go func() {
		configW.Write(cfgJSON)
		configW.Close()
	}()
	return cmd, nil
}

// initFiles are the pipes between the server and a new init. The init gets
// the child ends (closed here once it has them); the server writes stdin
// and the configuration, and the pump reads the init's stdout, stderr and
// status through raw non-blocking descriptors. The status channel is a
// unix socket rather than a pipe, so that a supervisor can send a
// terminal's master with its Started line.
type initFiles struct {
	stdinR, stdoutW, stderrW, statusW *os.File // the init's ends
	stdinW                            *os.File
	stdoutR, stderrR, statusR         int
}

func newInitFiles() (*initFiles, error) {
	f := &initFiles{stdoutR: -1, stderrR: -1, statusR: -1}
	var err error
	if f.stdinR, f.stdinW, err = os.Pipe(); err != nil {
		return nil, err
	}
	for i, p := range []struct {
		child **os.File
		ours  *int
	}{{&f.stdoutW, &f.stdoutR}, {&f.stderrW, &f.stderrR}, {&f.statusW, &f.statusR}} {
		var fds [2]int
		var err error
		if i == 2 {
			if fds, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
				unix.Shutdown(fds[0], unix.SHUT_WR) // status goes one way
			}
		} else {
			err = unix.Pipe2(fds[:], unix.O_CLOEXEC)
		}
		if err != nil {
			f.closeAll()
			return nil, err
		}
		unix.SetNonblock(fds[0], true)
		*p.ours, *p.child = fds[0], os.NewFile(uintptr(fds[1]), "pipe")
	}
	return f, nil
}

// closeChildEnds closes the server's copies of the init's ends: once the
// init has them, ours would only keep the pipes open.
func (f *initFiles) closeChildEnds() {
	for _, c := range []*os.File{f.stdinR, f.stdoutW, f.stderrW, f.statusW} {
		if c != nil {
			c.Close()
		}
	}
}

// closeAll closes everything, when no init was started.
func (f *initFiles) closeAll() {
	f.closeChildEnds()
	if f.stdinW != nil {
		f.stdinW.Close()
	}
	for _, fd := range []int{f.stdoutR, f.stderrR, f.statusR} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// terminalDrainGrace bounds how long a pty process's exit waits for its
// terminal to close after its main process exited: what the command wrote
// last may still be on its way through the terminal, and the terminal
// closes once nothing holds it — unless a background process does.
const terminalDrainGrace = 250 * time.Millisecond

// pump moves output from the pipes (and a pty process's terminal) into the
// journal and reads the init's messages, until every pipe is closed (or,
// with untilExit, until the exit is known and the status pipe closed: then
// it drains what the pipes hold and leaves the rest to discard). When the
// main process's exit status arrives, whatever it wrote is already in the
// pipes: pump drains them first, so the exit follows all of that output in
// the journal. A terminal's output may lag (the kernel moves it to the
// master asynchronously), so a pty process's exit is recorded once its
// terminal closed, or terminalDrainGrace after the status came.
func (p *process) pump(s *Server, stdoutR, stderrR, statusR int) {
	const terminalFD = 3
	fds := []unix.PollFd{
		{Fd: int32(stdoutR), Events: unix.POLLIN},
		{Fd: int32(stderrR), Events: unix.POLLIN},
		{Fd: int32(statusR), Events: unix.POLLIN},
		{Fd: -1, Events: unix.POLLIN}, // a pty process's terminal, once it came
	}
	streams := [...]journal.Stream{journal.Stdout, journal.Stderr, 0, journal.Pty}
	outputs := []int{0, 1, terminalFD}
	buf := make([]byte, journal.MaxChunk)
	oob := make([]byte, unix.CmsgSpace(4*leaseinit.MaxRequestFDs))
	var status []byte
	var pendingExit *journal.ExitStatus
	var exitDeadline time.Time
	open := 3
	closeFD := func(i int) {
		unix.Close(int(fds[i].Fd))
		fds[i].Fd = -1
		open--
	}
	// read reads once from output i; false when it reached end of file.
	read := func(i int) (n int, more bool) {
		n, err := unix.Read(int(fds[i].Fd), buf)
		if n > 0 {
			p.output(streams[i], buf[:n])
			return n, true
		}
		if err == unix.EAGAIN || err == unix.EINTR {
			return 0, true
		}
		closeFD(i) // a terminal: EIO once nothing holds its slave
		return 0, false
	}
	drain := func(i int) {
		limit, err := unix.FcntlInt(uintptr(fds[i].Fd), unix.F_GETPIPE_SZ, 0)
		if err != nil {
			limit = journal.MaxChunk
		}
		for total := 0; fds[i].Fd >= 0 && total < limit; {
			n, more := read(i)
			if n == 0 || !more {
				return
			}
			total += n
		}
	}
	drainAll := func() {
		for _, i := range outputs {
			if fds[i].Fd >= 0 {
				drain(i)
			}
		}
	}
	protocolFailure := func() {
		s.log.Warn("a process's status channel broke the protocol; killing its tree", "sandbox", p.lease.id)
		closeFD(2)
		p.kill()
	}
	// takeTerminal keeps the master that came with a status message: the
	// pump reads it, and a copy (p.terminal) takes input and resizes.
	takeTerminal := func(rights []int) {
		for _, fd := range rights {
			if p.size == nil || fds[terminalFD].Fd >= 0 {
				unix.Close(fd) // nothing a process of its kind is sent
				continue
			}
			unix.SetNonblock(fd, true)
			dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				unix.Close(fd)
				continue
			}
			fds[terminalFD].Fd = int32(fd)
			open++
			p.stdinMu.Lock()
			p.terminal = os.NewFile(uintptr(dup), "terminal")
			p.stdin = p.terminal
			p.stdinMu.Unlock()
		}
	}
	for open > 0 {
		if pendingExit != nil && (fds[terminalFD].Fd < 0 || !time.Now().Before(exitDeadline)) {
			p.setExit(*pendingExit)
			pendingExit = nil
		}
		if p.untilExit && fds[2].Fd < 0 {
			if _, ok := p.exitStatus(); ok {
				drainAll()
				var rest []int
				for _, i := range outputs {
					if fds[i].Fd >= 0 {
						rest = append(rest, int(fds[i].Fd))
					}
				}
				if len(rest) > 0 {
					s.workers.Go(func() { discard(rest) })
				}
				return
			}
		}
		timeout := -1
		if pendingExit != nil {
			timeout = int(time.Until(exitDeadline)/time.Millisecond) + 1
		}
		if _, err := unix.Poll(fds, timeout); err != nil {
			if err == unix.EINTR {
				continue
			}
			break
		}
		for _, i := range outputs {
			if fds[i].Fd >= 0 && fds[i].Revents != 0 {
				read(i)
			}
		}
		if fds[2].Fd < 0 || fds[2].Revents == 0 {
			continue
		}
		n, oobn, _, _, err := unix.Recvmsg(int(fds[2].Fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		if oobn > 0 {
			if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, c := range cmsgs {
					if rights, err := unix.ParseUnixRights(&c); err == nil {
						takeTerminal(rights)
					}
				}
			}
		}
		if n <= 0 {
			if err != unix.EAGAIN && err != unix.EINTR {
				closeFD(2)
			}
			continue
		}
		status = append(status, buf[:n]...)
		for fds[2].Fd >= 0 {
			line, rest, ok := bytes.Cut(status, []byte{'\n'})
			if !ok {
				if len(status) > leaseinit.MaxStatusLine {
					protocolFailure()
				}
				break
			}
			status = rest
			msg, ok := leaseinit.DecodeStatus(line)
			if !ok || (msg.Started && p.size != nil && fds[terminalFD].Fd < 0) {
				protocolFailure()
				break
			}
			switch {
			case msg.Exited && fds[terminalFD].Fd >= 0:
				drainAll()
				pendingExit = &journal.ExitStatus{Code: msg.ExitCode, Signal: msg.Signal}
				exitDeadline = time.Now().Add(terminalDrainGrace)
			case msg.Exited:
				drainAll()
				p.setExit(journal.ExitStatus{Code: msg.ExitCode, Signal: msg.Signal})
			default:
				select {
				case p.startCh <- msg:
				default:
				}
			}
		}
	}
	if pendingExit != nil {
		p.setExit(*pendingExit)
	}
	for _, fd := range fds {
		if fd.Fd >= 0 {
			unix.Close(int(fd.Fd))
		}
	}
}

// discard reads the pipes to their end and drops what they carry: the
// output of an exec's background processes, after the exec has answered.
// Reading on keeps their writes from failing.
func discard(fds []int) {
	poll := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		poll[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	buf := make([]byte, journal.MaxChunk)
	for open := len(poll); open > 0; {
		if _, err := unix.Poll(poll, -1); err != nil && err != unix.EINTR {
			break
		}
		for i := range poll {
			if poll[i].Fd < 0 || poll[i].Revents == 0 {
				continue
			}
			if n, err := unix.Read(int(poll[i].Fd), buf); n <= 0 && err != unix.EAGAIN && err != unix.EINTR {
				unix.Close(int(poll[i].Fd))
				poll[i].Fd = -1
				open--
			}
		}
	}
	for _, p := range poll {
		if p.Fd >= 0 {
			unix.Close(int(p.Fd))
		}
	}
}

// headBytes is how much of a process's stdout its history record keeps.
const headBytes = 4 << 10

// output appends a copy of data to the journal.
func (p *process) output(s journal.Stream, data []byte) {
	chunk := bytes.Clone(data)
	if s == journal.Stdout {
		p.lease.server.history.appendStdout(p.record, chunk)
	}
	p.journal.Append(s, chunk)
}

// setExit records the main process's exit status, once.
func (p *process) setExit(st journal.ExitStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit != nil {
		return
	}
	p.exit = &st
	p.finished = time.Now()
	p.journal.SetExit(st)
	close(p.mainExited)
}

// exitStatus returns the main process's exit status, if it is known.
func (p *process) exitStatus() (journal.ExitStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit == nil {
		return journal.ExitStatus{}, false
	}
	return *p.exit, true
}

// finish runs once the init was reaped and its pipes are closed: nothing of
// the tree is left.
func (p *process) finish(s *Server) {
	st := journal.ExitStatus{Signal: "SIGKILL"}
	if p.cmd == nil {
	} else if ps := p.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			// The init was killed, and with it the command.
			st = journal.ExitStatus{Signal: unix.SignalName(ws.Signal())}
		}
	}
	p.setExit(st)
	p.stdinMu.Lock()
	if p.stdin != nil && p.stdin != p.terminal {
		p.stdin.Close()
	}
	if p.terminal != nil {
		p.terminal.Close()
	}
	p.stdin, p.terminal = nil, nil
	p.stdinMu.Unlock()
	final, _ := p.exitStatus()
	s.history.finish(p.record, final)
	close(p.done)
	p.lease.processDone(p)
}

// signal delivers sig to every process of the tree: the supervisor
// forwards it (an exec in a lease: its process group gets it), except
// SIGKILL, which kills the tree.
func (p *process) signal(sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		p.kill()
		return
	}
	if p.machine != nil {
		p.machine.Signal(p.machineID, sig)
		return
	}
	p.cmd.Process.Signal(sig)
}

// kill kills the whole tree. A subreaper cannot do that atomically, so the
// tree is frozen and killed: by the lease init in namespace mode, here in
// process-group mode. An exec in a lease whose main process has exited has
// no tree anymore: what it left running belongs to the lease.
func (p *process) kill() {
	p.journal.Release()
	if p.machine != nil {
		if _, exited := p.exitStatus(); exited && p.oneShot {
			return
		}
		p.machine.Kill(p.machineID)
		return
	}
	roots := []int{p.cmd.Process.Pid}
	proctree.Freeze(roots, time.Second)
	proctree.Signal(roots, syscall.SIGKILL)
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Process.Signal(syscall.SIGKILL) // through a pidfd: never another process
}

// terminate ends the tree: SIGTERM, then SIGKILL after grace. It reports
// whether the tree is gone.
func (p *process) terminate(grace time.Duration) bool {
	select {
	case <-p.done:
		return true
	default:
	}
	p.terminating.Store(true)
	p.journal.Release()
	if grace > 0 {
		p.signal(syscall.SIGTERM)
		timer := time.NewTimer(grace)
		select {
		case <-p.done:
			timer.Stop()
			return true
		case <-timer.C:
		}
	}
	p.kill()
	timer := time.NewTimer(leaseinit.KillConfirmTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// errStdinClosed means stdin was closed already.
var errStdinClosed = errors.New("stdin is closed")

// closeStdin closes the write end of the command's stdin; once closed
// (by a request, or because the process exited), closing it again does
// nothing: the caller asked for stdin to be closed, and it is. A terminal
// has no stdin to close: its end of input is the EOF character (^D, as
// typed) and no more input; the terminal stays, for resize.
func (p *process) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	var err error
	if p.stdin == p.terminal {
		p.stdin.SetWriteDeadline(time.Now().Add(inputWriteTimeout))
		_, err = p.stdin.Write([]byte{terminalEOF})
	} else {
		err = p.stdin.Close()
	}
	p.stdin = nil
	return err
}

// terminalEOF is the EOF character of a new terminal's line discipline
// (VEOF, ^D).
const terminalEOF = 0x04

// errNoTerminal means a process runs on pipes, or its terminal is gone.
var errNoTerminal = errors.New("the process has no terminal")

// resize sets a pty process's terminal size: the kernel sends SIGWINCH to
// the terminal's foreground process group.
func (p *process) resize(size leaseinit.WinSize) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.terminal == nil {
		return errNoTerminal
	}
	rc, err := p.terminal.SyscallConn()
	if err != nil {
		return err
	}
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols})
	}); err != nil {
		return err
	}
	return ioctlErr
}

// writeStdin writes data to the command's stdin, giving up after timeout if
// nobody reads it.
func (p *process) writeStdin(data []byte, timeout time.Duration) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return errStdinClosed
	}
	p.stdin.SetWriteDeadline(time.Now().Add(timeout))
	_, err := p.stdin.Write(data)
	return err
}

// treeRoots returns the supervisor pid of each live process of
// process-group mode, the roots of their trees in the host's process table.
func treeRoots(procs []*process) []int {
	var roots []int
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			if p.cmd != nil {
				roots = append(roots, p.cmd.Process.Pid)
			}
		}
	}
	return roots
}
