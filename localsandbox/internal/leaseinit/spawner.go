package leaseinit

import (
	"encoding/json"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The spawner.
//
// A lease init is cloned into a new user namespace, and Go clones such a
// child with a full fork, not a vfork (the child must wait for its id
// maps, which the parent writes): the kernel copies the page tables of
// the whole forking process. Cloned by the server itself, that made a
// create cost about 28 µs more per MiB the server's process holds (68 µs
// with the copy-on-write faults after it): in the devserver, which holds
// the Temporal server and a worker too, 14 ms rose to 25 ms after the
// bench's first parts, and to 51 ms with 500 MiB more (docs/PERFORMANCE.md,
// 2026-12-07). So the server clones no lease init: it starts, once, a
// spawner — this program, a few MiB — with a plain vfork, and the spawner
// clones the inits, at the cost of its own few MiB.
//
// The spawner is the parent of the inits: it reaps them and says so
// (SpawnReply.Exited), and as their parent its death kills them
// (Pdeathsig), as the server's did. It ends when the server closes its
// socket or dies (its own Pdeathsig).

// SpawnerArg is argv[2] of the spawner; its argv[1] is "-": it belongs to
// no root (the inits it starts carry their server's root).
const SpawnerArg = "spawner"

// spawnerSocketFD is the spawner's end of its socket to the server.
const spawnerSocketFD = 3

func runSpawner() int {
	// Nothing may read its memory or descriptors (see runLeaseInit).
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	unix.CloseRange(spawnerSocketFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	sp := &spawner{sock: spawnerSocketFD, inits: map[int]uint64{}}
	// Subscribed before the first child exists: no exit is missed.
	exits := make(chan os.Signal, 1)
	signal.Notify(exits, syscall.SIGCHLD)
	go func() {
		for range exits {
			sp.reap()
		}
	}()
	buf := make([]byte, MaxReplyBytes)
	oob := make([]byte, unix.CmsgSpace(2*4))
	for {
		msg, fds, err := recvRequest(sp.sock, buf, oob)
		if err != nil {
			return 0 // the server is gone; the inits die with this process
		}
		var req SpawnRequest
		if json.Unmarshal(msg, &req) != nil || len(fds) != 1+b2i(req.NetNS) {
			closeAll(fds)
			return 1 // not the server's protocol: end rather than guess
		}
		sp.spawn(req, fds)
		closeAll(fds)
	}
}

type spawner struct {
	sock   int
	sendMu sync.Mutex
	// mu orders a clone, its registration and its answer before its
	// reaping.
	mu    sync.Mutex
	inits map[int]uint64 // pid → request id
}

// spawn starts the init req asks for and answers.
func (sp *spawner) spawn(req SpawnRequest, fds []int) {
	var pidfd int = -1
	attr := &syscall.ProcAttr{
		Env:   []string{"GORACE=atexit_sleep_ms=0"},
		Files: []uintptr{0, 1, 2, uintptr(fds[0])}, // stdio: the spawner's, /dev/null
		Sys: &syscall.SysProcAttr{
			Setsid:                     true,
			Pdeathsig:                  syscall.SIGKILL,
			Cloneflags:                 req.Cloneflags,
			UidMappings:                req.UIDMap,
			GidMappings:                req.GIDMap,
			GidMappingsEnableSetgroups: req.Setgroups,
			// Root of the namespace, that is the lease's host uid outside.
			Credential: &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
			PidFD:      &pidfd,
		},
	}
	clone := func() (int, error) {
		return syscall.ForkExec("/proc/self/exe", []string{Arg0, req.Root, LeaseArg}, attr)
	}
	// Under mu, the answer too: the init's exit is reaped and told only
	// after it.
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var pid int
	var err error
	if req.NetNS {
		pid, err = inNetns(fds[1], clone)
	} else {
		pid, err = clone()
	}
	if err != nil {
		sp.send(SpawnReply{ID: req.ID, Failure: "starting the lease init: " + err.Error()}, -1)
		return
	}
	sp.inits[pid] = req.ID
	sp.send(SpawnReply{ID: req.ID, Pid: pid}, pidfd)
	unix.Close(pidfd)
}

// inNetns runs clone on a thread moved into the network namespace ns: a
// child inherits the namespaces of the thread that forks it. The thread
// goes back afterwards; if it cannot, it ends with its goroutine (the init
// forked on it then gets its parent-death signal).
func inNetns(ns int, clone func() (int, error)) (int, error) {
	type result struct {
		pid int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		pid, err := clone()
		if unix.Setns(orig, unix.CLONE_NEWNET) != nil {
			done <- result{pid, err} // stays locked: the thread ends
			return
		}
		runtime.UnlockOSThread()
		done <- result{pid, err}
	}()
	r := <-done
	return r.pid, r.err
}

// reap reaps every init that has exited and tells the server.
func (sp *spawner) reap() {
	for {
		var ws syscall.WaitStatus
		sp.mu.Lock()
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		id, ok := sp.inits[pid]
		delete(sp.inits, pid)
		sp.mu.Unlock()
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ok {
			sp.send(SpawnReply{ID: id, Exited: true}, -1)
		}
	}
}

// send writes one reply, with fd attached unless it is -1.
func (sp *spawner) send(r SpawnReply, fd int) {
	b, _ := json.Marshal(r)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	sp.sendMu.Lock()
	defer sp.sendMu.Unlock()
	for unix.Sendmsg(sp.sock, b, oob, nil, 0) == unix.EINTR {
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
