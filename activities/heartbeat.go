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
		ticker := time.NewTicker(a.heartbeatInterval(activity.GetInfo(ctx).HeartbeatTimeout))
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
