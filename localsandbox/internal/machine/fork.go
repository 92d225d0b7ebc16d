package machine

import (
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// CopyFiles copies the upper layer, workspace and tmp of the lease
// directory src (a paused lease, owned by from) into the new lease
// directory dst, whose root is to, preserving modes, timestamps, hard
// links, extended attributes (the overlay's user.overlay.* among them) and
// device nodes (the overlay's whiteouts), with GNU cp; then it moves the
// copies' owners into to's id range. A fork boots a fresh lease init over
// the copy, as a machine booted from a disk snapshot would.
func CopyFiles(src, dst string, from, to Owner) error {
	var copies []string
	for _, dir := range []string{leaseinit.UpperDir, leaseinit.WorkspaceDir, leaseinit.TmpDir} {
		f, t := filepath.Join(src, dir), filepath.Join(dst, dir)
		out, err := exec.Command("cp", "-a", "--preserve=all", "--no-target-directory", f, t).CombinedOutput()
		if err != nil {
			return fmt.Errorf("copying %s: %v: %.200s", dir, err, out)
		}
		copies = append(copies, t)
	}
	return shiftOwners(copies, from, to) // into the fork's own id range
}
