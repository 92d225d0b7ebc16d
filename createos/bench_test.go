package createos

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// benchFrameSizes are the output bytes per frame of the decode benchmarks.
var benchFrameSizes = []int{1 << 10, 32 << 10, 512 << 10}

// benchFrames is the number of consecutive frames a decode benchmark
// cycles through.
const benchFrames = 64

// benchText returns consecutive pieces of a valid text, size bytes each:
// frames cut characters apart, and the next frame completes them.
func benchText(size int) []string {
	text := strings.Repeat("output line: naïve café ✓ 😀\n", size*benchFrames/20+1)
	pieces := make([]string, benchFrames)
	for i := range pieces {
		pieces[i] = text[i*size : (i+1)*size]
	}
	return pieces
}

// BenchmarkDecodeOutput measures the decode path of every output frame:
// parse the NDJSON line, decode its base64, decode its UTF-8 (characters
// split across frames included) and keep the tail. MB/s counts the
// output's own bytes.
func BenchmarkDecodeOutput(b *testing.B) {
	for _, size := range benchFrameSizes {
		b.Run(fmt.Sprintf("frame=%dKiB", size>>10), func(b *testing.B) {
			pieces := benchText(size)
			lines := make([][]byte, len(pieces))
			for i, p := range pieces {
				lines[i] = []byte(dataFrame(int64(i+1), "stdout", p))
			}
			f := newFollower(&Client{cfg: settings{captureBytes: DefaultCaptureBytes}}, "sb-1", nopObserver{})
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%benchFrames == 0 {
					f.cursor = 0
				}
				fr, err := parseFrame(lines[i%benchFrames], f.scratch)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.take(fr); err != nil {
					b.Fatal(err)
				}
				f.scratch = fr.data[:0]
			}
			_ = f.result(exitStatus{})
		})
	}
}

// BenchmarkDecodeOutputFloor is the floor of BenchmarkDecodeOutput: only
// the base64 decoding of the same payloads, into a reused buffer — the
// work no decoder of the protocol can skip.
func BenchmarkDecodeOutputFloor(b *testing.B) {
	for _, size := range benchFrameSizes {
		b.Run(fmt.Sprintf("frame=%dKiB", size>>10), func(b *testing.B) {
			pieces := benchText(size)
			encoded := make([][]byte, len(pieces))
			for i, p := range pieces {
				encoded[i] = []byte(base64.StdEncoding.EncodeToString([]byte(p)))
			}
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := strictBase64.Decode(buf, encoded[i%benchFrames]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var _ sandbox.Observer = nopObserver{}
