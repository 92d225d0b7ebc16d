package localsandbox

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
)

// Files are confined to the lease's workspace and tmp directory. A path
// names them as the lease's processes see them (/workspace/…, /tmp/… in
// namespace mode, the host paths in process-group mode); every lookup below
// them goes through openat2 with RESOLVE_BENEATH, so no symlink, "..", or
// rename race can lead outside. Writes never follow a symlink at all.

// resolveBeneath are the openat2 rules of every lookup.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// confine maps a path of the lease to the host directory that holds it and
// the path relative to that directory.
func (l *lease) confine(p string) (base, rel string, err error) {
	switch {
	case p == "":
		return "", "", badRequest("path is required")
	case strings.ContainsRune(p, 0):
		return "", "", badRequest("path must not contain NUL")
	case !path.IsAbs(p):
		return "", "", badRequest("path must be absolute")
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", "", badRequest("path must not contain '..'")
		}
	}
	p = path.Clean(p)
	for _, dir := range []struct{ visible, host string }{
		{l.workspace, l.workspaceHost},
		{l.tmp, l.tmpHost},
	} {
		if rel, ok := strings.CutPrefix(p, dir.visible+"/"); ok {
			return dir.host, rel, nil
		}
	}
	return "", "", badRequest("path must be a file below %s or %s", l.workspace, l.tmp)
}

// pathError maps a lookup failure to its answer.
func pathError(err error) error {
	switch {
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
	}
	return err
}

// openBeneath is hostfs.Openat2: the files API's lookups are package
// hostfs's, with the rules above.
func openBeneath(dirfd int, rel string, flags uint64, mode uint64, resolve uint64) (int, error) {
	return hostfs.Openat2(dirfd, rel, int(flags), uint32(mode), resolve)
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	base, rel, err := l.confine(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	root, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	// Symlinks that stay below the directory are followed, as a process of
	// the lease would; O_NONBLOCK keeps a FIFO from blocking the open.
	fd, err := openBeneath(root, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0, resolveBeneath)
	if err != nil {
		return pathError(err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return badRequest("path is not a regular file")
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.WriteHeader(http.StatusOK)
	io.CopyN(w, f, fi.Size())
	return nil
}

// putFile answers PUT /files?path=: the body becomes the file, created with
// its missing parents and owned by the lease's uid; the answer says
// {bytes, path}. The body goes to a
// temporary file first, renamed into place once complete, so a rejected or
// broken upload leaves nothing behind.
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) error {
	l, err := s.lookupLease(r)
	if err != nil {
		return err
	}
	base, rel, err := l.confine(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	if r.ContentLength > s.opts.MaxFileBytes {
		return &apiError{http.StatusRequestEntityTooLarge, "file exceeds the upload limit"}
	}
	dirfd, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	parts := strings.Split(rel, "/")
	for _, part := range parts[:len(parts)-1] {
		next, err := s.openOrMakeDir(l, dirfd, part)
		unix.Close(dirfd)
		if err != nil {
			return pathError(err)
		}
		dirfd = next
	}
	defer unix.Close(dirfd)
	name := parts[len(parts)-1]

	tmpName := newID(".sandboxd-upload-")
	fd, err := openBeneath(dirfd, tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o644,
		resolveBeneath|unix.RESOLVE_NO_SYMLINKS)
	if err != nil {
		return pathError(err)
	}
	f := os.NewFile(uintptr(fd), tmpName)
	written, err := io.Copy(f, http.MaxBytesReader(w, r.Body, s.opts.MaxFileBytes))
	if err == nil && os.Geteuid() == 0 {
		err = f.Chown(l.uid, l.gid)
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = unix.Renameat(dirfd, tmpName, dirfd, name)
		if err != nil {
			err = pathError(err)
		}
	}
	if err != nil {
		unix.Unlinkat(dirfd, tmpName, 0)
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return &apiError{http.StatusRequestEntityTooLarge, "file exceeds the upload limit"}
		}
		var apiErr *apiError
		if errors.As(err, &apiErr) {
			return err
		}
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return &apiError{http.StatusInsufficientStorage, "the sandbox's disk is full"}
		}
		return badRequest("the upload failed")
	}
	return writeData(w, map[string]any{"bytes": written, "path": path.Clean(r.URL.Query().Get("path"))})
}

// openOrMakeDir opens the directory name below dirfd, creating it (owned by
// the lease) if missing. It never follows a symlink.
func (s *Server) openOrMakeDir(l *lease, dirfd int, name string) (int, error) {
	for attempt := 0; ; attempt++ {
		fd, err := openBeneath(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0,
			resolveBeneath|unix.RESOLVE_NO_SYMLINKS)
		if err != unix.ENOENT || attempt > 0 {
			return fd, err
		}
		if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && err != unix.EEXIST {
			return -1, err
		}
		if os.Geteuid() == 0 {
			if err := unix.Fchownat(dirfd, name, l.uid, l.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return -1, err
			}
		}
	}
}
