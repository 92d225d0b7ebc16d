package activities

import (
	"context"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
)

// keepHeartbeating records a heartbeat every heartbeat interval until the
// returned stop function is called, so that a worker that dies is noticed
// within the activity's heartbeat timeout and a cancellation reaches the
// activity. details, if not nil, supplies the details of each heartbeat.
func (a *Activities) keepHeartbeating(ctx context.Context, details func() any) (stop func()) {
	stop, _, _ = a.keepBeating(ctx, details)
	return stop
}

// keepBeating is keepHeartbeating with a nudge and a beat (see keepBeating).
func (a *Activities) keepBeating(ctx context.Context, details func() any) (stop, nudge, beat func()) {
	return keepBeating(ctx, a.heartbeatInterval(activity.GetInfo(ctx).HeartbeatTimeout), details)
}

// KeepHeartbeating records a heartbeat of the activity running in ctx
// every interval until the returned stop function is called (or ctx
// ends). details, if not nil, supplies the details of each heartbeat. An
// activity that waits a long time on something else (a command, an
// Update) uses it so that its worker's death is noticed within the
// heartbeat timeout and cancellation reaches it.
func KeepHeartbeating(ctx context.Context, interval time.Duration, details func() any) (stop func()) {
	stop, _, _ = keepBeating(ctx, interval, details)
	return stop
}

// keepBeating is KeepHeartbeating that also returns nudge, which asks for
// a heartbeat now rather than at the next interval, without waiting for it:
// Execute nudges when output arrives, so that its heartbeats carry the
// output live. The SDK's heartbeat throttle (the worker's
// MaxHeartbeatThrottleInterval) still bounds how often one reaches the
// server, and holds back only the latest details.
//
// beat records a heartbeat at once, in order with the periodic ones: a
// heartbeat begun before it, whose details may be older, never reaches the
// SDK after it. Execute beats when a process starts, so that no later
// heartbeat forgets it.
func keepBeating(ctx context.Context, interval time.Duration, details func() any) (stop, nudge, beat func()) {
	var mu sync.Mutex
	beat = func() {
		mu.Lock()
		defer mu.Unlock()
		if details == nil {
			activity.RecordHeartbeat(ctx)
		} else {
			activity.RecordHeartbeat(ctx, details())
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	nudged := make(chan struct{}, 1)
	go func() {
		defer close(finished)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				beat()
			case <-nudged:
				beat()
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	stop = func() {
		close(done)
		<-finished
	}
	nudge = func() {
		select {
		case nudged <- struct{}{}:
		default: // a heartbeat is coming anyway
		}
	}
	return stop, nudge, beat
}
