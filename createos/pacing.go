package createos

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// A pacer spaces the starts of a Client's requests at least one interval
// apart, as the hosted service's rate limit asks (300 requests a minute per
// caller). A nil *pacer does not pace.
//
// Waiters take turns: only the waiter at the head holds a reservation of
// the limiter. When it gives up (its context ends), its reservation is
// cancelled while no later reservation exists, so the limiter hands the
// slot back whole and the next waiter is not pushed one interval further.
type pacer struct {
	limiter *rate.Limiter
	turn    chan struct{} // holds a token while a waiter is at the head

	// observe, when set (by tests), learns each waiter's progress.
	observe func(pacerEvent)
}

type pacerEvent int

const (
	pacerQueued  pacerEvent = iota // a waiter arrived
	pacerHeading                   // a waiter reached the head and waits for its slot
)

func newPacer(interval time.Duration) *pacer {
	if interval <= 0 {
		return nil
	}
	return &pacer{
		limiter: rate.NewLimiter(rate.Every(interval), 1),
		turn:    make(chan struct{}, 1),
	}
}

// wait blocks until the caller may start a request, or ctx ends. Its error
// is a context error: ctx's own, or context.DeadlineExceeded when ctx's
// deadline comes before the caller's slot.
func (p *pacer) wait(ctx context.Context) error {
	if p == nil {
		return ctx.Err()
	}
	p.notify(pacerQueued)
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.turn }()
	p.notify(pacerHeading)
	if err := p.limiter.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The limiter refuses at once a wait that would outlast ctx.
		return context.DeadlineExceeded
	}
	return nil
}

func (p *pacer) notify(e pacerEvent) {
	if p.observe != nil {
		p.observe(e)
	}
}
