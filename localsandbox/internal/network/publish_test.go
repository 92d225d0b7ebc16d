package network

import (
	"maps"
	"slices"
	"testing"
)

// The ports a preview request can reach (127.0.0.1:<port> inside the
// lease) are the listening sockets on a wildcard or on 127.0.0.1: not on
// another address, not ::1 only, not a connection.
func TestParseListening(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 6400020A:1F42 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
   3: 0100007F:1F43 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
`
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F44 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:1F45 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6 1 0 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1F46 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7 1 0 100 0 0 10 0
`
	ports := map[int]bool{}
	parseListening([]byte(tcp), ports)
	parseListening([]byte(tcp6), ports)
	if got, want := slices.Sorted(maps.Keys(ports)), []int{8000, 8001, 8004, 8006}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v", got, want)
	}
}
