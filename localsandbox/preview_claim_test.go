package localsandbox

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Two servers on one host give their leases different preview addresses
// (each server's allocation starts at 127.100.0.1, so without the claim
// both first leases got it), and an address comes free for another
// server when its lease is destroyed — or its server dies, the kernel
// dropping the flock with the file.
func TestPreviewAddressesAreClaimedHostWide(t *testing.T) {
	dir := t.TempDir()
	one, two, three := &Server{}, &Server{}, &Server{}
	for _, s := range []*Server{one, two, three} {
		s.ingress.claimDir = dir
	}
	first, second := &lease{}, &lease{}
	a1, a2 := one.previewAddr(first), two.previewAddr(second)
	require.NotEqual(t, a1, a2, "two servers' leases share a preview address")
	require.Equal(t, a1, one.previewAddr(first), "a lease keeps its address")

	one.releasePreviewAddr(first)
	require.Equal(t, a1, three.previewAddr(&lease{}), "a destroyed lease's address is free for any server")
}

// A view that races a destroy asks for the address of a lease already
// destroyed, whose address was released: it is given none, so nothing
// holds an address (and its host-wide claim) for a lease that is gone.
func TestADestroyedLeaseIsGivenNoPreviewAddress(t *testing.T) {
	s := &Server{}
	s.ingress.claimDir = t.TempDir()
	gone := &lease{state: stateDestroyed}
	require.False(t, s.previewAddr(gone).IsValid(), "a destroyed lease was given an address")
	require.Empty(t, s.ingress.addrOf, "an address is held for a destroyed lease")
	require.Empty(t, s.ingress.claims, "a claim is held for a destroyed lease")
}
