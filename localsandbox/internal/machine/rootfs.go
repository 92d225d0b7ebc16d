package machine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// The lease's root file system, as the server lays it out: which layers
// (an image, or the host's ReadOnlyPaths with masks), their upper and work
// directories, and the idmapped lower layers it hands the init, which
// builds it (leaseinit/rootfs.go says what the lease sees).

// Spec is one lease's machine as the server lays it out on the host.
type Spec struct {
	// Hostname is the lease's id.
	Hostname string
	// Dir is the lease directory, <root>/leases/<id>: upper/ and work/ of
	// the root file system's layers, workspace/ and tmp/
	// (leaseinit.UpperDir …).
	Dir string
	// Rootfs is the host path of the lease's image, the lower layer of
	// its /; empty, the lower layers are ReadOnlyPaths, each at its place
	// (the host image, which only an operator chooses).
	Rootfs string
	// Above are read-only layers over Rootfs, the topmost last: the build
	// layers of a template (and of the templates it was built from).
	Above         []string
	ReadOnlyPaths []string
	// Masks are paths of the lease's / that the init hides behind an
	// empty file or opaque directory of the lease's own
	// (leaseinit.Config.Masks): the host files of ReadOnlyPaths that are
	// not world-readable.
	Masks []string
	// Owner holds the host ids of the lease's root. With IDRange (a root
	// server) the lease's ids 0..IDsPerLease-1 are Owner's and those after
	// it; else the lease has its root alone.
	Owner   Owner
	IDRange bool
	// ServerRoot is the server's root directory, argv[1] of the init, by
	// which a server restarted on it finds what a crashed one left.
	ServerRoot string
	// MaxProcs and MaxOpenFiles are the RLIMIT_NPROC and RLIMIT_NOFILE of
	// the lease's commands.
	MaxProcs, MaxOpenFiles int
}

// idMappings are the user namespace's uid and gid maps: with a range of
// its own (a root server), ids 0..65535 to the lease's host ids; else root
// alone, to the lease's uid.
func (sp *Spec) idMappings() (uids, gids []syscall.SysProcIDMap) {
	size := 1
	if sp.IDRange {
		size = IDsPerLease
	}
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: sp.Owner.UID, Size: size}},
		[]syscall.SysProcIDMap{{ContainerID: 0, HostID: sp.Owner.GID, Size: size}}
}

// layers lays out the lease's root file system: the layers and symlinks,
// and the host paths of the lower layers.
func (sp *Spec) layers() ([]leaseinit.Layer, []leaseinit.Symlink, error) {
	if sp.Rootfs != "" {
		return []leaseinit.Layer{{Target: "/", Name: "root", Lower: sp.Rootfs, Above: sp.Above}}, nil, nil
	}
	layers := []leaseinit.Layer{{Target: "/", Name: "root"}}
	var links []leaseinit.Symlink
	for _, p := range sp.ReadOnlyPaths {
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
			links = append(links, leaseinit.Symlink{Path: p, Target: dest})
		case fi.IsDir():
			layers = append(layers, leaseinit.Layer{Target: p, Name: strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-"), Lower: p})
		}
	}
	return layers, links, nil
}

// MakeRoot creates the upper and work directories of the lease's layers,
// owned by the lease's root, and on a fresh root (not a fork's copy) the
// usual top directories of a root file system. Everything below the lease
// directory goes through package hostfs: a fork's copy holds what its
// source's lease wrote, symlinks to host paths included.
func (sp *Spec) MakeRoot() error {
	layers, _, err := sp.layers()
	if err != nil {
		return err
	}
	dir, err := hostfs.Open(sp.Dir)
	if err != nil {
		return err
	}
	defer dir.Close()
	own := sp.Owner.Host()
	freshRoot := false
	for _, top := range []string{leaseinit.UpperDir, leaseinit.WorkDir} {
		if _, err := dir.Mkdir(top, 0o755, own); err != nil {
			return err
		}
		for _, ly := range layers {
			made, err := dir.Mkdir(top+"/"+ly.Name, 0o755, own)
			if err != nil {
				return err
			}
			if top == leaseinit.UpperDir && ly.Target == "/" {
				freshRoot = made
			}
		}
	}
	if sp.Rootfs == "" && freshRoot {
		// The usual top of a root file system, empty, for the lease to
		// fill. A fork's copy has its source's, as the lease left them:
		// the server writes nothing into it.
		root, err := dir.OpenDir(leaseinit.UpperDir + "/root")
		if err != nil {
			return err
		}
		defer root.Close()
		for _, d := range skeletonDirs {
			if _, err := root.Mkdir(d.name, d.mode, own); err != nil {
				return err
			}
		}
	}
	return dir.Chmod(leaseinit.WorkDir, 0o700)
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

// setup is the configuration of a lease init with pid initPID and the
// descriptors to send with it (the caller closes them).
func (sp *Spec) setup(initPID int) (leaseinit.Config, []int, error) {
	layers, links, err := sp.layers()
	if err != nil {
		return leaseinit.Config{}, nil, err
	}
	cfg := leaseinit.Config{Hostname: sp.Hostname, LeaseDir: sp.Dir, Root: sp.ServerRoot, Symlinks: links, Masks: sp.Masks,
		MaxProcs: uint64(sp.MaxProcs), MaxOpenFiles: uint64(sp.MaxOpenFiles)}
	var fds []int
	fail := func(err error) (leaseinit.Config, []int, error) {
		closeFDs(fds)
		return leaseinit.Config{}, nil, err
	}
	var userns int = -1
	if os.Geteuid() == 0 {
		userns, err = unix.Open(fmt.Sprintf("/proc/%d/ns/user", initPID), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("the lease's user namespace: %w", err))
		}
		defer unix.Close(userns)
		cfg.MountFDs = true
		fd, err := unix.OpenTree(unix.AT_FDCWD, sp.Dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fail(fmt.Errorf("cloning %s: %w", sp.Dir, err))
		}
		fds = append(fds, fd)
	}
	for i := range layers {
		ly := &layers[i]
		if ly.Lower == "" || userns < 0 {
			continue
		}
		for _, dir := range append([]string{ly.Lower}, ly.Above...) {
			fd, err := idmappedClone(dir, userns)
			if err != nil {
				return fail(err)
			}
			fds = append(fds, fd)
		}
		ly.Lower, ly.LowerFD = "", true
		ly.Above = make([]string, len(ly.Above)) // by descriptor: only their number is sent
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

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// WriteRootFile writes file (an absolute path of the lease) into the upper
// layer of the lease's root that holds it, over the lower layer's, owned
// by the lease's root, with the directories it needs. It replaces what
// the lease left at that path (a symlink is replaced, not followed); a
// directory on the way that the lease made a symlink is an error
// (hostfs.IsRefused).
func (sp *Spec) WriteRootFile(file string, data []byte) error {
	layers, _, err := sp.layers()
	if err != nil {
		return err
	}
	var best *leaseinit.Layer
	for i := range layers {
		ly := &layers[i]
		if (ly.Target == "/" || strings.HasPrefix(file, ly.Target+"/")) && (best == nil || len(ly.Target) > len(best.Target)) {
			best = ly
		}
	}
	if best == nil {
		return nil
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(file, best.Target), "/")
	dir, err := hostfs.Open(sp.Dir)
	if err != nil {
		return err
	}
	defer dir.Close()
	upper, err := dir.OpenDir(leaseinit.UpperDir + "/" + best.Name)
	if err != nil {
		return err
	}
	defer upper.Close()
	own := sp.Owner.Host()
	if parent := path.Dir(rel); parent != "." {
		if err := upper.MkdirAll(parent, 0o755, own); err != nil {
			return err
		}
	}
	return upper.WriteFile(rel, data, 0o644, own)
}

// RemoveDir removes a lease directory (its disk unmounted first).
func RemoveDir(dir string) error {
	// The overlays leave their work/<layer>/work directories mode 000,
	// which only a root server could remove as they are.
	if d, err := hostfs.Open(dir); err == nil {
		if work, err := d.OpenDir(leaseinit.WorkDir); err == nil {
			work.Walk(func(parent *hostfs.Dir, name string, st *unix.Stat_t) error {
				if parent == work {
					return nil // work/<layer>: look inside
				}
				if name == "work" && st.Mode&unix.S_IFMT == unix.S_IFDIR {
					parent.Chmod(name, 0o700)
				}
				return fs.SkipDir
			})
			work.Close()
		}
		d.Close()
	}
	return hostfs.RemoveAll(dir)
}
