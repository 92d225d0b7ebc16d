package activities

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
)

// keepHeartbeating records a heartbeat every heartbeat interval until the
// returned stop function is called, so that a worker that dies is noticed
// within the activity's heartbeat timeout and a cancellation reaches the
// activity. details, if not nil, supplies the details of each heartbeat.
func (a *Activities) keepHeartbeating(ctx context.Context, details func() any) (stop func()) {
	return KeepHeartbeating(ctx, a.heartbeatInterval(activity.GetInfo(ctx).HeartbeatTimeout), details)
}

// KeepHeartbeating records a heartbeat of the activity running in ctx
// every interval until the returned stop function is called (or ctx
// ends). details, if not nil, supplies the details of each heartbeat. An
// activity that waits a long time on something else (a command, an
// Update) uses it so that its worker's death is noticed within the
// heartbeat timeout and cancellation reaches it.
func KeepHeartbeating(ctx context.Context, interval time.Duration, details func() any) (stop func()) {
	beat := func() {
		if details == nil {
			activity.RecordHeartbeat(ctx)
		} else {
			activity.RecordHeartbeat(ctx, details())
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				beat()
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
