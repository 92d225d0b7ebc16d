package journal

import (
	"fmt"
	"testing"
	"time"
)

// benchChunkSizes are the entry sizes of the journal benchmarks: a chatty
// command's small writes, and full pipe reads (MaxChunk).
var benchChunkSizes = []int{256, MaxChunk}

// The server's defaults: localsandbox.DefaultJournalBytes and
// DefaultStallTimeout, and the batches its output streams take.
const (
	benchJournalBytes = 1 << 20
	benchStall        = 10 * time.Second
	benchBatchBytes   = 256 << 10
)

func chunkName(size int) string {
	if size >= 1<<10 {
		return fmt.Sprintf("chunk=%dKiB", size>>10)
	}
	return fmt.Sprintf("chunk=%dB", size)
}

// BenchmarkJournal measures the output journal with the server's defaults
// (1 MiB held, batches of 256 KiB). MB/s counts the output bytes
// that went through.
//
//   - live: the pump appends while an attached reader (a connect) takes
//     the entries as they come, each side waiting for the other through
//     the journal's backpressure.
//   - replay: the journal fills up with no reader, then a reader attaches
//     from the start and takes everything (a reconnect after a lost
//     stream).
func BenchmarkJournal(b *testing.B) {
	for _, size := range benchChunkSizes {
		b.Run("live/"+chunkName(size), func(b *testing.B) {
			j := New(benchJournalBytes, benchStall)
			c, _ := j.Attach(0)
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				for range b.N {
					j.Append(Stdout, data)
				}
				j.SetExit(ExitStatus{})
			}()
			if n := drainJournal(b, j, c); n != b.N {
				b.Fatalf("took %d entries, want %d", n, b.N)
			}
		})
	}
	for _, size := range benchChunkSizes {
		b.Run("replay/"+chunkName(size), func(b *testing.B) {
			perJournal := benchJournalBytes / size
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(perJournal, b.N-done)
				j := New(benchJournalBytes, benchStall)
				for range n {
					j.Append(Stdout, data)
				}
				j.SetExit(ExitStatus{})
				c, err := j.Attach(0)
				if err != nil {
					b.Fatal(err)
				}
				if took := drainJournal(b, j, c); took != n {
					b.Fatalf("replayed %d entries, want %d", took, n)
				}
				done += n
			}
		})
	}
}

// drainJournal takes entries as a connect does until the exit, and
// returns how many it took.
func drainJournal(b *testing.B, j *Journal, c *Cursor) int {
	buf := make([]Entry, 0, 16)
	n := 0
	for {
		bt := j.Take(c, buf, benchBatchBytes)
		switch {
		case bt.Err != nil:
			b.Fatal(bt.Err)
		case bt.Exit != nil:
			return n
		case len(bt.Entries) > 0:
			n += len(bt.Entries)
			clear(bt.Entries)
		default:
			<-bt.Wait
		}
	}
}

// BenchmarkJournalFloor is the floor of BenchmarkJournal: the same chunks
// handed over through a Go channel that holds as many bytes as the
// journal — the simplest bounded, synchronised hand-off there is.
func BenchmarkJournalFloor(b *testing.B) {
	for _, size := range benchChunkSizes {
		b.Run("live/"+chunkName(size), func(b *testing.B) {
			ch := make(chan []byte, benchJournalBytes/size)
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				for range b.N {
					ch <- data
				}
				close(ch)
			}()
			n := 0
			for range ch {
				n++
			}
			if n != b.N {
				b.Fatalf("took %d chunks, want %d", n, b.N)
			}
		})
	}
	for _, size := range benchChunkSizes {
		b.Run("replay/"+chunkName(size), func(b *testing.B) {
			perJournal := benchJournalBytes / size
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(perJournal, b.N-done)
				ch := make(chan []byte, perJournal)
				for range n {
					ch <- data
				}
				close(ch)
				for range ch {
				}
				done += n
			}
		})
	}
}
