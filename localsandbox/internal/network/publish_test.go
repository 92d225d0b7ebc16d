package network

import (
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// diagMsg is a struct inet_diag_msg of a socket in state at addr:port.
func diagMsg(state byte, addr netip.Addr, port uint16) []byte {
	msg := make([]byte, 72)
	msg[1] = state
	msg[0] = unix.AF_INET6
	if addr.Is4() {
		msg[0] = unix.AF_INET
	}
	binary.BigEndian.PutUint16(msg[4:], port)
	copy(msg[8:], addr.AsSlice())
	return msg
}

// The ports a preview request can reach (127.0.0.1:<port> inside the
// lease) are the listening sockets on a wildcard or on 127.0.0.1: not on
// another address, not on ::1 only, not a connection.
func TestAddListening(t *testing.T) {
	ports := map[int]bool{}
	for _, m := range [][]byte{
		diagMsg(tcpListen, netip.MustParseAddr("0.0.0.0"), 8000),
		diagMsg(tcpListen, netip.MustParseAddr("127.0.0.1"), 8001),
		diagMsg(tcpListen, netip.MustParseAddr("10.0.2.100"), 8002),
		diagMsg(1, netip.MustParseAddr("127.0.0.1"), 8003), // established
		diagMsg(tcpListen, netip.MustParseAddr("::"), 8004),
		diagMsg(tcpListen, netip.MustParseAddr("::1"), 8005),
		diagMsg(tcpListen, netip.MustParseAddr("::ffff:127.0.0.1"), 8006),
		diagMsg(tcpListen, netip.MustParseAddr("0.0.0.0"), 0),
		{1, 2, 3},
	} {
		addListening(m, ports)
	}
	if got, want := slices.Sorted(maps.Keys(ports)), []int{8000, 8001, 8004, 8006}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v", got, want)
	}
}
