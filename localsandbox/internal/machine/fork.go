package machine

import (
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// CopyFiles copies the upper layer, workspace and tmp of the lease
// directory src (a paused lease, owned by from) into the new lease
// directory dst, whose root is to, preserving modes, timestamps, hard
// links, extended attributes (the overlay's user.overlay.* among them) and
// device nodes (the overlay's whiteouts), with GNU cp; then it moves the
// copies' owners into to's id range. A fork boots a fresh lease init over
// the copy, as a machine booted from a disk snapshot would.
//
// cp runs as root on trees the source's lease wrote, which is safe as
// package hostfs's rule requires: -a never dereferences a symlink of the
// source (it copies the link); the source is frozen, and its three
// directories are checked to be directories, not links (no lease reaches
// them: it sees them only as its overlay's upper layer and the mounts of
// /workspace and /tmp); the destination is new, below a lease directory
// no lease can write, and no process of the fork runs until it is made.
// The id shift that follows goes through hostfs.
func CopyFiles(src, dst string, from, to Owner) error {
	source, err := hostfs.Open(src)
	if err != nil {
		return err
	}
	defer source.Close()
	dirs := []string{leaseinit.UpperDir, leaseinit.WorkspaceDir, leaseinit.TmpDir}
	for _, dir := range dirs {
		d, err := source.OpenDir(dir)
		if err != nil {
			return fmt.Errorf("copying %s: %w", dir, err)
		}
		d.Close()
		f, t := filepath.Join(src, dir), filepath.Join(dst, dir)
		out, err := exec.Command("cp", "-a", "--preserve=all", "--no-target-directory", f, t).CombinedOutput()
		if err != nil {
			return fmt.Errorf("copying %s: %v: %.200s", dir, err, out)
		}
	}
	return shiftOwners(dst, dirs, from, to) // into the fork's own id range
}
