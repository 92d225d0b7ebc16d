package workerapp

import (
	"context"
	"errors"
	"sync"

	"go.temporal.io/sdk/worker"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// capacityGate is the activity slot supplier of a host's placement worker
// (worker.Options.Tuner): the SDK reserves a slot before it polls for a
// task, so a host polls the placement queue for new leases only while it
// has room for one more. Whichever host with room polls first takes the
// create: Temporal places, the gate only keeps a full host out.
//
// A slot stands for a lease that may be made: while it is polling, or
// running CreateLease or AcquireFreshLease. The gate hands one out only
// while the host's leases plus the slots out stay below capacity, and
// only once it knows the host's leases (ready) and while it is not
// draining.
type capacityGate struct {
	mu       sync.Mutex
	capacity int
	leases   int
	issued   int
	ready    bool
	draining bool
	wake     chan struct{} // closed, and replaced, on every change
}

var _ worker.SlotSupplier = (*capacityGate)(nil)

func newCapacityGate(capacity int) *capacityGate {
	return &capacityGate{capacity: capacity, wake: make(chan struct{})}
}

// open reports whether a slot may be handed out; g.mu is held.
func (g *capacityGate) open() bool {
	return g.ready && !g.draining && g.leases+g.issued < g.capacity
}

// changed wakes the reservations waiting; g.mu is held.
func (g *capacityGate) changed() {
	close(g.wake)
	g.wake = make(chan struct{})
}

func (g *capacityGate) update(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f()
	g.changed()
}

// setLeases tells the gate how many leases the host holds now.
func (g *capacityGate) setLeases(n int) { g.update(func() { g.leases = n }) }

// setReady opens the gate once the host's leases are known and its
// sandbox server answers, and closes it while the server does not.
func (g *capacityGate) setReady(ready bool) { g.update(func() { g.ready = ready }) }

// drain closes the gate for good: the host takes no new lease.
func (g *capacityGate) drain() { g.update(func() { g.draining = true }) }

func (g *capacityGate) ReserveSlot(ctx context.Context, _ worker.SlotReservationInfo) (*worker.SlotPermit, error) {
	for {
		g.mu.Lock()
		if g.open() {
			g.issued++
			g.mu.Unlock()
			return &worker.SlotPermit{}, nil
		}
		wake := g.wake
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

func (g *capacityGate) TryReserveSlot(worker.SlotReservationInfo) *worker.SlotPermit {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open() {
		return nil
	}
	g.issued++
	return &worker.SlotPermit{}
}

func (g *capacityGate) MarkSlotUsed(worker.SlotMarkUsedInfo) {}

func (g *capacityGate) ReleaseSlot(worker.SlotReleaseInfo) { g.update(func() { g.issued-- }) }

func (g *capacityGate) MaxSlots() int { return g.capacity }

// ledger is the host's sandbox provider, counting the leases on the host:
// every sandbox of its server, whoever made it. The activities' creates,
// forks and destroys keep the count as they happen; resync reads it anew
// from the server, for what happened elsewhere (a lease destroyed by hand,
// a server restarted) — at once after a create or fork that failed, which
// may have made a sandbox all the same. count hears every change.
type ledger struct {
	sandbox.Provider
	count func(n int)
	// stale is signalled when the count may be short: resync now.
	stale chan struct{}

	mu  sync.Mutex
	ids map[string]bool
	// during is what happened while a resync listed the leases, to be
	// applied over the list; nil when none runs.
	during []change
}

type change struct {
	id    string
	alive bool
}

func newLedger(p sandbox.Provider, count func(n int)) *ledger {
	return &ledger{Provider: p, count: count, ids: map[string]bool{}, stale: make(chan struct{}, 1)}
}

// made notes the outcome of a create or a fork.
func (l *ledger) made(lease sandbox.Lease, err error) {
	if err == nil {
		l.note(lease.ID, true)
		return
	}
	select {
	case l.stale <- struct{}{}:
	default:
	}
}

func (l *ledger) note(id string, alive bool) {
	l.mu.Lock()
	apply(l.ids, change{id, alive})
	if l.during != nil {
		l.during = append(l.during, change{id, alive})
	}
	n := len(l.ids)
	l.mu.Unlock()
	l.count(n)
}

func apply(ids map[string]bool, c change) {
	if c.alive {
		ids[c.id] = true
	} else {
		delete(ids, c.id)
	}
}

// leases returns how many leases the host holds.
func (l *ledger) leases() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// resync reads the host's leases from its server.
func (l *ledger) resync(ctx context.Context) error {
	l.mu.Lock()
	l.during = []change{}
	l.mu.Unlock()
	leases, err := l.Provider.ListLeases(ctx, nil)
	l.mu.Lock()
	during := l.during
	l.during = nil
	if err != nil {
		l.mu.Unlock()
		return err
	}
	ids := map[string]bool{}
	for _, lease := range leases {
		if !lease.Status.Terminal() {
			ids[lease.ID] = true
		}
	}
	for _, c := range during {
		apply(ids, c)
	}
	l.ids = ids
	n := len(ids)
	l.mu.Unlock()
	l.count(n)
	return nil
}

func (l *ledger) CreateLease(ctx context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
	lease, err := l.Provider.CreateLease(ctx, spec)
	l.made(lease, err)
	return lease, err
}

func (l *ledger) ForkLease(ctx context.Context, sourceID string, spec sandbox.ForkSpec) (sandbox.Lease, error) {
	lease, err := l.Provider.ForkLease(ctx, sourceID, spec)
	l.made(lease, err)
	return lease, err
}

func (l *ledger) DestroyLease(ctx context.Context, leaseID string) error {
	err := l.Provider.DestroyLease(ctx, leaseID)
	if err == nil {
		l.note(leaseID, false)
	}
	return err
}

func (l *ledger) GetLease(ctx context.Context, leaseID string) (sandbox.Lease, error) {
	lease, err := l.Provider.GetLease(ctx, leaseID)
	var gone *sandbox.LeaseGoneError
	if errors.As(err, &gone) || err == nil && lease.Status.Terminal() {
		l.note(leaseID, false)
	}
	return lease, err
}
