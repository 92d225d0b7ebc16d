package localsandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The init hook.
//
// Every managed process runs under a small supervisor, the "init": the server
// re-executes its own binary (/proc/self/exe) with argv[0] set to initArg0,
// and the package-level init function below takes over that process before
// main (or the test runner) ever runs. In namespace mode the init is pid 1 of
// a fresh set of namespaces: it builds the private root filesystem, starts
// the command as its only child, forwards termination signals to every
// process of the namespace, reaps every process (orphans come to pid 1), and
// exits only when none is left, so the server's wait on the init means "the
// whole tree has exited". In process-group mode it makes itself a child
// subreaper instead, with the same effect for its descendants.
//
// The hook does nothing in any other process: a program that links this
// package (sandboxd, a test binary) behaves normally unless it was started
// with that exact argv[0].

// initArg0 marks an init process. argv[1] is the server's root directory, so
// that a server restarted on the same root can find the inits a crashed
// predecessor left behind (see sweep.go).
const initArg0 = "sandboxflow-init"

// The init's file descriptors, as the server arranges them.
const (
	initConfigFD    = 3 // read: the JSON initConfig, then EOF
	initStatusFD    = 4 // write: initMessage lines
	initWorkspaceFD = 5 // a detached mount of the lease workspace (namespace mode, optional)
	initTmpFD       = 6 // a detached mount of the lease tmp dir (namespace mode, optional)
)

// initConfig is what the server tells an init to do.
type initConfig struct {
	Namespaces bool     `json:"namespaces"`
	Hostname   string   `json:"hostname,omitempty"`
	Argv       []string `json:"argv"`
	Cwd        string   `json:"cwd"` // absolute, as the command sees the file system
	Env        []string `json:"env"`
	// ReadOnlyPaths are host directories shown read-only at the same place
	// in the sandbox; a symlink is recreated as a symlink.
	ReadOnlyPaths []string `json:"read_only_paths,omitempty"`
	// WorkspacePath and TmpPath are the host directories to mount at
	// /workspace and /tmp when the server could not hand over detached
	// mounts (an unprivileged server: then the init runs as the server's own
	// uid and can reach them). In process-group mode WorkspacePath is where
	// relative working directories start.
	WorkspacePath string `json:"workspace_path"`
	TmpPath       string `json:"tmp_path"`
	MountFDs      bool   `json:"mount_fds"`
	MaxProcs      uint64 `json:"max_procs"`
	MaxOpenFiles  uint64 `json:"max_open_files"`
}

// initMessage is one line the init writes on its status descriptor: first
// Started or a Failure, later the command's exit status.
type initMessage struct {
	Started bool `json:"started,omitempty"`
	// Failure says why the command could not start; FailureKind is
	// "cwd", "command" (not found / not executable) or "setup".
	Failure     string `json:"failure,omitempty"`
	FailureKind string `json:"failure_kind,omitempty"`
	Exited      bool   `json:"exited,omitempty"`
	ExitCode    int    `json:"exit_code,omitempty"`
	Signal      string `json:"signal,omitempty"`
}

func init() {
	if len(os.Args) < 2 || os.Args[0] != initArg0 {
		return
	}
	os.Exit(runInit())
}

// The init's failure kinds.
const (
	failCwd     = "cwd"
	failCommand = "command"
	failSetup   = "setup"
)

type initFailure struct {
	kind string
	err  error
}

func (f *initFailure) Error() string { return f.err.Error() }

func runInit() int {
	// The descriptors from the server must not reach the command (which
	// could write a false exit status).
	for fd := initConfigFD; fd <= initTmpFD; fd++ {
		unix.CloseOnExec(fd)
	}
	status := os.NewFile(initStatusFD, "status")
	report := func(m initMessage) {
		b, _ := json.Marshal(m)
		status.Write(append(b, '\n'))
	}
	fail := func(err error) int {
		f := &initFailure{kind: failSetup, err: err}
		errors.As(err, &f)
		report(initMessage{Failure: f.err.Error(), FailureKind: f.kind})
		return 1
	}

	var cfg initConfig
	cfgFile := os.NewFile(initConfigFD, "config")
	if err := json.NewDecoder(cfgFile).Decode(&cfg); err != nil {
		return fail(fmt.Errorf("reading the configuration: %w", err))
	}
	cfgFile.Close()
	if len(cfg.Argv) == 0 {
		return fail(errors.New("no command"))
	}

	if cfg.Namespaces {
		if err := setupNamespaces(&cfg); err != nil {
			return fail(err)
		}
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("becoming a subreaper: %w", err))
	}
	if err := applyRlimits(&cfg); err != nil {
		return fail(err)
	}
	if err := os.Chdir(cfg.Cwd); err != nil {
		return fail(&initFailure{failCwd, fmt.Errorf("working directory %s: %w", cfg.Cwd, unwrapPathError(err))})
	}
	path, err := lookPath(cfg.Argv[0], cfg.Env)
	if err != nil {
		return fail(&initFailure{failCommand, err})
	}

	// Subscribe before the command exists, so that no signal is lost.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwardedSignals()...)

	attr := &syscall.ProcAttr{Env: cfg.Env, Files: []uintptr{0, 1, 2}}
	if !cfg.Namespaces {
		// In a namespace the kernel kills the command when pid 1 dies.
		attr.Sys = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	pid, err := syscall.ForkExec(path, cfg.Argv, attr)
	if err != nil {
		return fail(&initFailure{failCommand, fmt.Errorf("%s: %w", cfg.Argv[0], err)})
	}
	// The command owns its stdio now; the init keeps no copy, so that the
	// server sees end-of-file once the command's tree has closed them.
	if null, err := os.OpenFile("/dev/null", os.O_RDWR, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			unix.Dup3(int(null.Fd()), fd, 0)
		}
		null.Close()
	}
	report(initMessage{Started: true})

	go forwardSignals(sigs, cfg.Namespaces)
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.ECHILD:
			// Nobody is left: in a namespace pid 1 inherits every orphan, and
			// outside one the subreaper does.
			return 0
		case err != nil:
			return 1
		}
		if wpid == pid {
			if ws.Signaled() {
				report(initMessage{Exited: true, Signal: unix.SignalName(ws.Signal())})
			} else {
				report(initMessage{Exited: true, ExitCode: ws.ExitStatus()})
			}
		}
	}
}

// forwardedSignals are the signals the init passes on to its tree. SIGKILL
// and SIGSTOP need no forwarding: the server sends SIGKILL to the init (which
// in a namespace kills every process of it) and freezes trees itself.
func forwardedSignals() []os.Signal {
	return []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM}
}

func forwardSignals(sigs <-chan os.Signal, namespaces bool) {
	for sig := range sigs {
		s := sig.(syscall.Signal)
		if namespaces {
			// From pid 1, kill(-1) reaches every other process of the namespace.
			syscall.Kill(-1, s)
			continue
		}
		if table, err := readProcTable(); err == nil {
			self := os.Getpid()
			for _, pid := range table.tree(self) {
				if pid != self {
					syscall.Kill(pid, s)
				}
			}
		}
	}
}

func applyRlimits(cfg *initConfig) error {
	// syscall.Setrlimit (not unix.Setrlimit) so that the Go runtime does not
	// restore its own RLIMIT_NOFILE in the command.
	for _, l := range []struct {
		name     string
		resource int
		value    uint64
	}{
		{"RLIMIT_NPROC", unix.RLIMIT_NPROC, cfg.MaxProcs},
		{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE, cfg.MaxOpenFiles},
		{"RLIMIT_CORE", unix.RLIMIT_CORE, 0},
	} {
		if l.value == 0 && l.resource != unix.RLIMIT_CORE {
			continue
		}
		if err := syscall.Setrlimit(l.resource, &syscall.Rlimit{Cur: l.value, Max: l.value}); err != nil {
			return fmt.Errorf("setting %s: %w", l.name, err)
		}
	}
	return nil
}

// lookPath finds a command the way execvp would, using the PATH of the
// command's environment.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return name, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		candidate := filepath.Join(dir, name)
		if executable(candidate) == nil {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return unwrapPathError(err)
	}
	if fi.IsDir() {
		return errors.New("is a directory")
	}
	return unix.Access(path, unix.X_OK)
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// stagingDirs are host directories, reachable by anybody, one of which the
// init covers (in its private mount namespace only) with the tmpfs that
// becomes the sandbox's root.
var stagingDirs = []string{"/tmp", "/mnt", "/var/tmp"}

// setupNamespaces builds the sandbox's view of the world. The init is pid 1
// of new user, PID, mount, UTS, IPC and network namespaces, root of its user
// namespace and nobody on the host.
func setupNamespaces(cfg *initConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// Without detached mounts from the server, hold the lease directories by
	// descriptor before the staging tmpfs can hide them.
	sources := [2]string{}
	if !cfg.MountFDs {
		for i, p := range []string{cfg.WorkspacePath, cfg.TmpPath} {
			fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("opening a lease directory: %w", err)
			}
			defer unix.Close(fd)
			sources[i] = fmt.Sprintf("/proc/self/fd/%d", fd)
		}
	}
	root := ""
	for _, dir := range stagingDirs {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			root = dir
			break
		}
	}
	if root == "" {
		return errors.New("no staging directory for the root file system")
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mounting the root tmpfs: %w", err)
	}
	for _, p := range cfg.ReadOnlyPaths {
		if err := showReadOnly(p, filepath.Join(root, p)); err != nil {
			return err
		}
	}
	if err := setupDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	for _, m := range []struct {
		fd         int
		source     string
		mountpoint string
	}{
		{initWorkspaceFD, sources[0], sandboxWorkspace},
		{initTmpFD, sources[1], sandboxTmp},
	} {
		target := filepath.Join(root, m.mountpoint)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		var err error
		if cfg.MountFDs {
			err = unix.MoveMount(m.fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH)
			unix.Close(m.fd)
		} else {
			err = unix.Mount(m.source, target, "", unix.MS_BIND|unix.MS_REC, "")
		}
		if err != nil {
			return fmt.Errorf("mounting %s: %w", m.mountpoint, err)
		}
	}
	procDir := filepath.Join(root, "proc")
	if err := os.Mkdir(procDir, 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", procDir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// lazy unmount then drops it, and with it every host path.
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("making / read-only: %w", err)
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	return loopbackUp()
}

// showReadOnly makes the host path visible read-only at target.
func showReadOnly(hostPath, target string) error {
	fi, err := os.Lstat(hostPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		// Merged /usr: /bin -> usr/bin stays a symlink.
		dest, err := os.Readlink(hostPath)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.Symlink(dest, target)
	}
	if fi.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else {
		err = touch(target)
	}
	if err != nil {
		return err
	}
	if err := unix.Mount(hostPath, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s: %w", hostPath, err)
	}
	return remountReadOnly(target)
}

// remountReadOnly makes a bind mount read-only. In a user namespace the
// flags the host mount was made with (nosuid, noexec, atime handling) are
// locked and must be kept, so they are read back and repeated.
func remountReadOnly(target string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID)
	for _, f := range []struct{ st, ms uintptr }{
		{unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if uintptr(st.Flags)&f.st != 0 {
			flags |= f.ms
		}
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", target, err)
	}
	return nil
}

// setupDev builds a minimal /dev: the harmless character devices bound from
// the host, the usual /proc/self/fd symlinks and a small /dev/shm.
func setupDev(dev string) error {
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if _, err := os.Stat("/dev/" + name); err != nil {
			continue // not on this host
		}
		target := filepath.Join(dev, name)
		if err := touch(target); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+name, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", name, err)
		}
	}
	for name, dest := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(dest, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=64m"); err != nil {
		return fmt.Errorf("mounting /dev/shm: %w", err)
	}
	return nil
}

func touch(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// loopbackUp brings up lo, the only interface of the new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	return nil
}
