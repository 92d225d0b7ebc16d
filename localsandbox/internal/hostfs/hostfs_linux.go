package hostfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Beneath are the openat2 rules of every lookup the server makes on its
// own behalf in a lease's tree: stay below the directory, follow no
// symlink (nor magic link), cross no mount.
const Beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// MaxDepth bounds how deep Walk descends: it holds a descriptor per level,
// and a lease can nest directories without end.
const MaxDepth = 2048

// Owner is the host uid and gid to give what is made; a nil *Owner leaves
// the server's (a server that is not root cannot give files away, and its
// leases' ids are its own).
type Owner struct{ UID, GID int }

// Dir is an open directory of a tree a lease can write. Its methods take
// paths relative to it, slash-separated, clean and without "..": the
// names of the tree as the server laid it out, never a path a lease
// chose.
type Dir struct {
	fd   int
	name string // for errors
}

// Open opens the directory at path, which must be a path no lease can
// change (the lease directory below the server's root, or a directory
// in it the server made before any lease process ran); its last component
// must not be a symlink.
func Open(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{fd: fd, name: path}, nil
}

// Close closes d.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// FD is d's descriptor (O_PATH), for openat2 by the caller.
func (d *Dir) FD() int { return d.fd }

// Name is the path d was opened by, for messages.
func (d *Dir) Name() string { return d.name }

func (d *Dir) err(op, rel string, err error) error {
	return &os.PathError{Op: op, Path: path.Join(d.name, rel), Err: err}
}

// Openat2 is openat2(2) on dirfd, retried while a concurrent rename makes
// the kernel ask for it (EAGAIN), with O_CLOEXEC always.
func Openat2(dirfd int, rel string, flags int, mode uint32, resolve uint64) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve})
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// checkRel refuses a path that is not a clean relative name below d.
func checkRel(rel string) error {
	if rel == "" || rel == "." || path.IsAbs(rel) || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") || strings.ContainsRune(rel, 0) {
		return unix.EINVAL
	}
	return nil
}

// OpenDir opens the directory rel below d, following no symlink.
func (d *Dir) OpenDir(rel string) (*Dir, error) {
	if err := checkRel(rel); err != nil {
		return nil, d.err("open", rel, err)
	}
	fd, err := Openat2(d.fd, rel, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, Beneath)
	if err != nil {
		return nil, d.err("open", rel, err)
	}
	return &Dir{fd: fd, name: path.Join(d.name, rel)}, nil
}

// parent opens the directory that holds rel and returns it with rel's
// last component; close it with done.
func (d *Dir) parent(rel string) (p *Dir, base string, done func(), err error) {
	if err := checkRel(rel); err != nil {
		return nil, "", nil, d.err("open", rel, err)
	}
	dir, base := path.Split(rel)
	if dir == "" {
		return d, base, func() {}, nil
	}
	p, err = d.OpenDir(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return nil, "", nil, err
	}
	return p, base, func() { p.Close() }, nil
}

// Mkdir makes the directory rel with mode (exactly: the umask and
// mkdir's dropping of the sticky bit do not apply) owned by own, and says
// whether it made it. An existing directory is left as it is; an
// existing anything else (a symlink the lease planted) is an error.
func (d *Dir) Mkdir(rel string, mode os.FileMode, own *Owner) (made bool, err error) {
	p, base, done, err := d.parent(rel)
	if err != nil {
		return false, err
	}
	defer done()
	if err := unix.Mkdirat(p.fd, base, 0o700); err == unix.EEXIST {
		fd, err := Openat2(p.fd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, Beneath)
		if err != nil {
			return false, d.err("mkdir", rel, err)
		}
		unix.Close(fd)
		return false, nil
	} else if err != nil {
		return false, d.err("mkdir", rel, err)
	}
	if own != nil {
		if err := unix.Fchownat(p.fd, base, own.UID, own.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return true, d.err("chown", rel, err)
		}
	}
	return true, p.chmod(base, mode)
}

// MkdirAll makes rel and the directories above it that are missing, each
// with mode and owned by own; an existing component that is not a
// directory (a symlink) is an error.
func (d *Dir) MkdirAll(rel string, mode os.FileMode, own *Owner) error {
	if err := checkRel(rel); err != nil {
		return d.err("mkdir", rel, err)
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		if _, err := d.Mkdir(strings.Join(parts[:i+1], "/"), mode, own); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile makes rel a regular file holding data, with mode, owned by
// own: written to a new temporary file beside it and renamed over it, so
// that whatever rel was (a symlink the lease planted, a file someone holds
// open) is replaced, never written through. rel's directory must exist.
func (d *Dir) WriteFile(rel string, data []byte, mode os.FileMode, own *Owner) error {
	p, base, done, err := d.parent(rel)
	if err != nil {
		return err
	}
	defer done()
	tmp, err := tempName()
	if err != nil {
		return err
	}
	fd, err := Openat2(p.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600, Beneath)
	if err != nil {
		return d.err("create", rel, err)
	}
	f := os.NewFile(uintptr(fd), path.Join(d.name, rel))
	_, err = f.Write(data)
	if err == nil && own != nil {
		err = f.Chown(own.UID, own.GID)
	}
	if err == nil {
		err = f.Chmod(mode) // after chown, which clears set-id bits
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = unix.Renameat(p.fd, tmp, p.fd, base); err != nil {
			err = d.err("rename", rel, err)
		}
	}
	if err != nil {
		unix.Unlinkat(p.fd, tmp, 0)
	}
	return err
}

func tempName() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return ".sandboxd-" + hex.EncodeToString(b[:]), nil
}

// Chmod sets the mode of rel, which must not be a symlink.
func (d *Dir) Chmod(rel string, mode os.FileMode) error {
	p, base, done, err := d.parent(rel)
	if err != nil {
		return err
	}
	defer done()
	return p.chmod(base, mode)
}

// chmod sets the mode of name, in d: there is no fchmodat that refuses a
// symlink on every kernel, so the inode is opened O_PATH|O_NOFOLLOW,
// checked and changed through its /proc/thread-self/fd link, which names
// that inode and nothing else.
func (d *Dir) chmod(name string, mode os.FileMode) error {
	fd, err := Openat2(d.fd, name, unix.O_PATH|unix.O_NOFOLLOW, 0, Beneath)
	if err != nil {
		return d.err("chmod", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return d.err("chmod", name, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return d.err("chmod", name, unix.ELOOP)
	}
	if err := unix.Chmod("/proc/thread-self/fd/"+strconv.Itoa(fd), unixMode(mode)); err != nil {
		return d.err("chmod", name, err)
	}
	return nil
}

// unixMode is mode's permission and set-id bits as chmod(2) takes them.
func unixMode(mode os.FileMode) uint32 {
	m := uint32(mode.Perm())
	if mode&os.ModeSetuid != 0 {
		m |= unix.S_ISUID
	}
	if mode&os.ModeSetgid != 0 {
		m |= unix.S_ISGID
	}
	if mode&os.ModeSticky != 0 {
		m |= unix.S_ISVTX
	}
	return m
}

// Lchown gives rel (a symlink itself, not its target) to uid and gid.
func (d *Dir) Lchown(rel string, uid, gid int) error {
	p, base, done, err := d.parent(rel)
	if err != nil {
		return err
	}
	defer done()
	if err := unix.Fchownat(p.fd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return d.err("chown", rel, err)
	}
	return nil
}

// WalkFunc is called by Walk for each file: dir holds it, under name; st
// is its lstat. It may change the file through dir (Lchown, Chmod of name);
// fs.SkipDir keeps Walk out of a directory.
type WalkFunc func(dir *Dir, name string, st *unix.Stat_t) error

// Walk calls fn for every file below d, a directory before its contents.
// It descends only into real directories, opened by descriptor from
// their parent: no symlink is followed and no mount crossed, however the
// tree was made.
func (d *Dir) Walk(fn WalkFunc) error { return d.walk(fn, 0) }

func (d *Dir) walk(fn WalkFunc, depth int) error {
	if depth >= MaxDepth {
		return d.err("walk", "", fmt.Errorf("more than %d levels of directories", MaxDepth))
	}
	fd, err := Openat2(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, Beneath)
	if err != nil {
		return d.err("open", ".", err)
	}
	f := os.NewFile(uintptr(fd), d.name)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return d.err("lstat", name, err)
		}
		err := fn(d, name, &st)
		if err == fs.SkipDir {
			continue
		}
		if err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := d.OpenDir(name)
		if err != nil {
			return err
		}
		err = sub.walk(fn, depth+1)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// RemoveAll removes path and everything below it. It is os.RemoveAll,
// which on Linux already works by descriptor (unlinkat, and openat with
// O_NOFOLLOW to descend), so a symlink in the tree is removed, never
// followed; path itself must be one no lease can change.
func RemoveAll(path string) error { return os.RemoveAll(path) }

// IsRefused reports whether err is a lookup this package refused because
// it would have followed a symlink, crossed a mount or met a non-directory
// where a directory was needed: the tree is not as the server laid it out.
func IsRefused(err error) bool {
	return errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR)
}
