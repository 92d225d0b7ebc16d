package localsandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// procTable is a snapshot of the host's process table: who is whose parent,
// and who is stopped. Process trees are followed through parent links, which
// no sandboxed process can leave: orphans are adopted by their namespace's
// pid 1 or by the init's subreaper, both inside the tree.
type procTable struct {
	children map[int][]int
	state    map[int]byte
}

func readProcTable() (procTable, error) {
	dir, err := os.Open("/proc")
	if err != nil {
		return procTable{}, err
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return procTable{}, err
	}
	t := procTable{children: make(map[int][]int), state: make(map[int]byte, len(names))}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		ppid, state, ok := readStat(pid)
		if !ok {
			continue // exited meanwhile
		}
		t.state[pid] = state
		t.children[ppid] = append(t.children[ppid], pid)
	}
	return t, nil
}

// readStat returns the parent and state fields of /proc/pid/stat.
func readStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) state ppid ...": comm may contain anything, so split after
	// its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	fields := bytes.Fields(b[i+2:])
	if len(fields) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(string(fields[1]))
	if err != nil {
		return 0, 0, false
	}
	return ppid, fields[0][0], true
}

// tree returns root and all its descendants that are in the table.
func (t procTable) tree(root int) []int {
	if _, ok := t.state[root]; !ok {
		return nil
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, t.children[out[i]]...)
	}
	return out
}

// count returns how many live processes (not zombies: a zombie waits for
// its parent to reap it) the trees rooted at roots hold.
func (t procTable) count(roots []int) int {
	n := 0
	for _, r := range roots {
		for _, pid := range t.tree(r) {
			if t.state[pid] != 'Z' {
				n++
			}
		}
	}
	return n
}

// freezeTrees stops every process of the trees rooted at roots with
// SIGSTOP and returns once a fresh scan finds every one of them stopped (or
// dead) and no new process: a process stopped cannot fork, so a process
// forked during the freeze is found by a later scan and stopped in turn.
// It gives up after timeout. The process skip (a lease init: 0 for none) is
// left running.
func freezeTrees(roots []int, timeout time.Duration, skip ...int) error {
	deadline := time.Now().Add(timeout)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 20*time.Millisecond) {
		t, err := readProcTable()
		if err != nil {
			return err
		}
		settled := true
		for _, root := range roots {
			for _, pid := range t.tree(root) {
				if len(skip) > 0 && pid == skip[0] {
					continue
				}
				switch t.state[pid] {
				case 'T', 't', 'Z', 'X', 'x':
					continue
				}
				// Again on every pass: a sibling not yet stopped may have
				// sent it SIGCONT.
				settled = false
				syscall.Kill(pid, syscall.SIGSTOP)
			}
		}
		if settled {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the process tree did not settle")
		}
		time.Sleep(pause)
	}
}

// signalTrees sends sig to every process of the trees rooted at roots.
func signalTrees(roots []int, sig syscall.Signal) error {
	t, err := readProcTable()
	if err != nil {
		return err
	}
	for _, root := range roots {
		for _, pid := range t.tree(root) {
			syscall.Kill(pid, sig)
		}
	}
	return nil
}

// rootMarkerEnv is set in the environment of every command run in
// process-group mode (where no namespace holds the tree together), so that a
// server restarted on the same root can find what survived a crash.
const rootMarkerEnv = "SANDBOXFLOW_ROOT"

// SandboxProcesses returns the ids of every process on this machine that a
// server with the given root directory (Server.Root) started and that is
// still alive: the inits of its managed processes (found by their argv
// marker), every descendant of those, and in process-group mode every
// process that carries the root's environment marker. An empty root means
// servers of any root. Tests use it to assert that nothing leaked; a server
// sweeps the same set when it starts on a root a crashed predecessor left
// behind.
//
// A process that has cleared its environment and left its init (possible
// only in process-group mode, after its init was killed) escapes it.
func SandboxProcesses(root string) ([]int, error) {
	t, err := readProcTable()
	if err != nil {
		return nil, fmt.Errorf("reading the process table: %w", err)
	}
	wantArgv := []byte(initArg0 + "\x00" + root)
	wantEnv := []byte(rootMarkerEnv + "=" + root)
	if root != "" {
		wantArgv = append(wantArgv, 0)
		wantEnv = append(wantEnv, 0)
	}
	self := os.Getpid()
	seen := make(map[int]bool)
	var out []int
	for pid := range t.state {
		if pid == self || seen[pid] {
			continue
		}
		prefix := "/proc/" + strconv.Itoa(pid)
		cmdline, _ := os.ReadFile(prefix + "/cmdline")
		marked := bytes.HasPrefix(cmdline, wantArgv)
		if !marked {
			env, _ := os.ReadFile(prefix + "/environ")
			marked = bytes.HasPrefix(env, wantEnv) || bytes.Contains(env, append([]byte{0}, wantEnv...))
		}
		if !marked {
			continue
		}
		for _, p := range t.tree(pid) {
			if !seen[p] {
				seen[p] = true
				if t.state[p] != 'Z' { // dead, waiting to be reaped
					out = append(out, p)
				}
			}
		}
	}
	return out, nil
}
