package machine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"golang.org/x/sys/unix"
)

// Spawner starts a server's lease inits through the init program's
// spawner (leaseinit/spawner.go says why: a clone into a new user
// namespace copies the page tables of the process that clones, and the
// server's may be large). The spawner is started on the first lease and
// again after it died.
type Spawner struct {
	program string // the init program, as exec takes it

	mu      sync.Mutex
	current *spawnerProc // nil: none running
}

// NewSpawner returns a Spawner of the init program at program, as exec
// takes it: a build of cmd/sandboxflow-init (the server's open file of it,
// /proc/self/fd/N) or /proc/self/exe, the server's own binary. The
// spawner clones the inits from its own executable.
func NewSpawner(program string) *Spawner { return &Spawner{program: program} }

// spawnerProc is one run of the spawner.
type spawnerProc struct {
	cmd  *exec.Cmd
	sock int
	done chan struct{} // closed once it was reaped

	sendMu sync.Mutex // one request on the socket at a time

	mu      sync.Mutex
	dead    bool // its socket ended: every init it started is dying
	nextID  uint64
	answers map[uint64]chan spawnAnswer
	inits   map[uint64]*initProc
}

type spawnAnswer struct {
	init *initProc
	err  error
}

// initProc is a lease init the spawner started.
type initProc struct {
	pid    int
	exited chan struct{} // closed once it was reaped, and with it its PID namespace

	mu    sync.Mutex
	pidfd int // -1 once it exited
}

// signal sends sig to the init, through its pidfd: never to another
// process that took its pid.
func (p *initProc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd >= 0 {
		unix.PidfdSendSignal(p.pidfd, sig, nil, 0)
	}
}

// reaped closes exited and the pidfd.
func (p *initProc) reaped() {
	p.mu.Lock()
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
	p.mu.Unlock()
	close(p.exited)
}

// errSpawnerGone means the spawner ended before it answered.
var errSpawnerGone = errors.New("the spawner of lease inits ended")

// start has the spawner start a lease init as req says (ID set here),
// with ctl as its fd 3 and in the network namespace netns (nil: a new
// one, which req's Cloneflags ask for).
func (s *Spawner) start(req leaseinit.SpawnRequest, ctl *os.File, netns *os.File) (*initProc, error) {
	proc, err := s.running()
	if err != nil {
		return nil, err
	}
	fds := []int{int(ctl.Fd())}
	if netns != nil {
		req.NetNS = true
		fds = append(fds, int(netns.Fd()))
	}
	answer := make(chan spawnAnswer, 1)
	proc.mu.Lock()
	if proc.dead {
		proc.mu.Unlock()
		return nil, errSpawnerGone
	}
	proc.nextID++
	req.ID = proc.nextID
	proc.answers[req.ID] = answer
	proc.mu.Unlock()

	b, err := json.Marshal(req)
	if err == nil {
		proc.sendMu.Lock()
		for {
			err = unix.Sendmsg(proc.sock, b, unix.UnixRights(fds...), nil, 0)
			if err != unix.EINTR {
				break
			}
		}
		proc.sendMu.Unlock()
	}
	if err != nil {
		proc.mu.Lock()
		delete(proc.answers, req.ID)
		proc.mu.Unlock()
		return nil, fmt.Errorf("asking the spawner for a lease init: %w", err)
	}
	timer := time.NewTimer(leaseinit.StartTimeout)
	defer timer.Stop()
	select {
	case a := <-answer: // the reader answers every request, if only errSpawnerGone
		return a.init, a.err
	case <-timer.C:
		proc.mu.Lock()
		delete(proc.answers, req.ID) // a late init is killed (read)
		proc.mu.Unlock()
		return nil, errors.New("the spawner of lease inits did not answer in time")
	}
}

// running returns the spawner's current run, starting one if there is
// none or the last one died.
func (s *Spawner) running() (*spawnerProc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != nil {
		s.current.mu.Lock()
		dead := s.current.dead
		s.current.mu.Unlock()
		if !dead {
			return s.current, nil
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("the spawner's socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "spawner")
	defer child.Close()
	proc := &spawnerProc{sock: fds[0], done: make(chan struct{}), answers: map[uint64]chan spawnAnswer{}, inits: map[uint64]*initProc{}}
	proc.cmd = &exec.Cmd{
		Path:       s.program,
		Args:       []string{leaseinit.Arg0, "-", leaseinit.SpawnerArg},
		Env:        []string{"GORACE=atexit_sleep_ms=0"},
		ExtraFiles: []*os.File{child},
		// No new user namespace: started with a vfork, whatever the size
		// of this process. It dies with the server, and its inits with it.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL},
	}
	// Its parent-death signal comes when the thread that started it ends,
	// not the server: started on a thread of its own, which serves it
	// until it is gone (read), no other goroutine's exit while locked to
	// a thread (network's onThread does that on purpose) can kill every
	// lease.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := proc.cmd.Start()
		started <- err
		if err == nil {
			proc.read()
		}
	}()
	if err := <-started; err != nil {
		unix.Close(proc.sock)
		return nil, fmt.Errorf("starting the spawner of lease inits: %w", err)
	}
	s.current = proc
	return proc, nil
}

// read dispatches the spawner's replies until its socket ends.
func (p *spawnerProc) read() {
	buf := make([]byte, leaseinit.MaxReplyBytes+1)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(p.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 || n > leaseinit.MaxReplyBytes {
			break
		}
		var fds []int
		if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, c := range cmsgs {
				if got, err := unix.ParseUnixRights(&c); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		var r leaseinit.SpawnReply
		if json.Unmarshal(buf[:n], &r) != nil {
			closeFDs(fds)
			break
		}
		p.mu.Lock()
		switch answer, init := p.answers[r.ID], p.inits[r.ID]; {
		case r.Exited && init != nil:
			delete(p.inits, r.ID)
			init.reaped()
		case answer != nil && r.Failure != "":
			delete(p.answers, r.ID)
			answer <- spawnAnswer{err: errors.New(r.Failure)}
		case r.Pid > 0 && len(fds) == 1:
			delete(p.answers, r.ID)
			init := &initProc{pid: r.Pid, pidfd: fds[0], exited: make(chan struct{})}
			fds = nil
			p.inits[r.ID] = init // reaped (Exited) even if nobody waits
			if answer == nil {
				init.signal(syscall.SIGKILL) // its create gave up waiting
			} else {
				answer <- spawnAnswer{init: init}
			}
		}
		p.mu.Unlock()
		closeFDs(fds)
	}
	p.end()
}

// end marks the spawner dead: the requests it did not answer fail, and
// the inits it started (which its death kills) count as exited once
// their pidfds say so.
func (p *spawnerProc) end() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.mu.Lock()
	p.dead = true
	answers, inits := p.answers, p.inits
	p.answers, p.inits = nil, nil
	p.mu.Unlock()
	for _, a := range answers {
		a <- spawnAnswer{err: errSpawnerGone}
	}
	for _, init := range inits {
		go func() {
			init.mu.Lock()
			fd := init.pidfd
			init.mu.Unlock()
			// A pidfd polls readable once its process has exited.
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			for {
				if _, err := unix.Poll(fds, -1); err != unix.EINTR {
					break
				}
			}
			init.reaped()
		}()
	}
	p.cmd.Wait()
	unix.Close(p.sock)
	close(p.done)
}

// Close ends the spawner, and any init it still runs (destroy the leases
// first), and waits until it was reaped.
func (s *Spawner) Close() {
	s.mu.Lock()
	proc := s.current
	s.current = nil
	s.mu.Unlock()
	if proc != nil {
		unix.Shutdown(proc.sock, unix.SHUT_RDWR) // its reader ends, and kills it
		<-proc.done
	}
}
