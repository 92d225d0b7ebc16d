package createos

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// BenchmarkDecodeOutput measures the decode path of every output frame:
// parse the NDJSON line, decode its base64, decode its UTF-8 (characters
// split across frames included) and keep the tail. MB/s counts the
// output's own bytes.
func BenchmarkDecodeOutput(b *testing.B) {
	for _, size := range []int{1 << 10, 32 << 10, 512 << 10} {
		b.Run(fmt.Sprintf("frame=%dKiB", size>>10), func(b *testing.B) {
			// Consecutive pieces of a valid text: frames cut characters
			// apart, and the next frame completes them.
			const frames = 64
			text := strings.Repeat("output line: naïve café ✓ 😀\n", size*frames/20+1)
			lines := make([][]byte, frames)
			for i := range lines {
				lines[i] = []byte(dataFrame(int64(i+1), "stdout", text[i*size:(i+1)*size]))
			}
			f := newFollower(&Client{cfg: settings{captureBytes: DefaultCaptureBytes}}, "sb-1", nopObserver{})
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%frames == 0 {
					f.cursor = 0
				}
				fr, err := parseFrame(lines[i%frames])
				if err != nil {
					b.Fatal(err)
				}
				if err := f.take(fr); err != nil {
					b.Fatal(err)
				}
			}
			_ = f.result(exitStatus{})
		})
	}
}

var _ sandbox.Observer = nopObserver{}
