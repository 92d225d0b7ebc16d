package localsandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The lease's root file system.
//
// A lease's / is writable and its own: every write lands in the lease's
// upper directory (<lease>/upper) and vanishes with the lease. By default
// the read-only lower layer is the host's system directories: / itself is
// the lease's upper/root, and each of ReadOnlyPaths (/usr, /etc, …) is an
// overlay of the host directory (lower) and upper/<name>; a merged-/usr
// symlink such as /bin -> usr/bin is recreated as a symlink. With a rootfs
// (Options.RootfsDir/<name>), / is one overlay of that tree and upper/root.
//
//	/            upper/root            (or overlay: rootfs + upper/root)
//	/usr         overlay: host /usr + upper/usr
//	/etc         overlay: host /etc + upper/etc
//	/workspace   bind of <lease>/workspace (the files API's)
//	/tmp         bind of <lease>/tmp
//	/dev         a tmpfs built from scratch: null zero full random urandom, fd links, shm
//	/proc        the lease's own
//
// The lease's root is uid 0 of its user namespace and HostUID on the host;
// ids 1..65535 map to HostIDBase+1… When the server is root, each lower
// layer is an idmapped mount that shows the host's root-owned files as
// owned by the lease's root, so that tools which chown, write /etc or add
// users work (the overlay copies a file up, with its owner, on first
// write). A server that is not root maps only the lease's root and cannot
// idmap: files of the lower layer then show as owned by nobody.

// rootLayer is one mount of the lease's root file system.
type rootLayer struct {
	Target string `json:"target"` // "/" or a path below it
	Name   string `json:"name"`   // upper/<Name> and work/<Name> in the lease directory
	// Lower is the host path of the read-only layer, which the init opens
	// itself; LowerFD says it comes as a (idmapped) detached mount instead.
	// Neither: Target is the upper directory itself.
	Lower   string `json:"lower,omitempty"`
	LowerFD bool   `json:"lower_fd,omitempty"`
}

// rootSymlink is a symlink of the lower layer's top, recreated in /.
type rootSymlink struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// machineConfig is the first message to a lease init. The descriptors
// attached to it: with MountFDs a detached mount of the lease directory
// (overlays and binds need their directories on a mount of the init's own
// mount namespace, and the init may not be able to reach it by path); then
// one detached mount per layer with LowerFD, in order. Without MountFDs (a
// server that is not root cannot make detached mounts) the init opens
// LeaseDir itself.
type machineConfig struct {
	Hostname     string        `json:"hostname"`
	LeaseDir     string        `json:"lease_dir"`
	MountFDs     bool          `json:"mount_fds"`
	Root         string        `json:"root"` // the server's root, argv[1] of supervisors
	Layers       []rootLayer   `json:"layers"`
	Symlinks     []rootSymlink `json:"symlinks,omitempty"`
	MaxProcs     uint64        `json:"max_procs"`
	MaxOpenFiles uint64        `json:"max_open_files"`
}

// idMappings are the user namespace's uid and gid maps: with a range of
// its own (a root server), ids 0..65535 to the lease's host ids; else root
// alone, to the lease's uid.
func (l *lease) idMappings() (uids, gids []syscall.SysProcIDMap) {
	size := 1
	if l.idSlot >= 0 {
		size = idsPerLease
	}
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: l.uid, Size: size}},
		[]syscall.SysProcIDMap{{ContainerID: 0, HostID: l.gid, Size: size}}
}

// upperNames are the directories of a lease's upper layer.
const (
	upperDir = "upper"
	workDir  = "work"
)

// rootLayers lays out the root file system of l: the layers and symlinks,
// and the host paths of the lower layers.
func (s *Server) rootLayers(l *lease) ([]rootLayer, []rootSymlink, error) {
	if l.rootfs != "" {
		return []rootLayer{{Target: "/", Name: "root", Lower: filepath.Join(s.opts.RootfsDir, l.rootfs)}}, nil, nil
	}
	layers := []rootLayer{{Target: "/", Name: "root"}}
	var links []rootSymlink
	for _, p := range s.opts.ReadOnlyPaths {
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			dest, err := os.Readlink(p)
			if err != nil {
				return nil, nil, err
			}
			links = append(links, rootSymlink{Path: p, Target: dest})
		case fi.IsDir():
			layers = append(layers, rootLayer{Target: p, Name: strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-"), Lower: p})
		}
	}
	return layers, links, nil
}

// makeLeaseRoot creates the upper and work directories of l's layers,
// owned by the lease's root.
func (s *Server) makeLeaseRoot(l *lease) error {
	layers, _, err := s.rootLayers(l)
	if err != nil {
		return err
	}
	for _, top := range []string{upperDir, workDir} {
		dirs := []string{filepath.Join(l.dir, top)}
		for _, ly := range layers {
			dirs = append(dirs, filepath.Join(l.dir, top, ly.Name))
		}
		for _, d := range dirs {
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			if err := l.chown(d); err != nil {
				return err
			}
		}
	}
	if l.rootfs == "" {
		// The usual top of a root file system, empty, for the lease to fill.
		for _, d := range skeletonDirs {
			p := filepath.Join(l.dir, upperDir, "root", d.name)
			if err := os.Mkdir(p, d.mode); errors.Is(err, os.ErrExist) {
				continue // a fork's copy has it, as the lease left it
			} else if err != nil {
				return err
			}
			if err := os.Chmod(p, d.mode); err != nil {
				return err
			}
			if err := l.chown(p); err != nil {
				return err
			}
		}
	}
	return os.Chmod(filepath.Join(l.dir, workDir), 0o700)
}

// skeletonDirs are the directories of a default root beside the lower
// layer's.
var skeletonDirs = []struct {
	name string
	mode os.FileMode
}{
	{"root", 0o700}, {"home", 0o755}, {"opt", 0o755}, {"srv", 0o755}, {"mnt", 0o755},
	{"run", 0o755}, {"var", 0o755}, {"var/tmp", 0o1777 | os.ModeSticky},
}

// machineSetup is the configuration of a lease init with pid initPID and
// the descriptors to send with it (the caller closes them).
func (s *Server) machineSetup(l *lease, initPID int) (machineConfig, []int, error) {
	layers, links, err := s.rootLayers(l)
	if err != nil {
		return machineConfig{}, nil, err
	}
	cfg := machineConfig{Hostname: l.id, LeaseDir: l.dir, Root: s.opts.Root, Symlinks: links,
		MaxProcs: uint64(s.opts.MaxProcesses), MaxOpenFiles: uint64(s.opts.MaxOpenFiles)}
	var fds []int
	fail := func(err error) (machineConfig, []int, error) {
		closeAll(fds)
		return machineConfig{}, nil, err
	}
	var userns int = -1
	if os.Geteuid() == 0 {
		userns, err = unix.Open(fmt.Sprintf("/proc/%d/ns/user", initPID), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("the lease's user namespace: %w", err))
		}
		defer unix.Close(userns)
		cfg.MountFDs = true
		fd, err := unix.OpenTree(unix.AT_FDCWD, l.dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fail(fmt.Errorf("cloning %s: %w", l.dir, err))
		}
		fds = append(fds, fd)
	}
	for i := range layers {
		ly := &layers[i]
		if ly.Lower == "" || userns < 0 {
			continue
		}
		fd, err := idmappedClone(ly.Lower, userns)
		if err != nil {
			return fail(err)
		}
		fds = append(fds, fd)
		ly.Lower, ly.LowerFD = "", true
	}
	cfg.Layers = layers
	return cfg, fds, nil
}

// idmappedClone returns a detached, read-only copy of the mount at dir
// whose files owned by host ids appear owned by the same ids of userns
// (host root's files by the lease's root).
func idmappedClone(dir string, userns int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("cloning %s: %w", dir, err)
	}
	attr := &unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmapping %s: %w", dir, err)
	}
	return fd, nil
}

// stagingDirs are host directories, reachable by anybody, one of which the
// init covers (in its private mount namespace only) with the tmpfs where
// it assembles the lease's root.
var stagingDirs = []string{"/tmp", "/mnt", "/var/tmp"}

// buildRoot builds the lease's view of the world, in the init (pid 1 of
// the lease's namespaces, root of its user namespace, HostUID on the host),
// and moves into it.
func buildRoot(cfg *machineConfig, fds []int) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// Without detached mounts, the lease directory and the lower layers are
	// held by descriptor before the staging tmpfs can hide them.
	hold := func(dir string) (string, error) {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("opening %s: %w", dir, err)
		}
		return fmt.Sprintf("/proc/self/fd/%d", fd), nil // closed at exec
	}
	leaseDir := ""
	lowers := make([]string, len(cfg.Layers))
	if !cfg.MountFDs {
		var err error
		if leaseDir, err = hold(cfg.LeaseDir); err != nil {
			return err
		}
		for i, ly := range cfg.Layers {
			if ly.Lower != "" && !ly.LowerFD {
				if lowers[i], err = hold(ly.Lower); err != nil {
					return err
				}
			}
		}
	}
	stage := ""
	for _, dir := range stagingDirs {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			stage = dir
			break
		}
	}
	if stage == "" {
		return errors.New("no staging directory for the root file system")
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=1m"); err != nil {
		return fmt.Errorf("mounting the staging tmpfs: %w", err)
	}
	next := 0
	if cfg.MountFDs {
		if len(fds) < 1 {
			return errors.New("no lease directory")
		}
		leaseDir, next = filepath.Join(stage, "lease"), 1
		if err := os.Mkdir(leaseDir, 0o700); err != nil {
			return err
		}
		if err := unix.MoveMount(fds[0], "", unix.AT_FDCWD, leaseDir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attaching the lease directory: %w", err)
		}
	}
	bind := func(rel, target string) error {
		return unix.Mount(filepath.Join(leaseDir, rel), target, "", unix.MS_BIND|unix.MS_REC, "")
	}
	root := filepath.Join(stage, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	for i, ly := range cfg.Layers {
		if strings.ContainsAny(ly.Name, "/,:\\") || ly.Name == "" || strings.ContainsAny(ly.Lower, ",:\\") {
			return fmt.Errorf("layer %q: bad name or path", ly.Name)
		}
		target := filepath.Join(root, ly.Target)
		if i > 0 {
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		}
		upper := filepath.Join(leaseDir, upperDir, ly.Name)
		lower := lowers[i]
		if ly.LowerFD {
			if next >= len(fds) {
				return fmt.Errorf("layer %s: no mount", ly.Target)
			}
			lower = filepath.Join(stage, fmt.Sprintf("lower-%d", i))
			if err := os.Mkdir(lower, 0o755); err != nil {
				return err
			}
			if err := unix.MoveMount(fds[next], "", unix.AT_FDCWD, lower, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return fmt.Errorf("attaching the lower layer of %s: %w", ly.Target, err)
			}
			next++
		}
		if lower == "" {
			if err := bind(filepath.Join(upperDir, ly.Name), target); err != nil {
				return fmt.Errorf("mounting %s: %w", ly.Target, err)
			}
			continue
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr", lower, upper, filepath.Join(leaseDir, workDir, ly.Name))
		if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mounting the overlay at %s: %w", ly.Target, err)
		}
	}
	for _, link := range cfg.Symlinks {
		p := filepath.Join(root, link.Path)
		if _, err := os.Lstat(p); err == nil {
			continue // the lease made it already, or changed it
		}
		if err := os.Symlink(link.Target, p); err != nil {
			return err
		}
	}
	if err := setupDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	for _, m := range []struct{ rel, mountpoint string }{
		{"workspace", sandboxWorkspace},
		{"tmp", sandboxTmp},
	} {
		target := filepath.Join(root, m.mountpoint)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := bind(m.rel, target); err != nil {
			return fmt.Errorf("mounting %s: %w", m.mountpoint, err)
		}
	}
	procDir := filepath.Join(root, "proc")
	if err := os.MkdirAll(procDir, 0o555); err != nil {
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
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	return loopbackUp()
}

// setupDev builds /dev from scratch: the harmless character devices bound
// from the host (no tty, no console), the usual /proc/self/fd symlinks and
// a small /dev/shm.
func setupDev(dev string) error {
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom"} {
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
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return nil // the server brought it up (network.go)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	return nil
}
