package localsandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
)

func TestConnectAfterEvictionIs410(t *testing.T) {
	ts := startServer(t, Options{JournalBytes: journal.MaxChunk})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `head -c 1000000 /dev/zero`)
	ts.waitTree(lease, pid, 10*time.Second)
	resp := ts.request("GET", "/sandboxes/"+lease+"/processes/"+pid+"/connect?after=0", nil, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGone {
		t.Fatalf("connect after=0: %d, want 410", resp.StatusCode)
	}
	w, _ := ts.waitTree(lease, pid, time.Second)
	out := ts.connect(lease, pid, w.Output.NewestSeq-1).drain(w.Output.NewestSeq - 1)
	if out.last.Type != "exit" || out.stdout.Len() == 0 {
		t.Errorf("the tail of the journal: %d bytes then %+v", out.stdout.Len(), out.last)
	}
}

func TestLiveReaderThatFallsBehindGetsAnErrorFrame(t *testing.T) {
	ts := startServer(t, Options{JournalBytes: journal.MaxChunk, StallTimeout: 50 * time.Millisecond})
	lease := ts.createLease()
	// One byte, then, behind a second gate, far more than the socket
	// buffers between server and client hold. The reader takes the first
	// frame before the flood starts: with the flood at once, a reader not
	// scheduled within the 50 ms stall timeout (a loaded machine) was
	// expired before its first frame.
	pid := ts.startProcess(lease, gated(`printf x; `+gated(`head -c 100000000 /dev/zero`)))
	st := ts.connect(lease, pid, 0)
	ts.openGate(lease)
	if ev, _ := st.next(false); ev.Type != "data" || ev.Seq != 1 {
		t.Fatalf("first frame %+v", ev)
	}
	ts.openGate(lease)
	// Stop reading until the process is done: the journal moves on.
	if _, status := ts.waitTree(lease, pid, 60*time.Second); status != http.StatusOK {
		t.Fatalf("wait: %d", status)
	}
	for {
		ev, ok := st.next(false)
		if !ok {
			t.Fatal("the stream ended without an error frame")
		}
		if ev.Type == "data" {
			continue
		}
		if ev.Type != "error" || ev.Error != "output_offset_expired" {
			t.Fatalf("frame %+v, want output_offset_expired", ev)
		}
		break
	}
	if _, more := st.next(true); more {
		t.Error("frames after the error frame")
	}
}

// TestLargeOutputKeepsServerMemoryBounded pushes 200 MiB through one
// process, once with a reader that keeps up (it must get every byte) and
// once with one that stalls (it gets output_offset_expired), and checks that
// the heap (server and test client share it) never grows by more than a few
// MiB.
func TestLargeOutputKeepsServerMemoryBounded(t *testing.T) {
	const total = 200 << 20
	for _, slow := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow=%v", slow), func(t *testing.T) {
			// The stalled reader is evicted after 100 ms; the fast one must
			// never be, however busy the machine (a loaded 2-core CI under
			// -race can leave it unscheduled for longer than that).
			stall := time.Minute
			if slow {
				stall = 100 * time.Millisecond
			}
			ts := startServer(t, Options{StallTimeout: stall})
			lease := ts.createLease()
			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)
			var peak atomic.Uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				var m runtime.MemStats
				for {
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc)
					}
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()

			pid := ts.startProcess(lease, gated(`head -c `+strconv.Itoa(total)+` /dev/zero`))
			resp := ts.request("GET", "/sandboxes/"+lease+"/processes/"+pid+"/connect?after=0", nil, nil)
			defer resp.Body.Close()
			ts.openGate(lease)
			body := bufio.NewReaderSize(resp.Body, 256<<10)
			var cursor int64
			if slow {
				if _, err := body.ReadSlice('\n'); err != nil {
					t.Fatal(err)
				}
				cursor = 1
				if _, status := ts.waitTree(lease, pid, 2*time.Minute); status != http.StatusOK {
					t.Fatalf("wait: %d", status)
				}
			}
			n, last := countOutput(t, body, cursor)
			close(stop)
			<-sampled
			if slow {
				if last != `{"type":"error","error":"output_offset_expired"}` {
					t.Errorf("stalled reader ended with %s", last)
				}
			} else if n != total || last != `{"type":"exit","exit_code":0}` {
				t.Errorf("got %d bytes then %s, want %d bytes then exit 0", n, last, total)
			}
			growth := int64(peak.Load()) - int64(base.HeapAlloc)
			t.Logf("heap: base %.1f MiB, peak growth %.1f MiB", float64(base.HeapAlloc)/(1<<20), float64(growth)/(1<<20))
			if growth > 16<<20 {
				t.Errorf("the heap grew by %.1f MiB while 200 MiB went through a 1 MiB journal", float64(growth)/(1<<20))
			}
		})
	}
}

// countOutput reads an NDJSON connect stream without decoding the data (a
// fast reader), checking the sequence, and returns the number of data bytes
// and the last frame.
func countOutput(t *testing.T, r io.Reader, cursor int64) (int, string) {
	t.Helper()
	var (
		total  int
		line   []byte
		buf    = make([]byte, 256<<10)
		seqKey = []byte(`"seq":`)
		b64Key = []byte(`"data_base64":"`)
		last   string
		carry  []byte
	)
	for {
		n, err := r.Read(buf)
		data := buf[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				carry = append(carry, data...)
				break
			}
			line, carry = append(carry, data[:i]...), carry[:0]
			data = data[i+1:]
			if s := bytes.Index(line, seqKey); s >= 0 && bytes.Contains(line, []byte(`"type":"data"`)) {
				rest := line[s+len(seqKey):]
				seq, _ := strconv.ParseInt(string(rest[:bytes.IndexByte(rest, ',')]), 10, 64)
				if seq != cursor+1 {
					t.Fatalf("seq %d after %d", seq, cursor)
				}
				cursor = seq
				b := line[bytes.Index(line, b64Key)+len(b64Key) : len(line)-2]
				total += len(b) / 4 * 3
				if len(b) > 0 && b[len(b)-1] == '=' {
					total--
					if b[len(b)-2] == '=' {
						total--
					}
				}
				continue
			}
			if !bytes.Contains(line, []byte("heartbeat")) {
				last = string(line)
			}
		}
		if err != nil {
			return total, last
		}
	}
}
