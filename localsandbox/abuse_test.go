package localsandbox

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests of this file attack a real server on loopback, one way each,
// and check what the host sees afterwards: the sockets the server holds,
// its heap, the files of a canary directory.

// hangGuard bounds a raw read of a test, so that a server that holds a
// request forever fails the test instead of hanging it. It is never what a
// passing test waits for: that is the server's own deadline.
const hangGuard = 20 * time.Second

// TestAbuseConnectionFlood: 2,000 idle connections from ten addresses do
// not make the server hold more than its caps, and an authenticated client
// still runs a command.
func TestAbuseConnectionFlood(t *testing.T) {
	const total, perAddress, flood, addresses = 64, 8, 2000, 10
	ts := startServer(t, Options{MaxConnections: total, MaxConnectionsPerAddress: perAddress})
	addr := serverAddr(t, ts)
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range flood {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%addresses))}}
		c, err := d.Dial("tcp", addr.String())
		if err != nil {
			t.Fatalf("flood connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}

	lease := ts.createLease()
	if res := ts.exec(lease, "echo ok"); res.ExitCode != 0 || res.Stdout != "ok\n" {
		t.Fatalf("exec after the flood: %+v", res)
	}

	// Every flood connection was accepted before the client's, so the
	// server has dealt with all of them. A connection it closed while its
	// goroutine was reading keeps its descriptor until that goroutine
	// wakes: give the host's view a moment to settle (up to half of
	// headerTimeout: a loaded 2-core CI under -race took over a second),
	// less than headerTimeout, after which even a server without caps
	// closes idle connections.
	var held map[string]int
	within := func() bool {
		held = serverSockets(t, addr)
		sum := 0
		for _, n := range held {
			if n > perAddress {
				return false
			}
			sum += n
		}
		return sum <= total
	}
	for end := time.Now().Add(headerTimeout / 2); !within(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after %d connections from %d addresses the server holds %v; the caps are %d, %d per address", flood, addresses, held, total, perAddress)
		}
	}
	t.Logf("after %d flood connections the server holds %v", flood, held)
}

// TestAbuseSlowBody: a request with the right key whose body stalls after
// one byte is answered 408 and its connection closed once BodyReadTimeout
// has passed, instead of being held forever.
func TestAbuseSlowBody(t *testing.T) {
	ts := startServer(t, Options{BodyReadTimeout: 100 * time.Millisecond})
	lease := ts.createLease()
	for _, route := range []struct{ method, path string }{
		{"POST", "/sandboxes/" + lease + "/exec"},
		{"PUT", "/sandboxes/" + lease + "/files?path=/workspace/f"},
	} {
		method, route := route.method, route.path
		c, br := rawRequest(t, ts, method, route, "X-Api-Key: "+testKey+"\r\nContent-Length: 1000\r\n", "{")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s %s: no answer to a stalled body: %v", method, route, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("%s %s with a stalled body: HTTP %d, want 408", method, route, resp.StatusCode)
		}
		assertClosed(t, c, br)
	}
}

// TestAbuseBodyTimeoutSparesStreams: the body deadline bounds how long a
// body takes to arrive, not how long the request may then run: an exec,
// a long poll and an output stream that outlast it end normally.
func TestAbuseBodyTimeoutSparesStreams(t *testing.T) {
	ts := startServer(t, Options{BodyReadTimeout: 50 * time.Millisecond})
	lease := ts.createLease()
	if res := ts.exec(lease, "sleep 0.3; echo late"); res.Stdout != "late\n" {
		t.Errorf("exec that outlasts the body timeout: %+v", res)
	}
	pid := ts.startProcess(lease, "read line; sleep 0.3; echo got $line")
	st := ts.connect(lease, pid, 0)
	in := map[string]string{"data_base64": "aGkK"} // "hi\n"
	ts.mustCall("POST", "/sandboxes/"+lease+"/processes/"+pid+"/input", in, nil)
	w, status := ts.waitTree(lease, pid, 10*time.Second)
	if status != http.StatusOK || w.ExitCode == nil || *w.ExitCode != 0 {
		t.Errorf("long poll that outlasts the body timeout: %d %+v", status, w)
	}
	if out := st.drain(0); out.stdout.String() != "got hi\n" {
		t.Errorf("stream that outlasts the body timeout carried %q", out.stdout.String())
	}
}

// TestAbuseUnauthenticatedBody: a request with a wrong key is answered 401
// without its body: a body that never arrives does not delay the answer,
// and the connection is closed after it, so the body is never read.
func TestAbuseUnauthenticatedBody(t *testing.T) {
	ts := startServer(t, Options{})
	for _, tc := range []struct{ name, header, body string }{
		{"huge length", "Content-Length: 1073741824\r\n", strings.Repeat("x", 64<<10)},
		{"short length", "Content-Length: 1000\r\n", "{"},
		{"chunked", "Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n"},
	} {
		c, br := rawRequest(t, ts, "POST", "/sandboxes/x/exec", "X-Api-Key: wrong\r\n"+tc.header, tc.body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: no answer before the body: %v", tc.name, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d, want 401", tc.name, resp.StatusCode)
		}
		assertClosed(t, c, br)
	}
}

// TestAbuseHistoryMemory: many execs with a 0.9 MiB command line leave the
// server's heap near where it was once their lease is gone: History keeps a
// bounded prefix of each command line.
func TestAbuseHistoryMemory(t *testing.T) {
	const execs = 40
	ts := startServer(t, Options{})
	lease := ts.createLease()
	args := make([]string, 9)
	for i := range args {
		args[i] = strings.Repeat(string(rune('a'+i)), 100<<10)
	}
	body := map[string]any{"cmd": "/bin/true", "args": args}
	ts.mustCall("POST", "/sandboxes/"+lease+"/exec", body, nil)
	before := heapAfterGC()

	for range execs {
		ts.mustCall("POST", "/sandboxes/"+lease+"/exec", body, nil)
	}
	ts.mustCall("DELETE", "/sandboxes/"+lease, nil, nil)
	after := heapAfterGC()

	sent := uint64(execs * len(args) * len(args[0]))
	grown := int64(after) - int64(before)
	t.Logf("heap %d -> %d bytes (%+d) after %d bytes of command lines", before, after, grown, sent)
	if grown > int64(sent/8) {
		t.Errorf("the heap grew by %d bytes after %d execs of %d-byte command lines, gone with their lease", grown, execs, sent/execs)
	}
	n := 0
	for _, rec := range ts.srv.History() {
		if rec.LeaseID != lease {
			continue
		}
		n++
		size := 0
		for _, a := range rec.Argv {
			size += len(a)
		}
		if size > headBytes+64 || rec.Argv[0] != "/bin/true" || !strings.HasPrefix(rec.Argv[1], "aaaa") {
			t.Fatalf("history keeps %d bytes of argv, starting %.40q", size, rec.Argv)
		}
	}
	if n != execs+1 {
		t.Errorf("history holds %d execs of the lease, want %d", n, execs+1)
	}
}

// TestAbuseErrorEcho: errors about a 900 KB input (30 KB in a query, which
// has to fit the header limit) quote at most a short prefix of it.
func TestAbuseErrorEcho(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	huge := func(c byte) string { return strings.Repeat(string(c), 900_000) }
	for _, tc := range []struct {
		name, method, path string
		body               any
		status             int
	}{
		// An exec whose command cannot start answers a result saying why.
		{"command not found", "POST", "/sandboxes/" + lease + "/exec", map[string]any{"cmd": huge('x')}, http.StatusOK},
		{"command not found, streamed", "POST", "/sandboxes/" + lease + "/exec?stream=true", map[string]any{"cmd": huge('x'), "stream": true}, http.StatusOK},
		{"program not found", "POST", "/sandboxes/" + lease + "/processes", map[string]any{"cmd": huge('t')}, http.StatusBadRequest},
		{"working directory", "POST", "/sandboxes/" + lease + "/processes", map[string]any{"cmd": "/bin/true", "cwd": "/workspace/" + huge('y')}, http.StatusBadRequest},
		{"field type", "POST", "/sandboxes", `{"shape":"s-1vcpu-1gb","labels":{"` + strings.Repeat("w", 100) + `":5}}`, http.StatusBadRequest},
		{"shape", "POST", "/sandboxes", map[string]any{"shape": huge('v')}, http.StatusBadRequest},
		{"name", "POST", "/sandboxes", map[string]any{"name": huge('n')}, http.StatusBadRequest},
		{"env name", "POST", "/sandboxes", map[string]any{"envs": map[string]string{huge('e'): "x"}}, http.StatusBadRequest},
		{"env value", "POST", "/sandboxes", map[string]any{"envs": map[string]string{"A": huge('f') + "\x00"}}, http.StatusBadRequest},
		{"rootfs", "POST", "/sandboxes", map[string]any{"rootfs": strings.Repeat("r", 150)}, http.StatusBadRequest},
		{"file path", "GET", "/sandboxes/" + lease + "/files?path=" + url.QueryEscape("/etc/"+strings.Repeat("u", 30_000)), nil, http.StatusBadRequest},
	} {
		var raw []byte
		switch b := tc.body.(type) {
		case nil:
		case string:
			raw = []byte(b)
		default:
			raw, _ = json.Marshal(b)
		}
		resp := ts.request(tc.method, tc.path, strings.NewReader(string(raw)), nil)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: HTTP %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
		if run := longestRun(msg); len(msg) > 400 || run > maxEcho {
			t.Errorf("%s: a %d-byte answer quotes %d bytes of the input: %.200s", tc.name, len(msg), run, msg)
		}
		t.Logf("%s: %.300s", tc.name, msg)
	}
}

// TestAbuseInheritedDescriptor: a descriptor the server inherited without
// close-on-exec (as `exec 9</; sandboxd` leaves one) does not reach the
// commands: they can neither list nor write the directory it opens.
func TestAbuseInheritedDescriptor(t *testing.T) {
	canary := t.TempDir()
	if err := os.Chmod(canary, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(canary, "canary-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// What the server inherits: an open directory without FD_CLOEXEC.
	fd, err := unix.Open(canary, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)

	ts := startServer(t, Options{})
	lease := ts.createLease()
	res := ts.exec(lease, fmt.Sprintf("ls -l /proc/self/fd; ls /proc/self/fd/%d/; echo owned > /proc/self/fd/%d/owned", fd, fd))
	if strings.Contains(res.Stdout, "canary-file") {
		t.Errorf("a command listed the host directory of an inherited descriptor:\n%s", res.Stdout)
	}
	if _, err := os.Stat(filepath.Join(canary, "owned")); err == nil {
		t.Errorf("a command wrote into the host directory of an inherited descriptor")
	}
	if res.ExitCode == 0 {
		t.Errorf("writing through the inherited descriptor succeeded: %+v", res)
	}
}

// serverAddr is the test server's address.
func serverAddr(t *testing.T, ts *testServer) *net.TCPAddr {
	t.Helper()
	u, err := url.Parse(ts.base)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := net.ResolveTCPAddr("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// rawRequest writes a request's head and the start of its body on a new
// connection and leaves the rest of the body unsent.
func rawRequest(t *testing.T, ts *testServer, method, path, header, body string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", serverAddr(t, ts).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "%s /v1%s HTTP/1.1\r\nHost: sandboxd\r\n%s\r\n%s", method, path, header, body); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(hangGuard))
	return c, bufio.NewReader(c)
}

// assertClosed fails the test unless the server closed c after its answer.
func assertClosed(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	_, err := br.ReadByte()
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Errorf("the server kept the connection open")
	case err == nil:
		t.Errorf("the server sent more after its answer")
	}
}

// serverSockets counts the TCP connections of this process whose local
// address is server's, by remote address: the connections the server holds.
func serverSockets(t *testing.T, server *net.TCPAddr) map[string]int {
	t.Helper()
	mine := map[string]bool{}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			if inode, ok := strings.CutPrefix(link, "socket:["); ok {
				mine[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	raw, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int{}
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] == "0A" || !mine[f[9]] { // 0A: listening
			continue
		}
		// The server's end by its address, not its port alone: a client
		// socket bound to another loopback address (the flood's) may get
		// the same port number from the kernel.
		local, remote := procAddr(t, f[1]), procAddr(t, f[2])
		if local.Port == server.Port && local.IP.Equal(server.IP) {
			held[remote.IP.String()]++
		}
	}
	return held
}

// procAddr parses an IPv4 address of /proc/net/tcp ("0100007F:1F90").
func procAddr(t *testing.T, s string) *net.TCPAddr {
	t.Helper()
	ipHex, portHex, _ := strings.Cut(s, ":")
	b, err := hex.DecodeString(ipHex)
	port, err2 := strconv.ParseUint(portHex, 16, 16)
	if err != nil || err2 != nil || len(b) != 4 {
		t.Fatalf("bad /proc/net/tcp address %q", s)
	}
	return &net.TCPAddr{IP: net.IPv4(b[3], b[2], b[1], b[0]), Port: int(port)}
}

// heapAfterGC is the live heap after a full collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

var repeated = regexp.MustCompile(`(?:a{20,}|b{20,}|u{20,}|v{20,}|w{20,}|x{20,}|y{20,}|z{20,})`)

// longestRun is the length of the longest run of an input's filler byte in
// msg.
func longestRun(msg []byte) int {
	n := 0
	for _, m := range repeated.FindAll(msg, -1) {
		n = max(n, len(m))
	}
	return n
}
