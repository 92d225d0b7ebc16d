package localsandbox

import (
	"fmt"
	"testing"
)

// benchChunkSizes are the entry sizes of the journal benchmarks: a chatty
// command's small writes, and full pipe reads (maxChunk).
var benchChunkSizes = []int{256, maxChunk}

func chunkName(size int) string {
	if size >= 1<<10 {
		return fmt.Sprintf("chunk=%dKiB", size>>10)
	}
	return fmt.Sprintf("chunk=%dB", size)
}

// BenchmarkJournal measures the output journal with the server's defaults
// (1 MiB held, batches of streamBatchBytes). MB/s counts the output bytes
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
			j := newJournal(DefaultJournalBytes, DefaultStallTimeout)
			c, _ := j.attach(0)
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				for range b.N {
					j.append(stdoutStream, data)
				}
				j.setExit(exitStatus{})
			}()
			if n := drainJournal(b, j, c); n != b.N {
				b.Fatalf("took %d entries, want %d", n, b.N)
			}
		})
	}
	for _, size := range benchChunkSizes {
		b.Run("replay/"+chunkName(size), func(b *testing.B) {
			perJournal := DefaultJournalBytes / size
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(perJournal, b.N-done)
				j := newJournal(DefaultJournalBytes, DefaultStallTimeout)
				for range n {
					j.append(stdoutStream, data)
				}
				j.setExit(exitStatus{})
				c, err := j.attach(0)
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
func drainJournal(b *testing.B, j *journal, c *cursor) int {
	buf := make([]entry, 0, 16)
	n := 0
	for {
		bt := j.take(c, buf, streamBatchBytes)
		switch {
		case bt.err != nil:
			b.Fatal(bt.err)
		case bt.exit != nil:
			return n
		case len(bt.entries) > 0:
			n += len(bt.entries)
			clear(bt.entries)
		default:
			<-bt.wait
		}
	}
}

// BenchmarkJournalFloor is the floor of BenchmarkJournal: the same chunks
// handed over through a Go channel that holds as many bytes as the
// journal — the simplest bounded, synchronised hand-off there is.
func BenchmarkJournalFloor(b *testing.B) {
	for _, size := range benchChunkSizes {
		b.Run("live/"+chunkName(size), func(b *testing.B) {
			ch := make(chan []byte, DefaultJournalBytes/size)
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
			perJournal := DefaultJournalBytes / size
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
