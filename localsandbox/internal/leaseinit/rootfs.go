package leaseinit

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// The lease's root file system, as the init builds it from the layers the
// server laid out.
//
// A lease's / is writable and its own: every write lands in the lease's
// upper directory (<lease>/upper) and vanishes with the lease. The
// read-only lower layer is an image (the server's default, or one the
// create named): / is one overlay of that tree and upper/root. Only with
// the host image, which an operator must offer, is it the host's system
// directories: / itself is then the lease's upper/root, and each of
// ReadOnlyPaths (/usr, /etc, …) an overlay of the host directory (lower)
// and upper/<name>; a merged-/usr symlink such as /bin -> usr/bin is
// recreated as a symlink, and each of Config.Masks — what is not
// world-readable on the host — is hidden by an empty file or opaque
// directory of the lease's own in the upper layer (hideInUpper).
//
//	/            overlay: image + upper/root
//	(a template: image + its build layers (Layer.Above) + upper/root)
//	(host image:
//	/            upper/root
//	/usr         overlay: host /usr + upper/usr
//	/etc         overlay: host /etc + upper/etc, masks)
//	/workspace   bind of <lease>/workspace (the files API's)
//	/tmp         bind of <lease>/tmp
//	/dev         a tmpfs built from scratch: null zero full random urandom, fd links, shm
//	/proc        the lease's own
//
// The lease's root is uid 0 of its user namespace and HostUID on the host;
// ids 1..65535 map to HostIDBase+1… When the server is root, each lower
// layer is an idmapped mount that shows the host's root-owned files as
// owned by the lease's root (the image's files belong to host root), so
// that tools which chown, write /etc or add users work (the overlay copies a file up, with its owner, on first
// write). A server that is not root maps only the lease's root and cannot
// idmap: files of the lower layer then show as owned by nobody.

// stagingDirs are host directories, reachable by anybody, one of which the
// init covers (in its private mount namespace only) with the tmpfs where
// it assembles the lease's root.
var stagingDirs = []string{"/tmp", "/mnt", "/var/tmp"}

// buildRoot builds the lease's view of the world, in the init (pid 1 of
// the lease's namespaces, root of its user namespace, HostUID on the host),
// and moves into it.
func buildRoot(cfg *Config, fds []int) error {
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
				for _, above := range ly.Above {
					held, err := hold(above)
					if err != nil {
						return err
					}
					lowers[i] = held + ":" + lowers[i] // overlay's lowerdir: the topmost first
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
		leaseDir, next = path.Join(stage, "lease"), 1
		if err := os.Mkdir(leaseDir, 0o700); err != nil {
			return err
		}
		if err := unix.MoveMount(fds[0], "", unix.AT_FDCWD, leaseDir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attaching the lease directory: %w", err)
		}
	}
	bind := func(rel, target string) error {
		return unix.Mount(path.Join(leaseDir, rel), target, "", unix.MS_BIND|unix.MS_REC, "")
	}
	root := path.Join(stage, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	for i, ly := range cfg.Layers {
		if strings.ContainsAny(ly.Name, "/,:\\") || ly.Name == "" || strings.ContainsAny(ly.Lower, ",:\\") ||
			slices.ContainsFunc(ly.Above, func(p string) bool { return strings.ContainsAny(p, ",:\\") }) {
			return fmt.Errorf("layer %q: bad name or path", ly.Name)
		}
		target := path.Join(root, ly.Target)
		if i > 0 {
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		}
		upper := path.Join(leaseDir, UpperDir, ly.Name)
		lower := lowers[i]
		if ly.LowerFD {
			if next >= len(fds) {
				return fmt.Errorf("layer %s: no mount", ly.Target)
			}
			lower = path.Join(stage, fmt.Sprintf("lower-%d", i))
			if err := os.Mkdir(lower, 0o755); err != nil {
				return err
			}
			if err := unix.MoveMount(fds[next], "", unix.AT_FDCWD, lower, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return fmt.Errorf("attaching the lower layer of %s: %w", ly.Target, err)
			}
			next++
			for j := range ly.Above {
				if next >= len(fds) {
					return fmt.Errorf("layer %s: no mount for layer %d above the lower one", ly.Target, j+1)
				}
				above := path.Join(stage, fmt.Sprintf("lower-%d-%d", i, j))
				if err := os.Mkdir(above, 0o755); err != nil {
					return err
				}
				if err := unix.MoveMount(fds[next], "", unix.AT_FDCWD, above, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
					return fmt.Errorf("attaching layer %d above the lower layer of %s: %w", j+1, ly.Target, err)
				}
				next++
				lower = above + ":" + lower // overlay's lowerdir: the topmost first
			}
		}
		if lower == "" {
			if err := bind(path.Join(UpperDir, ly.Name), target); err != nil {
				return fmt.Errorf("mounting %s: %w", ly.Target, err)
			}
			continue
		}
		if err := hideInUpper(upper, lower, ly.Target, cfg.Masks); err != nil {
			return err
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr", lower, upper, path.Join(leaseDir, WorkDir, ly.Name))
		if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mounting the overlay at %s: %w", ly.Target, err)
		}
	}
	for _, link := range cfg.Symlinks {
		p := path.Join(root, link.Path)
		if _, err := os.Lstat(p); err == nil {
			continue // the lease made it already, or changed it
		}
		if err := os.Symlink(link.Target, p); err != nil {
			return err
		}
	}
	if err := setupDev(path.Join(root, "dev")); err != nil {
		return err
	}
	for _, m := range []struct{ rel, mountpoint string }{
		{WorkspaceDir, Workspace},
		{TmpDir, Tmp},
	} {
		target := path.Join(root, m.mountpoint)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := bind(m.rel, target); err != nil {
			return fmt.Errorf("mounting %s: %w", m.mountpoint, err)
		}
	}
	procDir := path.Join(root, "proc")
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
	return LoopbackUp()
}

// hideInUpper makes the upper directory of a layer hide each of masks
// (absolute paths of the lease) that lies below target, the layer's place,
// in its lower layer: an empty file, or an opaque directory
// (user.overlay.opaque), of the lower's mode and owner stands in the
// upper layer in its place. The overlay then shows the lease its own empty
// file or directory instead of the host's, which the lease may write,
// remove or replace like any other of its files (useradd locks
// /etc/.pwd.lock) without ever reaching the lower one: a removal leaves a
// whiteout. An entry that the upper layer already has at that place (a
// fork's copy) hides the lower one already; a directory there is made
// opaque. Paths are resolved without following symlinks.
func hideInUpper(upper, lower, target string, masks []string) error {
	var rels []string
	for _, m := range masks {
		m = path.Clean("/" + m)
		if target == "/" {
			rels = append(rels, strings.TrimPrefix(m, "/"))
		} else if rel, ok := strings.CutPrefix(m, target+"/"); ok {
			rels = append(rels, rel)
		}
	}
	if len(rels) == 0 {
		return nil
	}
	upFD, err := unix.Open(upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(upFD)
	lowFD, err := unix.Open(lower, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(lowFD)
	for _, rel := range rels {
		if err := hideOne(upFD, lowFD, rel); err != nil {
			return fmt.Errorf("hiding %s/%s: %w", target, rel, err)
		}
	}
	return nil
}

// hideOne hides rel of the lower directory lowFD in the upper one upFD.
func hideOne(upFD, lowFD int, rel string) error {
	parts := strings.Split(rel, "/")
	if rel == "" || slices.Contains(parts, "..") || slices.Contains(parts, ".") || slices.Contains(parts, "") {
		return errors.New("not a clean relative path")
	}
	lowerStat := func(p string) (unix.Stat_t, bool, error) {
		var st unix.Stat_t
		fd, err := unix.Openat2(lowFD, p, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return st, false, nil
		}
		if err != nil {
			return st, false, err
		}
		defer unix.Close(fd)
		return st, true, unix.Fstat(fd, &st)
	}
	st, ok, err := lowerStat(rel)
	if err != nil || !ok || st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return err // nothing there, or a symlink, which reveals only its target
	}
	// The directories above it, in the upper layer, as the lower has them.
	dir, err := unix.Dup(upFD)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	for i, name := range parts[:len(parts)-1] {
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			pst, ok, serr := lowerStat(strings.Join(parts[:i+1], "/"))
			if serr != nil || !ok {
				return serr
			}
			if err := unix.Mkdirat(dir, name, pst.Mode&0o7777); err != nil {
				return err
			}
			unix.Fchownat(dir, name, int(pst.Uid), int(pst.Gid), unix.AT_SYMLINK_NOFOLLOW) // unmapped ids stay the init's
			next, err = unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil // the lease replaced a directory above it: the lower one is hidden
		}
		if err != nil {
			return err
		}
		unix.Close(dir)
		dir = next
	}
	name := parts[len(parts)-1]
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	var have unix.Stat_t
	switch err := unix.Fstatat(dir, name, &have, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		if have.Mode&unix.S_IFMT != unix.S_IFDIR || !isDir {
			return nil // the upper's own entry hides the lower one
		}
	case errors.Is(err, unix.ENOENT):
		if isDir {
			err = unix.Mkdirat(dir, name, st.Mode&0o7777)
		} else {
			var fd int
			fd, err = unix.Openat(dir, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, st.Mode&0o7777)
			if err == nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			return err
		}
		unix.Fchownat(dir, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		if err := unix.Fchmodat(dir, name, st.Mode&0o7777, 0); err != nil { // past the umask
			return err
		}
		if !isDir {
			return nil
		}
	default:
		return err
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsetxattr(fd, "user.overlay.opaque", []byte("y"), 0)
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
		target := path.Join(dev, name)
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
		if err := os.Symlink(dest, path.Join(dev, name)); err != nil {
			return err
		}
	}
	// A devpts of the lease's own (newinstance): its terminals are
	// numbered from 0 and listed in its /dev/pts alone, and /dev/ptmx
	// opens a terminal there, never one of the host's. At most
	// MaxTerminals, so that no lease takes the kernel's pool of
	// terminals (kernel.pty.max) from the others; the host's own
	// instance keeps its reserve (kernel.pty.reserve) whatever they do.
	pts := path.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, fmt.Sprintf("newinstance,ptmxmode=0666,mode=0620,max=%d", MaxTerminals)); err != nil {
		return fmt.Errorf("mounting /dev/pts: %w", err)
	}
	if err := os.Symlink("pts/ptmx", path.Join(dev, "ptmx")); err != nil {
		return err
	}
	shm := path.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=64m"); err != nil {
		return fmt.Errorf("mounting /dev/shm: %w", err)
	}
	return nil
}

// MaxTerminals bounds the terminals open at once in a lease.
const MaxTerminals = 256

func touch(file string) error {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// LoopbackUp brings up lo, the only interface of a new network namespace:
// the calling thread's. The init calls it for a namespace of its own; the
// server, for the namespaces it makes for its leases (package network).
func LoopbackUp() error {
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
		return nil // the server brought it up (package network)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	return nil
}
