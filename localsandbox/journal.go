package localsandbox

import (
	"errors"
	"sync"
	"time"
)

// stream names an output stream of a process.
type stream uint8

const (
	stdoutStream stream = iota
	stderrStream
)

func (s stream) String() string {
	if s == stderrStream {
		return "stderr"
	}
	return "stdout"
}

// exitStatus is how the main process of a tree ended: an exit code, or the
// name of the signal that killed it.
type exitStatus struct {
	Code   int
	Signal string
}

// entry is one read from a process's stdout or stderr pipe (at most
// maxChunk bytes). Its data is never modified once appended, so readers may
// keep using it after it was evicted.
type entry struct {
	seq    int64
	stream stream
	data   []byte
}

// maxChunk bounds one journal entry, and so one data frame.
const maxChunk = 64 << 10

// errExpired means a cursor fell behind the oldest entry still held.
var errExpired = errors.New("output_offset_expired")

// journal is the bounded output journal of one process. Entries are
// numbered 1, 2, 3… across both streams; when the journal holds more than
// capBytes of data the oldest entries are evicted.
//
// Readers exert backpressure: an entry that an attached reader has not yet
// taken is evicted only after that reader made no progress for stall (then
// the reader is expired and ends its stream with output_offset_expired). So a
// reader that keeps up never loses output, a stuck one cannot hold the
// process up for long, and the server holds at most capBytes plus one batch
// per reader whatever the process writes. Without attached readers nothing
// waits.
type journal struct {
	capBytes int
	stall    time.Duration

	mu      sync.Mutex
	entries []entry // entries[0] is the oldest held
	bytes   int     // data bytes held
	newest  int64   // seq of the newest entry appended (0: none)
	evicted int64   // every seq <= evicted is gone
	exit    *exitStatus
	exitSeq int64 // newest when the exit was recorded: the exit frame follows it
	// released turns backpressure off (the tree is being killed).
	released bool
	readers  map[*cursor]struct{}
	// changed is closed (and replaced) when entries or the exit change;
	// progress when a reader advances or detaches.
	changed  chan struct{}
	progress chan struct{}
}

// cursor is one reader's position: the seq it needs next.
type cursor struct {
	next         int64
	lastProgress time.Time
	expired      bool
}

func newJournal(capBytes int, stall time.Duration) *journal {
	return &journal{
		capBytes: capBytes,
		stall:    stall,
		readers:  make(map[*cursor]struct{}),
		changed:  make(chan struct{}),
		progress: make(chan struct{}),
	}
}

func broadcast(ch *chan struct{}) {
	close(*ch)
	*ch = make(chan struct{})
}

// append adds data (which the journal now owns) as the next entry, evicting
// old entries as needed. It may block while an attached reader catches up.
func (j *journal) append(s stream, data []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.bytes+len(data) > j.capBytes && len(j.entries) > 0 {
		if wait := j.blockedFor(j.entries[0].seq); wait > 0 {
			progress := j.progress
			j.mu.Unlock()
			timer := time.NewTimer(wait)
			select {
			case <-progress:
			case <-timer.C:
			}
			timer.Stop()
			j.mu.Lock()
			continue
		}
		j.bytes -= len(j.entries[0].data)
		j.evicted = j.entries[0].seq
		j.entries[0] = entry{} // let the data go
		j.entries = j.entries[1:]
	}
	j.newest++
	j.entries = append(j.entries, entry{seq: j.newest, stream: s, data: data})
	j.bytes += len(data)
	broadcast(&j.changed)
}

// blockedFor reports how long to wait before seq may be evicted: zero when
// no live reader still needs it. Readers that stalled are expired here.
func (j *journal) blockedFor(seq int64) time.Duration {
	var wait time.Duration
	now := time.Now()
	expired := false
	for c := range j.readers {
		if c.expired || c.next > seq {
			continue
		}
		idle := now.Sub(c.lastProgress)
		if j.released || idle >= j.stall {
			c.expired = true
			expired = true
			continue
		}
		if w := j.stall - idle; wait == 0 || w < wait {
			wait = w
		}
	}
	if expired {
		broadcast(&j.changed)
	}
	return wait
}

// setExit records the main process's exit status. Entries appended so far
// come before the exit frame.
func (j *journal) setExit(st exitStatus) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.exit != nil {
		return
	}
	j.exit = &st
	j.exitSeq = j.newest
	broadcast(&j.changed)
}

// release turns backpressure off, so that a tree being killed is not held
// up by a slow reader.
func (j *journal) release() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.released = true
	broadcast(&j.progress)
}

// newestSeq returns the seq of the newest entry.
func (j *journal) newestSeq() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.newest
}

// window returns the seqs of the oldest and newest entries still held
// (oldest is newest+1 when none is) and the bytes they hold.
func (j *journal) window() (oldest, newest int64, bytes int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.evicted + 1, j.newest, j.bytes
}

// attach registers a reader that wants the entries after seq after. It
// fails with errExpired when some of them were evicted already.
func (j *journal) attach(after int64) (*cursor, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if after < j.evicted {
		return nil, errExpired
	}
	c := &cursor{next: after + 1, lastProgress: time.Now()}
	j.readers[c] = struct{}{}
	return c, nil
}

// detach forgets a reader.
func (j *journal) detach(c *cursor) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.readers, c)
	broadcast(&j.progress)
}

// batch is what a reader takes from the journal in one step: entries to
// send, or the exit status (the stream ends after it), or an error (the
// stream ends with it), or else a channel that is closed when there may be
// more.
type batch struct {
	entries []entry
	exit    *exitStatus
	err     error
	wait    <-chan struct{}
}

// take advances c over up to maxBytes of entries (at least one). buf is
// reused for the returned entries.
func (j *journal) take(c *cursor, buf []entry, maxBytes int) batch {
	j.mu.Lock()
	defer j.mu.Unlock()
	if c.expired || c.next <= j.evicted {
		return batch{err: errExpired}
	}
	if j.exit != nil && c.next > j.exitSeq {
		return batch{exit: j.exit}
	}
	if c.next > j.newest {
		return batch{wait: j.changed}
	}
	out := buf[:0]
	size := 0
	for i := int(c.next - j.entries[0].seq); i < len(j.entries); i++ {
		e := j.entries[i]
		if len(out) > 0 && size+len(e.data) > maxBytes {
			break
		}
		if j.exit != nil && e.seq > j.exitSeq {
			break
		}
		out = append(out, e)
		size += len(e.data)
	}
	c.next = out[len(out)-1].seq + 1
	c.lastProgress = time.Now()
	broadcast(&j.progress)
	return batch{entries: out}
}
