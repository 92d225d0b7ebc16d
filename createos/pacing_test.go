package createos

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testPace = 300 * time.Millisecond

func pacedClient(t *testing.T, f *fakeServer) *Client {
	return newTestClient(t, f, func(cfg *Config) { cfg.PaceInterval = testPace })
}

func TestPacingSpacesConcurrentRequests(t *testing.T) {
	f := newFakeServer(t)
	c := pacedClient(t, f)
	lease := f.newLease()

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			_, err := c.GetLease(t.Context(), lease.ID)
			assert.NoError(t, err)
		})
	}
	wg.Wait()

	seen := f.requests("")
	require.Len(t, seen, 3)
	for i := 1; i < len(seen); i++ {
		assert.GreaterOrEqual(t, seen[i].At.Sub(seen[i-1].At), testPace-50*time.Millisecond, "request %d", i)
	}
}

func TestPacingAbortedWaiterDoesNotBlockTheNext(t *testing.T) {
	f := newFakeServer(t)
	c := pacedClient(t, f)
	events := make(chan pacerEvent, 16)
	c.pace.observe = func(e pacerEvent) { events <- e }
	lease := f.newLease()
	next := func(want pacerEvent) {
		t.Helper()
		require.Equal(t, want, <-events)
	}

	// A goes at once and takes the slot.
	_, err := c.GetLease(t.Context(), lease.ID)
	require.NoError(t, err)
	next(pacerQueued)
	next(pacerHeading)

	// B waits at the head for the next slot; C queues behind it.
	ctxB, cancelB := context.WithCancel(t.Context())
	errB := make(chan error, 1)
	go func() {
		_, err := c.GetLease(ctxB, lease.ID)
		errB <- err
	}()
	next(pacerQueued)
	next(pacerHeading)
	errC := make(chan error, 1)
	go func() {
		_, err := c.GetLease(t.Context(), lease.ID)
		errC <- err
	}()
	next(pacerQueued)

	// B gives up: C takes B's slot, not the one after it.
	cancelB()
	require.ErrorIs(t, <-errB, context.Canceled)
	require.NoError(t, <-errC)

	seen := f.requests("")
	require.Len(t, seen, 2, "B never reached the server")
	gap := seen[1].At.Sub(seen[0].At)
	assert.GreaterOrEqual(t, gap, testPace-50*time.Millisecond)
	assert.Less(t, gap, 2*testPace-50*time.Millisecond, "C waited for B's slot to pass")
}
