package bench

import (
	"bufio"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The CPU of a process that a live child of the bench reaped counts: the
// sandbox server's spawner, a live child, reaps the lease inits, and
// getrusage of the bench's children alone missed them (P2's sandbox
// processes read 0).
func TestCPUTimeCountsWhatLiveChildrenReaped(t *testing.T) {
	_, before := cpuTime()
	reapedBefore := reapedChildrenCPU()
	// A grandchild burns CPU and is reaped by the child, which then says
	// so and lives on.
	cmd := exec.Command("sh", "-c", `(i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done); echo reaped; exec sleep 60`)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "reaped\n", line)

	_, after := cpuTime()
	assert.Greater(t, after-before, 50*time.Millisecond, "the grandchild's CPU, reaped by the live child")
	assert.Less(t, reapedChildrenCPU()-reapedBefore, 5*time.Millisecond, "getrusage saw none of it")
}

func reapedChildrenCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
