package activities

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
)

// keepHeartbeating records a heartbeat every heartbeat interval until the
// returned stop function is called, so that a worker that dies is noticed
// within the activity's heartbeat timeout and a cancellation reaches the
// activity. details, if not nil, supplies the details of each heartbeat.
func (a *Activities) keepHeartbeating(ctx context.Context, details func() any) (stop func()) {
	stop, _, _ = a.keepBeating(ctx, details)
	return stop
}

// keepBeating is keepHeartbeating with a nudge and a hold (see keepBeating).
func (a *Activities) keepBeating(ctx context.Context, details func() any) (stop, nudge func(), hold func(func())) {
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
// hold runs f while no periodic heartbeat is recorded: a heartbeat begun
// before it, whose details may be older, never reaches the SDK after what
// f records. Execute holds the heartbeats while it records a new process.
func keepBeating(ctx context.Context, interval time.Duration, details func() any) (stop, nudge func(), hold func(func())) {
	var mu sync.Mutex
	hold = func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		f()
	}
	beat := func() {
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
	return stop, nudge, hold
}

// HeartbeatRecorder records a heartbeat of the activity running in ctx and
// returns once the Temporal server has it. Execute records a new process
// through it before the command may start (see ExecuteProgress);
// Activities.Heartbeats injects it, so that a test can make the record slow
// or fail, and a test environment without a server can keep it in memory.
type HeartbeatRecorder interface {
	RecordHeartbeatNow(ctx context.Context, details any) error
}

// ServerHeartbeats is the HeartbeatRecorder of a worker: it calls the
// Temporal server through the activity's client. Unlike
// activity.RecordHeartbeat, it is not held back by the SDK's heartbeat
// throttle, and it reports whether the heartbeat arrived. It gives up after
// the activity's heartbeat timeout: by then the server has given up on the
// attempt. A heartbeat the server answers with a request (cancel, pause,
// reset) was recorded: the SDK's own heartbeats deliver the request.
type ServerHeartbeats struct{}

func (ServerHeartbeats) RecordHeartbeatNow(ctx context.Context, details any) error {
	info := activity.GetInfo(ctx)
	if info.HeartbeatTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, info.HeartbeatTimeout)
		defer cancel()
	}
	err := activity.GetClient(ctx).RecordActivityHeartbeat(ctx, info.TaskToken, details)
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) || errors.Is(err, activity.ErrActivityPaused) || errors.Is(err, activity.ErrActivityReset) {
		return nil
	}
	return err
}

// heartbeats returns the recorder of Activities.Heartbeats, by default
// ServerHeartbeats.
func (a *Activities) heartbeats() HeartbeatRecorder {
	if a.Heartbeats != nil {
		return a.Heartbeats
	}
	return ServerHeartbeats{}
}

// TestEnvironmentHeartbeats is the HeartbeatRecorder of the SDK's test
// environments, which have no Temporal server: activity.RecordHeartbeat
// records there at once. On a real worker it would promise nothing (the
// SDK throttles and may drop heartbeats), so workers use ServerHeartbeats.
type TestEnvironmentHeartbeats struct{}

func (TestEnvironmentHeartbeats) RecordHeartbeatNow(ctx context.Context, details any) error {
	activity.RecordHeartbeat(ctx, details)
	return nil
}
