package localsandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"golang.org/x/sys/unix"
)

// The lease's root file system, as the server lays it out: which layers
// (the host's ReadOnlyPaths, or a rootfs), their upper and work
// directories, and the idmapped lower layers it hands the init, which
// builds it (leaseinit/rootfs.go says what the lease sees).

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

// rootLayers lays out the root file system of l: the layers and symlinks,
// and the host paths of the lower layers.
func (s *Server) rootLayers(l *lease) ([]leaseinit.Layer, []leaseinit.Symlink, error) {
	if l.rootfs != "" {
		return []leaseinit.Layer{{Target: "/", Name: "root", Lower: filepath.Join(s.opts.RootfsDir, l.rootfs)}}, nil, nil
	}
	layers := []leaseinit.Layer{{Target: "/", Name: "root"}}
	var links []leaseinit.Symlink
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
			links = append(links, leaseinit.Symlink{Path: p, Target: dest})
		case fi.IsDir():
			layers = append(layers, leaseinit.Layer{Target: p, Name: strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-"), Lower: p})
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
	for _, top := range []string{leaseinit.UpperDir, leaseinit.WorkDir} {
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
			p := filepath.Join(l.dir, leaseinit.UpperDir, "root", d.name)
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
	return os.Chmod(filepath.Join(l.dir, leaseinit.WorkDir), 0o700)
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
func (s *Server) machineSetup(l *lease, initPID int) (leaseinit.Config, []int, error) {
	layers, links, err := s.rootLayers(l)
	if err != nil {
		return leaseinit.Config{}, nil, err
	}
	cfg := leaseinit.Config{Hostname: l.id, LeaseDir: l.dir, Root: s.opts.Root, Symlinks: links,
		MaxProcs: uint64(s.opts.MaxProcesses), MaxOpenFiles: uint64(s.opts.MaxOpenFiles)}
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

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
