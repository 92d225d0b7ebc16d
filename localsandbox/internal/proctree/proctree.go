package proctree

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Table is a snapshot of the host's process table: who is whose parent,
// and who is stopped. Process trees are followed through parent links, which
// no sandboxed process can leave: orphans are adopted by their namespace's
// pid 1 or by the init's subreaper, both inside the tree.
type Table struct {
	children map[int][]int
	state    map[int]byte
}

// Read reads the host's process table from /proc.
func Read() (Table, error) {
	dir, err := os.Open("/proc")
	if err != nil {
		return Table{}, err
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return Table{}, err
	}
	t := Table{children: make(map[int][]int), state: make(map[int]byte, len(names))}
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

// Children returns the pids whose parent is pid.
func (t Table) Children(pid int) []int { return t.children[pid] }

// State returns the state letter of pid as /proc/<pid>/stat says it ('R',
// 'S', 'D', 'T', 'Z' …), or 0 when pid is not in the table.
func (t Table) State(pid int) byte { return t.state[pid] }

// Tree returns root and all its descendants that are in the table.
func (t Table) Tree(root int) []int {
	if _, ok := t.state[root]; !ok {
		return nil
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, t.children[out[i]]...)
	}
	return out
}

// Count returns how many live processes (not zombies: a zombie waits for
// its parent to reap it) the trees rooted at roots hold.
func (t Table) Count(roots []int) int {
	n := 0
	for _, r := range roots {
		for _, pid := range t.Tree(r) {
			if t.state[pid] != 'Z' {
				n++
			}
		}
	}
	return n
}

// Freeze stops every process of the trees rooted at roots with
// SIGSTOP and returns once a fresh scan finds every one of them stopped (or
// dead) and no new process: a process stopped cannot fork, so a process
// forked during the freeze is found by a later scan and stopped in turn.
// It gives up after timeout. The process skip (a lease init: 0 for none) is
// left running.
func Freeze(roots []int, timeout time.Duration, skip ...int) error {
	deadline := time.Now().Add(timeout)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 20*time.Millisecond) {
		t, err := Read()
		if err != nil {
			return err
		}
		settled := true
		for _, root := range roots {
			for _, pid := range t.Tree(root) {
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

// Signal sends sig to every process of the trees rooted at roots.
func Signal(roots []int, sig syscall.Signal) error {
	t, err := Read()
	if err != nil {
		return err
	}
	for _, root := range roots {
		for _, pid := range t.Tree(root) {
			syscall.Kill(pid, sig)
		}
	}
	return nil
}

// Marked returns every live process of the host but this one whose
// command line starts with argv or whose environment holds env (the first
// variable, or one after a NUL), and every live descendant of those:
// zombies, dead and waiting to be reaped, are left out.
func Marked(argv, env []byte) ([]int, error) {
	t, err := Read()
	if err != nil {
		return nil, err
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
		marked := bytes.HasPrefix(cmdline, argv)
		if !marked {
			environ, _ := os.ReadFile(prefix + "/environ")
			marked = bytes.HasPrefix(environ, env) || bytes.Contains(environ, append([]byte{0}, env...))
		}
		if !marked {
			continue
		}
		for _, p := range t.Tree(pid) {
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
