package journal

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestJournalEvictsOldestBeyondItsCap(t *testing.T) {
	j := New(100, time.Hour)
	for i := range 10 {
		j.Append(Stream(i%2), bytes.Repeat([]byte{'a'}, 30))
	}
	// 10 entries of 30 bytes, 100 bytes kept: seqs 8, 9 and 10.
	if j.evicted != 7 || len(j.entries) != 3 || j.bytes != 90 || j.NewestSeq() != 10 {
		t.Fatalf("evicted %d, %d entries, %d bytes, newest %d", j.evicted, len(j.entries), j.bytes, j.NewestSeq())
	}
	if _, err := j.Attach(6); !errors.Is(err, ErrExpired) {
		t.Errorf("attach after 6: %v, want expired", err)
	}
	c, err := j.Attach(7)
	if err != nil {
		t.Fatal(err)
	}
	b := j.Take(c, nil, 1<<20)
	if len(b.Entries) != 3 || b.Entries[0].Seq != 8 || b.Entries[0].Stream != Stderr {
		t.Errorf("took %+v", b.Entries)
	}
	if b := j.Take(c, nil, 1<<20); b.Wait == nil {
		t.Errorf("a caught-up reader should wait, got %+v", b)
	}
	j.SetExit(ExitStatus{Code: 3})
	j.Append(Stdout, []byte("after the exit"))
	if b := j.Take(c, nil, 1<<20); b.Exit == nil || b.Exit.Code != 3 {
		t.Errorf("after the exit: %+v; want the exit before later output", b)
	}
}

func TestJournalWaitsForAReaderThatKeepsUp(t *testing.T) {
	j := New(100, time.Hour)
	c, _ := j.Attach(0)
	j.Append(Stdout, make([]byte, 60))
	appended := make(chan struct{})
	go func() {
		j.Append(Stdout, make([]byte, 60)) // needs seq 1 evicted, which c has not taken
		close(appended)
	}()
	select {
	case <-appended:
		t.Fatal("append evicted an entry an attached reader still needed")
	case <-time.After(50 * time.Millisecond):
	}
	if b := j.Take(c, nil, 60); len(b.Entries) != 1 {
		t.Fatalf("take: %+v", b)
	}
	<-appended
	if b := j.Take(c, nil, 1<<20); len(b.Entries) != 1 || b.Entries[0].Seq != 2 {
		t.Errorf("take after the append: %+v", b)
	}
}

func TestJournalExpiresAStalledReader(t *testing.T) {
	j := New(100, 20*time.Millisecond)
	c, _ := j.Attach(0)
	for range 5 {
		j.Append(Stdout, make([]byte, 60)) // returns once c is expired
	}
	if b := j.Take(c, nil, 1<<20); !errors.Is(b.Err, ErrExpired) {
		t.Errorf("stalled reader: %+v, want expired", b)
	}

	// A reader that left holds nothing up, however long the stall timeout.
	j = New(100, time.Hour)
	c, _ = j.Attach(0)
	j.Detach(c)
	appended := make(chan struct{})
	go func() {
		for range 5 {
			j.Append(Stdout, make([]byte, 60))
		}
		close(appended)
	}()
	select {
	case <-appended:
	case <-time.After(10 * time.Second):
		t.Fatal("appends wait for a reader that detached")
	}
}
