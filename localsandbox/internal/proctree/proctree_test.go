package proctree

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// A tree of three (a shell and two background sleeps), found by its mark,
// frozen whole, then killed whole.
func TestMarkedTreeIsFrozenAndKilled(t *testing.T) {
	marker := "PROCTREE_TEST=" + t.Name()
	cmd := exec.Command("sh", "-c", "sleep 1000 & sleep 1000 & wait")
	cmd.Env = append(os.Environ(), marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	root := cmd.Process.Pid
	t.Cleanup(func() { Signal([]int{root}, syscall.SIGKILL); cmd.Wait() })

	var tree []int
	for deadline := time.Now().Add(10 * time.Second); len(tree) < 3; time.Sleep(5 * time.Millisecond) {
		table, err := Read()
		if err != nil {
			t.Fatal(err)
		}
		tree = table.Tree(root)
		if time.Now().After(deadline) {
			t.Fatalf("the tree of %d is %v, want the shell and its two sleeps", root, tree)
		}
	}
	noArgv := []byte("no such command\x00")
	marked, err := Marked(noArgv, []byte(marker))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(marked)
	slices.Sort(tree)
	if !slices.Equal(marked, tree) {
		t.Errorf("marked %v, want the tree %v", marked, tree)
	}

	if err := Freeze([]int{root}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	table, _ := Read()
	for _, pid := range tree {
		if s := table.State(pid); s != 'T' {
			t.Errorf("process %d of the frozen tree is in state %q", pid, s)
		}
	}
	if n := table.Count([]int{root}); n != 3 {
		t.Errorf("Count = %d, want 3", n)
	}

	if err := Signal([]int{root}, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the shell exited 0 after SIGKILL")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		left, err := Marked(noArgv, []byte(marker))
		if err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still alive after SIGKILL: %v", left)
		}
	}
}
