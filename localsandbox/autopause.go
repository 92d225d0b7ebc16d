package localsandbox

import (
	"time"
)

// Auto-pause.
//
// A sandbox created with auto_pause_after_seconds (60–86400) pauses itself
// — a freeze of the whole lease, as POST /pause — once it has been idle that
// long: no request naming it (reading its status does not count) and no
// exec or output stream open. Processes that run in it do not keep it
// awake: a server waiting for a client is idle. Resume (or any request that
// resumes it) wakes it, and the idle clock starts again.

// Bounds of auto_pause_after_seconds.
const (
	minAutoPauseSeconds = 60
	maxAutoPauseSeconds = 86400
)

// idleClock is a lease's activity, for auto-pause; guarded by lease.mu.
type idleClock struct {
	after  time.Duration // 0: never
	last   time.Time     // the last activity
	busy   int           // execs and streams open
	timer  *time.Timer
	closed bool
}

// touch records activity.
func (l *lease) touch() {
	l.mu.Lock()
	l.idle.last = time.Now()
	l.mu.Unlock()
}

// hold marks the lease busy until the returned function is called.
func (l *lease) hold() (release func()) {
	l.mu.Lock()
	l.idle.busy++
	l.idle.last = time.Now()
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.idle.busy--
		l.idle.last = time.Now()
		l.mu.Unlock()
	}
}

// startIdleClock arms auto-pause, when the lease has it.
func (l *lease) startIdleClock(after time.Duration) {
	if after <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.idle.after = after
	l.idle.last = time.Now()
	l.idle.timer = time.AfterFunc(after, l.idleCheck)
}

// setAutoPause changes how long the lease may be idle before it pauses
// (0: never), counted from now (PATCH /v1/sandboxes/{id}, a fork).
func (l *lease) setAutoPause(after time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.idle.closed {
		return
	}
	l.idle.after = after
	l.idle.last = time.Now()
	switch {
	case after <= 0 && l.idle.timer != nil:
		l.idle.timer.Stop()
	case after <= 0:
	case l.idle.timer == nil:
		l.idle.timer = time.AfterFunc(after, l.idleCheck)
	default:
		l.idle.timer.Reset(after)
	}
}

// autoPause returns how long the lease may be idle before it pauses (0:
// never).
func (l *lease) autoPause() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.after
}

// stopIdleClock disarms auto-pause for good (destroy).
func (l *lease) stopIdleClock() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.idle.closed = true
	if l.idle.timer != nil {
		l.idle.timer.Stop()
	}
}

// idleCheck runs when the lease may have become idle: it pauses it, or
// looks again when it could be.
func (l *lease) idleCheck() {
	l.mu.Lock()
	if l.idle.closed || l.idle.after <= 0 {
		l.mu.Unlock()
		return
	}
	next := l.idle.after
	pause := false
	if since := time.Since(l.idle.last); l.state == stateRunning && l.idle.busy == 0 && since >= l.idle.after {
		l.state = statePausing
		pause = true
	} else if since < l.idle.after {
		next = l.idle.after - since
	}
	l.idle.timer.Reset(next)
	l.mu.Unlock()
	if pause {
		l.server.log.Info("sandbox idle: pausing it", "sandbox", l.id, "after", l.idle.after)
		l.server.workers.Go(l.pause)
	}
}
