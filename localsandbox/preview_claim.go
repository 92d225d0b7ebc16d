package localsandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Every sandboxd on a host allocates preview addresses from the same
// previewNet, and two of them would otherwise both give their first
// lease 127.100.0.1: the second's published ports would be refused (the
// host holds them) and its preview URLs would open the first server's
// lease. So an address is claimed host-wide before it is given to a
// lease: an exclusive flock(2) on a file named for it in
// previewClaimDir, held while the lease lives and let go by the kernel
// when the server dies, so no claim outlives its holder.

// previewClaimDir is where the claims are kept: one directory for every
// server run as root, else one per user (servers of two users do not see
// each other's claims; their previews need no root, their addresses may
// then coincide, as before).
func previewClaimDir() string {
	if uid := os.Geteuid(); uid != 0 {
		return filepath.Join(os.TempDir(), "sandboxflow-preview-"+strconv.Itoa(uid))
	}
	return "/run/sandboxflow/preview"
}

// errPreviewClaimed: another server holds the address.
var errPreviewClaimed = errors.New("preview address claimed by another server")

// claimPreviewAddr claims a for this server; the file it returns holds
// the claim until it is closed.
func claimPreviewAddr(dir string, a netip.Addr) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("the preview claims directory: %w", err)
	}
	// Not a directory another user made (in /tmp, for a server not run
	// as root) to hold our claims or plant links in.
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("the preview claims directory %s is not a directory of this user's alone", dir)
	}
	f, err := os.OpenFile(filepath.Join(dir, a.String()), os.O_RDONLY|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claiming preview address %s: %w", a, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errPreviewClaimed
		}
		return nil, fmt.Errorf("claiming preview address %s: %w", a, err)
	}
	return f, nil
}
