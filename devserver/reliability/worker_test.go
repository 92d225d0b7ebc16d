package reliability

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// workerBinary builds the worker binary once per test binary (in the
// directory TestMain provides) and returns its path.
var workerBinary = sync.OnceValues(func() (string, error) {
	// The worker belongs to the root module, which go.mod replaces with
	// ../: build it there, with that module's own go.sum.
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/sandboxflow/sandboxflow").Output()
	if err != nil {
		return "", fmt.Errorf("find the root module: %w", err)
	}
	bin := filepath.Join(binDir, "worker")
	build := exec.Command("go", "build", "-o", bin, "./cmd/worker")
	build.Dir = strings.TrimSpace(string(out))
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/worker: %w\n%s", err, out)
	}
	return bin, nil
})

// workerProcess is the worker binary running as a process of its own,
// polling the row's Temporal server and reaching the sandbox server
// through the row's proxy.
type workerProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startWorker starts a worker process for the rest of the test.
func (e *env) startWorker() *workerProcess {
	e.t.Helper()
	return e.startWorkerVia(e.stack.Temporal.FrontendHostPort())
}

// startWorkerVia starts a worker process that reaches the Temporal
// frontend at address (a relay in front of it).
func (e *env) startWorkerVia(address string) *workerProcess {
	e.t.Helper()
	bin, err := workerBinary()
	require.NoError(e.t, err)
	// Port 0: a fixed metrics port fails the worker wherever it is taken
	// (another worker, another test run).
	cmd := exec.Command(bin, "--log-level", "warn", "--metrics-listen", "127.0.0.1:0")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + e.t.TempDir(), // no Temporal profile of this machine's user
		"TEMPORAL_ADDRESS=" + address,
		"TEMPORAL_NAMESPACE=" + e.stack.Temporal.Namespace(),
		"SANDBOX_API_URL=" + e.proxy.URL(),
		"SANDBOX_API_KEY=" + e.stack.SandboxAPIKey,
	}
	cmd.Stdout, cmd.Stderr = e.logs, e.logs
	require.NoError(e.t, cmd.Start())
	w := &workerProcess{cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(w.exited)
	}()
	e.t.Cleanup(func() {
		cmd.Process.Kill()
		<-w.exited
	})
	return w
}

// kill kills the worker with SIGKILL, the way a crash or the OOM killer
// does: it cannot detach from anything or say goodbye.
func (w *workerProcess) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGKILL))
	<-w.exited
	status, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL, "the worker died of %v", w.cmd.ProcessState)
}
