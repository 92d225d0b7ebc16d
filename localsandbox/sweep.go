package localsandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
)

// What a crashed server left behind, and how the next one on the same root
// finds and removes it.

// sweep kills every process a previous server on this root left running
// and removes its leases.
func (s *Server) sweep() error {
	for attempt := 0; ; attempt++ {
		pids, err := SandboxProcesses(s.opts.Root)
		if err != nil {
			return fmt.Errorf("localsandbox: sweep: %w", err)
		}
		if len(pids) == 0 {
			break
		}
		if attempt == 0 {
			s.log.Warn("killing processes left behind by a previous server", "root", s.opts.Root, "count", len(pids))
		}
		if attempt == 100 {
			return fmt.Errorf("localsandbox: sweep: %d leftover processes do not die", len(pids))
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	machine.SweepDisks(filepath.Join(s.opts.Root, leasesDir), filepath.Join(s.opts.Root, disksDir))
	dir := filepath.Join(s.opts.Root, leasesDir)
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		s.log.Warn("removing workspaces left behind by a previous server", "root", s.opts.Root, "count", len(entries))
	}
	if err := hostfs.RemoveAll(dir); err != nil {
		return fmt.Errorf("localsandbox: sweep: %w", err)
	}
	// Chmod: whatever the server's umask, the leases' inits (each root of
	// its own ids) must pass through to their directories.
	if err := os.Mkdir(dir, 0o711); err != nil {
		return fmt.Errorf("localsandbox: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("localsandbox: %w", err)
	}
	return nil
}

// rootMarkerEnv is set in the environment of every command run in
// process-group mode (where no namespace holds the tree together), and of
// every slirp4netns, so that a server restarted on the same root can find
// what survived a crash.
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
	wantArgv := []byte(leaseinit.Arg0 + "\x00" + root)
	wantEnv := []byte(rootMarkerEnv + "=" + root)
	if root != "" {
		wantArgv = append(wantArgv, 0)
		wantEnv = append(wantEnv, 0)
	}
	pids, err := proctree.Marked(wantArgv, wantEnv)
	if err != nil {
		return nil, fmt.Errorf("reading the process table: %w", err)
	}
	return pids, nil
}
