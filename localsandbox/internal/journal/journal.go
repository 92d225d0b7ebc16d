package journal

import (
	"errors"
	"sync"
	"time"
)

// Stream names an output stream of a process.
type Stream uint8

// The streams of a process.
const (
	Stdout Stream = iota
	Stderr
	Pty // a terminal's output, where stdout and stderr are one
)

func (s Stream) String() string {
	switch s {
	case Stderr:
		return "stderr"
	case Pty:
		return "pty"
	}
	return "stdout"
}

// ExitStatus is how the main process of a tree ended: an exit code, or the
// name of the signal that killed it.
type ExitStatus struct {
	Code   int
	Signal string
}

// Entry is one read from a process's stdout or stderr pipe (at most
// MaxChunk bytes). Its data is never modified once appended, so readers may
// keep using it after it was evicted.
type Entry struct {
	Seq    int64
	Stream Stream
	Data   []byte
}

// MaxChunk bounds one journal entry, and so one data frame.
const MaxChunk = 64 << 10

// ErrExpired means a cursor fell behind the oldest entry still held.
var ErrExpired = errors.New("output_offset_expired")

// Journal is the bounded output journal of one process. Entries are
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
type Journal struct {
	capBytes int
	stall    time.Duration

	mu      sync.Mutex
	entries []Entry // entries[0] is the oldest held
	bytes   int     // data bytes held
	newest  int64   // seq of the newest entry appended (0: none)
	evicted int64   // every seq <= evicted is gone
	exit    *ExitStatus
	exitSeq int64 // newest when the exit was recorded: the exit frame follows it
	// released turns backpressure off (the tree is being killed).
	released bool
	readers  map[*Cursor]struct{}
	// changed is closed (and replaced) when entries or the exit change;
	// progress when a reader advances or detaches.
	changed  chan struct{}
	progress chan struct{}
}

// Cursor is one reader's position: the seq it needs next.
type Cursor struct {
	next         int64
	lastProgress time.Time
	expired      bool
}

// New returns an empty journal that holds capBytes of output (at least
// MaxChunk) and gives an attached reader stall to make progress before it
// evicts what that reader has not taken.
func New(capBytes int, stall time.Duration) *Journal {
	return &Journal{
		capBytes: capBytes,
		stall:    stall,
		readers:  make(map[*Cursor]struct{}),
		changed:  make(chan struct{}),
		progress: make(chan struct{}),
	}
}

func broadcast(ch *chan struct{}) {
	close(*ch)
	*ch = make(chan struct{})
}

// Append adds data (which the journal now owns) as the next entry, evicting
// old entries as needed. It may block while an attached reader catches up.
func (j *Journal) Append(s Stream, data []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.bytes+len(data) > j.capBytes && len(j.entries) > 0 {
		if wait := j.blockedFor(j.entries[0].Seq); wait > 0 {
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
		j.bytes -= len(j.entries[0].Data)
		j.evicted = j.entries[0].Seq
		j.entries[0] = Entry{} // let the data go
		j.entries = j.entries[1:]
	}
	j.newest++
	j.entries = append(j.entries, Entry{Seq: j.newest, Stream: s, Data: data})
	j.bytes += len(data)
	broadcast(&j.changed)
}

// blockedFor reports how long to wait before seq may be evicted: zero when
// no live reader still needs it. Readers that stalled are expired here.
func (j *Journal) blockedFor(seq int64) time.Duration {
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

// SetExit records the main process's exit status. Entries appended so far
// come before the exit frame.
func (j *Journal) SetExit(st ExitStatus) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.exit != nil {
		return
	}
	j.exit = &st
	j.exitSeq = j.newest
	broadcast(&j.changed)
}

// Release turns backpressure off, so that a tree being killed is not held
// up by a slow reader.
func (j *Journal) Release() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.released = true
	broadcast(&j.progress)
}

// NewestSeq returns the seq of the newest entry.
func (j *Journal) NewestSeq() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.newest
}

// Window returns the seqs of the oldest and newest entries still held
// (oldest is newest+1 when none is) and the bytes they hold.
func (j *Journal) Window() (oldest, newest int64, bytes int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.evicted + 1, j.newest, j.bytes
}

// Attach registers a reader that wants the entries after seq after. It
// fails with ErrExpired when some of them were evicted already.
func (j *Journal) Attach(after int64) (*Cursor, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if after < j.evicted {
		return nil, ErrExpired
	}
	c := &Cursor{next: after + 1, lastProgress: time.Now()}
	j.readers[c] = struct{}{}
	return c, nil
}

// Detach forgets a reader.
func (j *Journal) Detach(c *Cursor) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.readers, c)
	broadcast(&j.progress)
}

// Batch is what a reader takes from the journal in one step: Entries to
// send, or the Exit status (the stream ends after it), or an Err (the
// stream ends with it), or else a channel, Wait, that is closed when there
// may be more.
type Batch struct {
	Entries []Entry
	Exit    *ExitStatus
	Err     error
	Wait    <-chan struct{}
}

// Take advances c over up to maxBytes of entries (at least one). buf is
// reused for the returned entries.
func (j *Journal) Take(c *Cursor, buf []Entry, maxBytes int) Batch {
	j.mu.Lock()
	defer j.mu.Unlock()
	if c.expired || c.next <= j.evicted {
		return Batch{Err: ErrExpired}
	}
	if j.exit != nil && c.next > j.exitSeq {
		return Batch{Exit: j.exit}
	}
	if c.next > j.newest {
		return Batch{Wait: j.changed}
	}
	out := buf[:0]
	size := 0
	for i := int(c.next - j.entries[0].Seq); i < len(j.entries); i++ {
		e := j.entries[i]
		if len(out) > 0 && size+len(e.Data) > maxBytes {
			break
		}
		if j.exit != nil && e.Seq > j.exitSeq {
			break
		}
		out = append(out, e)
		size += len(e.Data)
	}
	c.next = out[len(out)-1].Seq + 1
	c.lastProgress = time.Now()
	broadcast(&j.progress)
	return Batch{Entries: out}
}
