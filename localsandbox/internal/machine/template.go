package machine

import (
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"golang.org/x/sys/unix"
)

// CopyRootLayer copies what the lease of the lease directory src (a
// paused or stopped lease, owned by from) wrote over its image — its
// root's upper layer, upper/root — to dst, a new directory, and moves the
// copy's owners from from's id range into to's: the build layer of a
// template, which later leases mount read-only above their image. to is
// the owner of the image's own files (host root for a root server, whose
// lower layers are idmapped into each lease's range), so that the layer's
// files show in a lease as they did in the build.
//
// It copies as CopyFiles does, and is safe for the same reasons: cp -a
// never dereferences a symlink of the source, upper/root is checked to be
// a directory (no lease reaches it but as its overlay's upper layer), the
// source is not running, and dst is new, in a directory of the server's.
// The whiteouts and opaque directories of the overlay (device nodes and
// user.overlay.* attributes) are kept: a lower layer honours them too.
// It returns the bytes of the copy's regular files.
func CopyRootLayer(src, dst string, from, to Owner) (int64, error) {
	if err := copyShifted("copying the root layer", src, filepath.Join(leaseinit.UpperDir, "root"), dst, from, to); err != nil {
		return 0, err
	}
	layer, err := hostfs.Open(dst)
	if err != nil {
		return 0, err
	}
	defer layer.Close()
	var size int64
	err = layer.Walk(func(_ *hostfs.Dir, _ string, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			size += st.Size
		}
		return nil
	})
	return size, err
}

// CopyWorkspace copies the workspace of the lease directory src (a paused
// lease, owned by from) to dst, a new directory, and moves the copy's
// owners into to's id range: a template made from a live lease keeps its
// /workspace beside its layer, since /workspace is a mount of its own,
// not a part of the root's upper layer. It copies as CopyRootLayer does,
// and is safe for the same reasons.
func CopyWorkspace(src, dst string, from, to Owner) error {
	return copyShifted("copying the workspace", src, leaseinit.WorkspaceDir, dst, from, to)
}

// SeedWorkspace copies the workspace a template kept (CopyWorkspace),
// owned by from, into the empty workspace of the new lease directory dst,
// owned by to, before any process of the lease runs. The template's copy
// is the server's, in a directory no lease can write; the destination is
// not yet reachable by the lease.
func SeedWorkspace(src, dst string, from, to Owner) error {
	return copyShifted("seeding the workspace", filepath.Dir(src), filepath.Base(src), filepath.Join(dst, leaseinit.WorkspaceDir), from, to)
}

// copyShifted copies the directory rel of base (checked to be a
// directory reached through no symlink) to dst with cp -a, which never
// dereferences a symlink of the source, and moves the copy's owners from
// from's id range into to's. what names the copy in its errors.
func copyShifted(what, base, rel, dst string, from, to Owner) error {
	source, err := hostfs.Open(base)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	d, err := source.OpenDir(rel)
	source.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	d.Close()
	out, err := exec.Command("cp", "-a", "--preserve=all", "--no-target-directory", filepath.Join(base, rel), dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %.200s", what, err, out)
	}
	return shiftOwners(filepath.Dir(dst), []string{filepath.Base(dst)}, from, to)
}
