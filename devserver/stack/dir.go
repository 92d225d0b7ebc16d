package stack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// A stack's directory holds what it writes to disk: the in-process sandbox
// server's root (unless Options.Sandbox.Root is set) and, with
// Options.LogFile, its log. Every stack has its own, so stacks on different
// ports run side by side:
//
//	$TMPDIR/sandboxflow-<uid>/stack-127.0.0.1-7233/   a stack on a fixed frontend port
//	$TMPDIR/sandboxflow-<uid>/stack-tmp-*/             any other (or when that one is busy)
//	    lock        flock'ed by the stack while it runs
//	    sandbox/    the sandbox server's root
//	    stack.log   with Options.LogFile, truncated at each start
//
// The next stack on the same port reuses the directory, and its sandbox
// server sweeps what a crashed predecessor left there. At start, a stack
// also removes every stack directory that nobody holds any more and whose
// sandboxes are all gone: the leftovers of stacks on ports not used again.
type stackDir struct {
	path string
	lock *os.File
}

const (
	dirPrefix    = "stack-"
	dirTmpPrefix = dirPrefix + "tmp-"
	dirLock      = "lock"
	dirSandbox   = "sandbox"
	dirLog       = "stack.log"
)

// errDirBusy: another live stack holds the directory.
var errDirBusy = errors.New("held by another stack")

// stacksBase is the directory of the user's stack directories.
func stacksBase() string {
	return filepath.Join(os.TempDir(), "sandboxflow-"+strconv.Itoa(os.Geteuid()))
}

// openStackDir creates (or reuses) and locks the directory of a stack whose
// frontend listens on ip:port, after sweeping stale ones. Port 0, or a
// directory another stack holds, gets a fresh temporary directory: if that
// other stack is on the same address, starting the Temporal server then
// reports the port in use, as without a directory.
func openStackDir(ip string, port int) (*stackDir, error) {
	base, err := filepath.Abs(stacksBase())
	if err != nil {
		return nil, fmt.Errorf("stack directory: %w", err)
	}
	if err := os.MkdirAll(base, 0o711); err != nil {
		return nil, fmt.Errorf("stack directory: %w", err)
	}
	if err := checkOwnDir(base); err != nil {
		return nil, err
	}
	sweepStackDirs(base)
	// A sweep by another stack may remove a directory between its creation
	// and its lock; lockStackDir notices and we try again.
	for attempt := 0; attempt < 10; attempt++ {
		if port != 0 {
			path := filepath.Join(base, dirPrefix+strings.ReplaceAll(ip, ":", "_")+"-"+strconv.Itoa(port))
			if err := os.Mkdir(path, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("stack directory: %w", err)
			}
			d, err := lockStackDir(path)
			if err == nil || !errors.Is(err, errDirBusy) && !errors.Is(err, fs.ErrNotExist) {
				return d, err
			}
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
		}
		path, err := os.MkdirTemp(base, dirTmpPrefix)
		if err != nil {
			return nil, fmt.Errorf("stack directory: %w", err)
		}
		if err := os.Chmod(path, 0o711); err != nil {
			return nil, fmt.Errorf("stack directory: %w", err)
		}
		d, err := lockStackDir(path)
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errDirBusy) {
			return d, err
		}
	}
	return nil, errors.New("stack directory: removed by concurrent sweeps again and again")
}

// checkOwnDir refuses a base directory that is not a directory of ours:
// in a shared /tmp, anyone may have created it first.
func checkOwnDir(path string) error {
	info, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("stack directory: %w", err)
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !info.IsDir() || !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("stack directory: %s is not a directory owned by uid %d", path, os.Geteuid())
	}
	return nil
}

// lockStackDir takes path's lock: errDirBusy if a live stack holds it,
// fs.ErrNotExist if a sweep removed path meanwhile.
func lockStackDir(path string) (*stackDir, error) {
	lockPath := filepath.Join(path, dirLock)
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("stack directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errDirBusy
		}
		return nil, fmt.Errorf("stack directory: lock %s: %w", lockPath, err)
	}
	// The lock counts only if the file is still the directory's: a sweep
	// may have removed both between our open and our flock.
	held, err1 := f.Stat()
	now, err2 := os.Stat(lockPath)
	if err1 != nil || err2 != nil || !os.SameFile(held, now) {
		f.Close()
		return nil, fs.ErrNotExist
	}
	return &stackDir{path: path, lock: f}, nil
}

// sweepStackDirs removes the stack directories under base that no live
// stack holds and whose sandbox root runs no process. A directory whose
// sandboxes still run is left for the next stack on its port, whose
// sandbox server kills them.
func sweepStackDirs(base string) {
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		path := filepath.Join(base, e.Name())
		// No O_CREATE: a directory without its lock file yet is being created.
		f, err := os.OpenFile(filepath.Join(path, dirLock), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			if pids, err := localsandbox.SandboxProcesses(filepath.Join(path, dirSandbox)); err == nil && len(pids) == 0 {
				os.RemoveAll(path)
			}
		}
		f.Close()
	}
}

// sandboxRoot is the sandbox server's root in d.
func (d *stackDir) sandboxRoot() string { return filepath.Join(d.path, dirSandbox) }

// createLog creates (or truncates) d's log file.
func (d *stackDir) createLog() (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(d.path, dirLog), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("stack directory: %w", err)
	}
	return f, nil
}

// release lets the next stack have d (or sweep it).
func (d *stackDir) release() error { return d.lock.Close() }
