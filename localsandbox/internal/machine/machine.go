package machine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"golang.org/x/sys/unix"
)

// The lease machine, server side.
//
// In namespace mode a lease is a small machine: creating the sandbox starts
// its lease init (package leaseinit), pid 1 of the lease's own user, mount,
// PID, UTS, IPC and network namespaces, which lives as long as the sandbox.
// Every exec and managed process is forked by that init, so the processes
// of a lease see each other, share 127.0.0.1 and its root file system, and
// a background process outlives the exec that started it. Destroying the
// sandbox kills the init, and with it (the kernel's doing: it is pid 1)
// every process of the lease.
//
// The server talks to the init over a SOCK_SEQPACKET socket pair: one
// request per message (JSON, with the stdio pipes of a new command attached
// as SCM_RIGHTS), one bounded reply at start (leaseinit/protocol.go). Each
// command's own status (started, exited) comes back on a pipe of its own,
// read by the server's pump.

// Machine is a running lease init, as the server holds it.
type Machine struct {
	init   *initProc
	ctl    int // our end of the control socket
	nextID atomic.Uint64

	sendMu sync.Mutex
	closed bool // guarded by sendMu; the control socket is closed

	cgroup Cgroup // the lease's, thawed after the kill (nil: none)
}

// errGone means the lease init is not running anymore.
var errGone = errors.New("the sandbox's init is gone")

// ErrCommandTooLong means a command's argv and environment do not fit in
// one request to the init.
var ErrCommandTooLong = errors.New("the command line and environment are too long")

// Start starts the lease init of the lease sp describes, through
// spawner, in its cgroup cg (nil: none), and waits until it has built the
// lease's environment. The init is cloned with every namespace but the
// network's when netns is not nil: the network namespace the server made
// for the lease (package network), which it starts in instead.
func Start(sp *Spec, cg Cgroup, spawner *Spawner, netns *os.File) (*Machine, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF} {
		if unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, opt, 2*leaseinit.MaxRequestBytes) == nil {
			break
		}
	}
	for _, opt := range []int{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF} {
		if unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, opt, 2*leaseinit.MaxRequestBytes) == nil {
			break
		}
	}
	childEnd := os.NewFile(uintptr(fds[1]), "control")
	m := &Machine{ctl: fds[0]}
	uids, gids := sp.idMappings()
	req := leaseinit.SpawnRequest{
		Root: sp.ServerRoot,
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		UIDMap: uids, GIDMap: gids,
		Setgroups: gids[0].Size > 1, // a range: su, apt and the like set groups
	}
	if netns == nil {
		req.Cloneflags |= syscall.CLONE_NEWNET
	}
	m.init, err = spawner.start(req, childEnd, netns)
	childEnd.Close()
	if err != nil {
		unix.Close(m.ctl)
		return nil, fmt.Errorf("starting the lease init: %w", err)
	}
	m.cgroup = cg
	if cg != nil {
		// Before the init forks anything: every process of the lease is in
		// the group.
		if err := cg.AddProc(m.init.pid); err != nil {
			m.Stop()
			return nil, fmt.Errorf("putting the lease init in its cgroup: %w", err)
		}
	}

	cfg, files, err := sp.setup(m.init.pid)
	if err == nil {
		err = m.send(cfg, files)
	}
	closeFDs(files)
	if err == nil {
		err = m.awaitReady()
	}
	if err != nil {
		m.Stop()
		return nil, err
	}
	return m, nil
}

// awaitReady reads the init's reply to its configuration.
func (m *Machine) awaitReady() error {
	type result struct {
		reply leaseinit.Reply
		err   error
	}
	got := make(chan result, 1)
	go func() {
		buf := make([]byte, leaseinit.MaxReplyBytes+1)
		for {
			n, _, _, _, err := unix.Recvmsg(m.ctl, buf, nil, 0)
			if err == unix.EINTR {
				continue
			}
			switch {
			case err != nil:
				got <- result{err: fmt.Errorf("the lease init: %w", err)}
			case n == 0:
				got <- result{err: errors.New("the lease init ended while setting up")}
			case n > leaseinit.MaxReplyBytes:
				got <- result{err: errors.New("the lease init broke the protocol: its reply is too long")}
			default:
				var r leaseinit.Reply
				if json.Unmarshal(buf[:n], &r) != nil || r.Ready == (r.Failure != "") {
					got <- result{err: errors.New("the lease init broke the protocol: a garbled reply")}
				} else {
					got <- result{reply: r}
				}
			}
			return
		}
	}()
	timer := time.NewTimer(leaseinit.StartTimeout)
	defer timer.Stop()
	select {
	case r := <-got:
		if r.err != nil {
			return r.err
		}
		if r.reply.Failure != "" {
			return fmt.Errorf("setting up the sandbox: %s", r.reply.Failure)
		}
		return nil
	case <-timer.C:
		return errors.New("the lease init did not get ready in time")
	}
}

// send writes one message with fds attached.
func (m *Machine) send(msg any, fds []int) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if len(b) > leaseinit.MaxRequestBytes {
		return ErrCommandTooLong
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	m.sendMu.Lock()
	defer m.sendMu.Unlock()
	if m.closed {
		return errGone
	}
	for {
		err = unix.Sendmsg(m.ctl, b, oob, nil, 0)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err == unix.EMSGSIZE:
		return ErrCommandTooLong
	case err != nil:
		return fmt.Errorf("%w: %v", errGone, err)
	}
	return nil
}

// Spawn asks the init to start a command of kind (leaseinit.KindExec or
// KindProcess) with the given pipes (stdin, stdout, stderr, status); it
// returns the command's id in the machine. The command's status comes on
// the status pipe. A managed process with a terminal size runs on a
// terminal of the lease's (leaseinit.SupervisorConfig.Terminal).
func (m *Machine) Spawn(kind string, argv []string, cwd string, env []string, terminal *leaseinit.WinSize, fds []int) (uint64, error) {
	id := m.nextID.Add(1)
	err := m.send(leaseinit.Request{Op: "spawn", ID: id, Kind: kind, Argv: argv, Cwd: cwd, Env: env, Terminal: terminal}, fds)
	return id, err
}

// Signal delivers sig to command id: an exec's process group, or a
// managed process's supervisor (which forwards it to its tree).
func (m *Machine) Signal(id uint64, sig syscall.Signal) {
	m.send(leaseinit.Request{Op: "signal", ID: id, Signal: int(sig)}, nil)
}

// Kill kills command id's tree.
func (m *Machine) Kill(id uint64) {
	m.send(leaseinit.Request{Op: "kill", ID: id}, nil)
}

// Stop kills the init, and with it every process of the lease, and waits
// until the kernel has reaped them all. It reports whether they are gone.
func (m *Machine) Stop() bool {
	m.init.signal(syscall.SIGKILL)
	if m.cgroup != nil {
		// A frozen process dies only once thawed.
		m.cgroup.Thaw()
	}
	timer := time.NewTimer(leaseinit.KillConfirmTimeout)
	defer timer.Stop()
	select {
	case <-m.init.exited: // reaped: nothing of the lease is left
	case <-timer.C:
		return false
	}
	m.sendMu.Lock()
	defer m.sendMu.Unlock()
	if !m.closed {
		m.closed = true
		unix.Close(m.ctl)
	}
	return true
}

// Pid is the init's pid on the host.
func (m *Machine) Pid() int { return m.init.pid }
