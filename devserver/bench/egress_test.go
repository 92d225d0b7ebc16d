package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEgressRow(t *testing.T) {
	rates, err := parseBenchmarks([]byte(`BenchmarkEgressThroughput/slirp4netns-2         	       3	 573421012 ns/op	 117.03 MB/s
BenchmarkEgressThroughput/lease-loopback-2      	       3	 136102344 ns/op	 493.07 MB/s
`))
	require.NoError(t, err)
	rows, err := egressRows(rates)
	require.NoError(t, err)
	assert.Contains(t, Report{Rows: rows}.Markdown(),
		"| P7 egress throughput: bulk TCP from a lease through slirp4netns to the host | 117 MB/s | 493 MB/s (the same bytes over the lease's own loopback) | 0.24× | — | info |\n")

	_, err = egressRows(map[string]float64{"BenchmarkEgressThroughput/lease-loopback": 493})
	assert.ErrorContains(t, err, "did not report", "a skipped benchmark is a failure of the part, not a row")
}
