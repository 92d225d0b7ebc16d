package workerapp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// reserved reserves a slot in the background and reports it on the
// channel it returns.
func reserved(ctx context.Context, g *capacityGate) <-chan error {
	out := make(chan error, 1)
	go func() {
		_, err := g.ReserveSlot(ctx, nil)
		out <- err
	}()
	return out
}

func TestAFullHostDoesNotPollForLeases(t *testing.T) {
	g := newCapacityGate(2)
	assert.Nil(t, g.TryReserveSlot(nil), "closed until the host's leases are known")
	g.setLeases(1)
	g.setReady(true)
	first := g.TryReserveSlot(nil)
	require.NotNil(t, first, "one lease and one slot: the host is full")
	assert.Nil(t, g.TryReserveSlot(nil))

	waiting := reserved(t.Context(), g)
	select {
	case err := <-waiting:
		t.Fatalf("a full host reserved a slot: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.ReleaseSlot(nil) // the poll came back empty
	require.NoError(t, <-waiting, "the released slot goes to the waiting poll")

	g.setLeases(2) // the create made its lease
	g.ReleaseSlot(nil)
	waiting = reserved(t.Context(), g)
	g.setLeases(0) // both leases destroyed
	require.NoError(t, <-waiting)

	g.setReady(false) // its sandbox server stopped answering
	assert.Nil(t, g.TryReserveSlot(nil))
	g.setReady(true)
	assert.NotNil(t, g.TryReserveSlot(nil))
	g.drain()
	assert.Nil(t, g.TryReserveSlot(nil), "a draining host takes no new lease")

	ctx, cancel := context.WithCancel(t.Context())
	waiting = reserved(ctx, g)
	cancel()
	assert.ErrorIs(t, <-waiting, context.Canceled, "a stopping worker stops waiting")
}

func TestTheLedgerCountsTheHostsLeases(t *testing.T) {
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	var counts []int
	l := newLedger(provider, func(n int) { counts = append(counts, n) })
	running := func(id string) sandbox.Lease { return sandbox.Lease{ID: id, Status: sandbox.StatusRunning} }

	provider.EXPECT().ListLeases(gomock.Any(), gomock.Nil()).Return([]sandbox.Lease{
		running("a"), running("b"), {ID: "x", Status: sandbox.StatusDestroyed},
	}, nil)
	require.NoError(t, l.resync(t.Context()))
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(running("c"), nil)
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(running("c"), nil) // a retry gets the same
	provider.EXPECT().ForkLease(gomock.Any(), "c", gomock.Any()).Return(running("d"), nil)
	provider.EXPECT().DestroyLease(gomock.Any(), "a").Return(nil)
	provider.EXPECT().DestroyLease(gomock.Any(), "b").Return(&sandbox.UnavailableError{Operation: "destroy"})
	provider.EXPECT().GetLease(gomock.Any(), "d").Return(sandbox.Lease{}, &sandbox.LeaseGoneError{LeaseID: "d"})
	_, _ = l.CreateLease(t.Context(), sandbox.LeaseSpec{})
	_, _ = l.CreateLease(t.Context(), sandbox.LeaseSpec{})
	_, _ = l.ForkLease(t.Context(), "c", sandbox.ForkSpec{})
	_ = l.DestroyLease(t.Context(), "a")
	_ = l.DestroyLease(t.Context(), "b")
	_, _ = l.GetLease(t.Context(), "d")
	assert.Equal(t, []int{2, 3, 3, 4, 3, 2}, counts)
	assert.Equal(t, 2, l.leases(), "b and c")

	// What happens while a resync lists the leases counts over the list.
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Nil()).DoAndReturn(func(context.Context, map[string]string) ([]sandbox.Lease, error) {
		provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(running("e"), nil)
		provider.EXPECT().DestroyLease(gomock.Any(), "b").Return(nil)
		_, _ = l.CreateLease(t.Context(), sandbox.LeaseSpec{})
		_ = l.DestroyLease(t.Context(), "b")
		return []sandbox.Lease{running("b"), running("c"), running("f")}, nil // listed before both
	})
	require.NoError(t, l.resync(t.Context()))
	assert.Equal(t, 3, l.leases(), "c, e and f (made elsewhere)")

	provider.EXPECT().ListLeases(gomock.Any(), gomock.Nil()).Return(nil, &sandbox.UnavailableError{Operation: "list"})
	assert.Error(t, l.resync(t.Context()))
	assert.Equal(t, 3, l.leases(), "a failed resync changes nothing")

	// A create that failed may have made a sandbox: count anew.
	provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).Return(sandbox.Lease{}, &sandbox.UnavailableError{Operation: "create"})
	_, _ = l.CreateLease(t.Context(), sandbox.LeaseSpec{})
	select {
	case <-l.stale:
	default:
		t.Fatal("a failed create asks for no resync")
	}
}
