package localsandbox

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
)

// The files API (PUT/GET /files?path=, docs/CREATEOS-API.md §3.5) reads and
// writes any file of the lease's own root, as its processes see it.
//
// The server reaches that root through the lease's init, as runc and
// nsenter reach a container's: /proc/<init>/root, opened once with O_PATH
// while the lease is running (a destroy waits for the open, so the pid is
// the init's), is the lease's "/" in its own mount namespace — its overlay,
// /workspace, /tmp. Every lookup below it is openat2 with RESOLVE_IN_ROOT:
// the lease's symlinks are followed as the lease would follow them, but an
// absolute one, or "..", stops at the lease's root, and a rename race makes
// the kernel answer EAGAIN (retried) instead of leaving it; magic links
// (/proc/<pid>/root, /proc/self/fd/N) are refused. What the lookup reaches
// is checked once more by descriptor: never a file of /proc, /sys or /dev
// (their file systems, or the mounts of the lease's /dev and /dev/shm),
// never anything but a regular file.
//
// Writes are made with the file system ids of the lease's root (setfsuid
// on a thread of their own), so that what the server creates is owned as
// the lease's root would own it, and a file of the image's read-only layer
// is copied up by the overlay exactly as for the lease's root; the thread
// has no power to override permissions (CAP_DAC_OVERRIDE is dropped with
// the ids), so a file the lease's root could write only by overriding its
// mode (0444) is refused (403). Missing parents are made (PROTOCOL.md §10),
// the body goes to a temporary file beside the target and is renamed over
// it, so a rejected or oversized upload leaves nothing; a symlink at the
// path itself is replaced, not written through, and an existing file keeps
// its permissions.
//
// In process-group mode there is no lease root: paths are the lease's two
// host directories (workspace, tmp), resolved with RESOLVE_BENEATH.

// fileRoot is where a files request resolves its path.
type fileRoot struct {
	fd      int    // an O_PATH directory: the lease's root, or its workspace or tmp
	rel     string // the path below fd, clean, relative and never empty
	resolve uint64 // the openat2 rules of every lookup below fd
	// devs are the devices of the lease's /dev and /dev/shm: nothing on
	// them is a file of the API.
	devs []uint64
	own  *hostfs.Owner // the file system ids writes are made with; nil: the server's
}

func (fr *fileRoot) Close() { unix.Close(fr.fd) }

// inRoot are the openat2 rules of a lookup in a lease's root.
const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// beneath are the openat2 rules of a lookup below a process-group lease's
// workspace or tmp.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// refusedTrees are the lease's directories whose files the API refuses:
// not files of its disk, and reading some would block or act.
var refusedTrees = []string{"/proc", "/sys", "/dev"}

// checkFilePath checks p, a path of the lease, and returns it clean.
func checkFilePath(p string) (string, error) {
	switch {
	case p == "":
		return "", badRequest("path is required")
	case strings.ContainsRune(p, 0):
		return "", badRequest("path must not contain NUL")
	case !path.IsAbs(p):
		return "", badRequest("path must be absolute")
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", badRequest("path must not contain '..'")
		}
	}
	return path.Clean(p), nil
}

// openFileRoot opens where the file p of the lease is resolved.
func (l *lease) openFileRoot(p string) (*fileRoot, error) {
	p, err := checkFilePath(p)
	if err != nil {
		return nil, err
	}
	if l.isolation != IsolationNamespaces {
		return l.openHostDirRoot(p)
	}
	for _, tree := range refusedTrees {
		if p == tree || strings.HasPrefix(p, tree+"/") {
			return nil, badRequest("path is below %s: not a file of the sandbox's disk", tree)
		}
	}
	if p == "/" {
		return nil, badRequest("path is a directory")
	}
	fd, err := l.openRoot()
	if err != nil {
		return nil, err
	}
	fr := &fileRoot{fd: fd, rel: p[1:], resolve: inRoot, own: l.owner().Host()}
	for _, dev := range []string{"dev", "dev/shm"} {
		var st unix.Stat_t
		if err := fr.stat(dev, &st); err == nil {
			fr.devs = append(fr.devs, st.Dev)
		}
	}
	return fr, nil
}

// openRoot opens the lease's root as its processes see it: its init's
// root. The lease must be running, and its init cannot exit meanwhile: a
// pause or destroy waits for l.spawning, so the pid names the init and no
// other process. The descriptor keeps the tree reachable after that, even
// once the lease is destroyed (what is written then goes with it).
func (l *lease) openRoot() (int, error) {
	l.mu.Lock()
	state, m := l.state, l.machine
	if state != stateRunning || m == nil {
		l.mu.Unlock()
		if state == stateDestroyed {
			return -1, notFound("sandbox")
		}
		return -1, conflict(fmt.Sprintf("the sandbox is %s: its files are reached while it runs", state))
	}
	l.spawning.Add(1)
	l.mu.Unlock()
	defer l.spawning.Done()
	fd, err := unix.Open("/proc/"+strconv.Itoa(m.Pid())+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the root of sandbox %s: %w", l.id, err)
	}
	return fd, nil
}

// openHostDirRoot is openFileRoot in process-group mode: p must be below
// the lease's workspace or tmp, which are host directories.
func (l *lease) openHostDirRoot(p string) (*fileRoot, error) {
	for _, dir := range []string{l.workspaceHost, l.tmpHost} {
		rel, ok := strings.CutPrefix(p, dir+"/")
		if !ok {
			continue
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		return &fileRoot{fd: fd, rel: rel, resolve: beneath, own: l.owner().Host()}, nil
	}
	return nil, badRequest("path must be a file below %s or %s", l.workspace, l.tmp)
}

// open is openat2 of rel below the root, by its rules.
func (fr *fileRoot) open(rel string, flags int) (int, error) {
	return hostfs.Openat2(fr.fd, rel, flags, 0, fr.resolve)
}

// stat is the stat of rel below the root, following its symlinks there.
func (fr *fileRoot) stat(rel string, st *unix.Stat_t) error {
	fd, err := fr.open(rel, unix.O_PATH)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fstat(fd, st)
}

// checkReached refuses what a lookup reached (fd, whose stat is st) when
// it is a file of /proc, /sys or /dev, however the path led there.
func (fr *fileRoot) checkReached(fd int, st *unix.Stat_t) error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return err
	}
	switch fs.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.DEVPTS_SUPER_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC:
		return badRequest("path leads into /proc, /sys or /dev: not a file of the sandbox's disk")
	}
	for _, dev := range fr.devs {
		if st.Dev == dev {
			return badRequest("path leads into /dev: not a file of the sandbox's disk")
		}
	}
	return nil
}

// asOwner runs fn with the file system ids of fr.own: on a thread locked
// to this goroutine, whose fsuid and fsgid are set (which also drops the
// thread's power to override file permissions) and restored after. A
// thread that cannot be restored is not given back: it ends with the
// goroutine.
func (fr *fileRoot) asOwner(fn func() error) error {
	if fr.own == nil {
		return fn()
	}
	runtime.LockOSThread()
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	// Restored however fn ends, a panic included (the server recovers
	// handlers' panics and the goroutine serves the connection's next
	// request); a thread whose ids did not come back stays locked, and so
	// ends with its goroutine.
	defer func() {
		unix.Setfsuid(uid)
		unix.Setfsgid(gid)
		nowUID, _ := unix.SetfsuidRetUid(-1)
		nowGID, _ := unix.SetfsgidRetGid(-1)
		if nowUID == uid && nowGID == gid {
			runtime.UnlockOSThread()
		}
	}()
	unix.Setfsgid(fr.own.GID)
	unix.Setfsuid(fr.own.UID)
	return fn()
}

// pathError maps a lookup failure to its answer.
func pathError(err error) error {
	var apiErr *apiError
	switch {
	case errors.As(err, &apiErr):
		return err
	case errors.Is(err, unix.ENOENT):
		return notFound("file")
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return badRequest("path goes through a symlink that is not allowed here")
	case errors.Is(err, unix.ENOTDIR):
		return badRequest("a parent of the path is not a directory")
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTEMPTY):
		return badRequest("path is a directory")
	case errors.Is(err, unix.ENAMETOOLONG):
		return badRequest("path is too long")
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return &apiError{http.StatusForbidden, "permission denied to the sandbox's root"}
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return &apiError{http.StatusInsufficientStorage, "the sandbox's disk is full"}
	}
	return err
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	fr, err := l.openFileRoot(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	defer fr.Close()
	// O_NONBLOCK keeps a FIFO from blocking the open.
	fd, err := fr.open(fr.rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return pathError(err)
	}
	f := os.NewFile(uintptr(fd), fr.rel)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := fr.checkReached(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return badRequest("path is not a regular file")
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size, 10))
	w.WriteHeader(http.StatusOK)
	io.CopyN(w, f, st.Size)
	return nil
}

// putFile answers PUT /files?path=: the body becomes the file, its missing
// parents made, all owned by the lease's root; the answer says {bytes,
// path}.
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	if r.ContentLength > s.opts.MaxFileBytes {
		return &apiError{http.StatusRequestEntityTooLarge, "file exceeds the upload limit"}
	}
	fr, err := l.openFileRoot(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	defer fr.Close()
	dir, name := path.Split(fr.rel)
	dirfd, fd := -1, -1
	var tmpName string
	var mode uint32 = 0o644
	err = fr.asOwner(func() error {
		var err error
		if dirfd, err = fr.makeDirs(strings.TrimSuffix(dir, "/")); err != nil {
			return err
		}
		var st unix.Stat_t
		switch err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
		case err == unix.ENOENT:
		case err != nil:
			return err
		case st.Mode&unix.S_IFMT == unix.S_IFREG:
			mode = st.Mode & 0o777 // an existing file keeps its permissions
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return unix.EISDIR
		case st.Mode&unix.S_IFMT != unix.S_IFLNK: // a symlink is replaced
			return badRequest("path is not a regular file")
		}
		tmpName = newID(".sandboxd-upload-")
		fd, err = hostfs.Openat2(dirfd, tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600, fr.resolve|unix.RESOLVE_NO_SYMLINKS)
		return err
	})
	if err != nil {
		if dirfd >= 0 {
			unix.Close(dirfd)
		}
		return pathError(err)
	}
	defer unix.Close(dirfd)
	f := os.NewFile(uintptr(fd), tmpName)
	written, err := io.Copy(f, http.MaxBytesReader(w, r.Body, s.opts.MaxFileBytes))
	err = fr.asOwner(func() error {
		if err == nil {
			err = f.Chmod(os.FileMode(mode))
		}
		if closeErr := f.Close(); err == nil {
			err = closeErr
		}
		if err == nil {
			err = unix.Renameat(dirfd, tmpName, dirfd, name)
		}
		if err != nil {
			unix.Unlinkat(dirfd, tmpName, 0)
		}
		return err
	})
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return &apiError{http.StatusRequestEntityTooLarge, "file exceeds the upload limit"}
		}
		var apiErr *apiError
		if err := pathError(err); errors.As(err, &apiErr) {
			return err
		}
		return badRequest("the upload failed")
	}
	return writeData(w, map[string]any{"bytes": written, "path": path.Clean(r.URL.Query().Get("path"))})
}

// makeDirs opens the directory rel below the root, making what is missing
// of it (mkdir -p, with the caller's file system ids), each lookup from the
// root by its rules; "" is the root itself. What it reaches must not be in
// /proc, /sys or /dev.
func (fr *fileRoot) makeDirs(rel string) (int, error) {
	fd, err := fr.openDir(".")
	if err != nil || rel == "" {
		return fd, err
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		next, err := fr.openDir(strings.Join(parts[:i+1], "/"))
		if err == unix.ENOENT {
			// Made in the directory reached so far, then looked up again
			// from the root: a name the lease swapped meanwhile is
			// resolved by the same rules.
			if err = unix.Mkdirat(fd, parts[i], 0o755); err == nil || err == unix.EEXIST {
				next, err = fr.openDir(strings.Join(parts[:i+1], "/"))
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// openDir opens the directory rel below the root, which must not be in
// /proc, /sys or /dev.
func (fr *fileRoot) openDir(rel string) (int, error) {
	fd, err := fr.open(rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	if err == nil {
		err = fr.checkReached(fd, &st)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
