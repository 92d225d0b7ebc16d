package bench

import (
	"math"
	"slices"
	"time"
)

// Quantile returns the q-quantile (0 < q ≤ 1) of samples by the
// nearest-rank method, so always a value that was actually measured; 0
// for no samples.
func Quantile(samples []time.Duration, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// Millis is d as a Value in milliseconds.
func Millis(d time.Duration) Value { return Value{float64(d) / float64(time.Millisecond), "ms"} }
