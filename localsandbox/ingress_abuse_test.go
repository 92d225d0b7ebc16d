package localsandbox

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
)

// The tests of this file attack the preview proxy (ingress.go) from both
// of its sides: a client that floods a sandbox's preview URL, and a server
// in a sandbox that never answers. Both are untrusted: a preview URL
// carries no key, and a page a lease serves runs in the user's browser.

// heldServer is a server for a lease that accepts connections on port
// 8000 and never reads or answers them.
const heldServer = `
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8000)); s.listen(256)
held = []
while True:
    held.append(s.accept()[0])
`

// startInLease uploads program to path in the lease, starts it with
// python3 and waits until something listens on port.
func (ts *testServer) startInLease(lease, path, program string, port int) {
	ts.t.Helper()
	if status := ts.putFile(lease, path, program); status != http.StatusOK {
		ts.t.Fatalf("upload %s: %d", path, status)
	}
	ts.startProcess(lease, "exec python3 "+path)
	ts.waitListening(lease, port)
}

// previewConn opens a connection to the server and sends request, a format
// whose %s is the preview Host of port in lease; the answer is not read.
func (ts *testServer) previewConn(lease string, port int, request string) (net.Conn, *bufio.Reader) {
	ts.t.Helper()
	addr := ts.addr()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, request, previewHost(lease, port, addr)); err != nil {
		ts.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(hangGuard))
	return c, bufio.NewReader(c)
}

// readAnswer reads an answer from br and returns it with its body.
func readAnswer(t *testing.T, br *bufio.Reader, what string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v", what, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// ingressInFlight is how many preview requests to lease the server is
// proxying.
func (ts *testServer) ingressInFlight(lease string) int {
	ts.srv.mu.Lock()
	l := ts.srv.leases[lease]
	ts.srv.mu.Unlock()
	ts.srv.ingress.mu.Lock()
	defer ts.srv.ingress.mu.Unlock()
	return l.ingressInFlight
}

// waitInFlight waits until the server proxies want requests to lease (the
// proxy notices a request end or begin on its own goroutines).
func (ts *testServer) waitInFlight(lease string, want int) {
	ts.t.Helper()
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(5 * time.Millisecond) {
		n := ts.ingressInFlight(lease)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			ts.t.Fatalf("%d preview requests in flight to the lease, want %d", n, want)
		}
	}
}

// A server in a lease that never answers, and a client (say, a page of
// that lease in the user's browser) that opens preview requests to it as
// fast as it can: each holds a connection with a request in flight, which
// the connection caps never displace, so before the ingress caps the
// server refused every new connection from loopback, the API's included,
// once the per-address cap was reached. Now preview requests past the
// ingress cap (half the per-address cap by default) are answered 503 with
// Retry-After at once, their connections go idle, and the API is served.
func TestIngressHungServerDoesNotStarveTheAPI(t *testing.T) {
	needRoot(t)
	const perAddress = 8
	ts := startServer(t, Options{MaxConnections: 2 * perAddress, MaxConnectionsPerAddress: perAddress})
	if got := ts.srv.opts.MaxIngressRequests; got != perAddress/2 {
		t.Fatalf("MaxIngressRequests defaults to %d, want half of MaxConnectionsPerAddress", got)
	}
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	ts.startInLease(sb.ID, "/workspace/held.py", heldServer, 8000)

	const get = "GET / HTTP/1.1\r\nHost: %s\r\n\r\n"
	for range perAddress / 2 {
		ts.previewConn(sb.ID, 8000, get)
	}
	ts.waitInFlight(sb.ID, perAddress/2)
	for i := perAddress / 2; i < perAddress; i++ {
		_, br := ts.previewConn(sb.ID, 8000, get)
		resp, body := readAnswer(t, br, fmt.Sprintf("preview request %d to a server that never answers", i+1))
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "preview requests") {
			t.Errorf("preview request %d past the cap: %d %q, Retry-After %q", i+1, resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
	}
	// The API, from the same address.
	if st := ts.status(sb.ID); st != "running" {
		t.Errorf("the sandbox is %q", st)
	}
}

// wsEchoServerThreaded is wsEchoServer serving each connection on a thread
// of its own.
var wsEchoServerThreaded = strings.NewReplacer(
	"import base64, hashlib, socket", "import base64, hashlib, socket, threading",
	"s.listen(4)\nwhile True:\n    c, _ = s.accept()\n", "s.listen(256)\ndef serve(c):\n",
	"        c.close()\n        continue\n", "        c.close()\n        return\n",
).Replace(wsEchoServer) + "\nwhile True:\n    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()\n"

// wsConn is a client's WebSocket, spoken by hand: text frames of at
// most 125 bytes.
type wsConn struct {
	c  net.Conn
	br *bufio.Reader
}

// openWebSocket asks for a WebSocket upgrade through the preview URL of
// port in lease; it returns the connection if the answer was 101, and the
// answer.
func (ts *testServer) openWebSocket(lease string, port int) (*wsConn, *http.Response) {
	ts.t.Helper()
	c, br := ts.previewConn(lease, port, "GET /echo HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		ts.t.Fatalf("WebSocket upgrade through the preview URL: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.Close()
		return nil, resp
	}
	return &wsConn{c, br}, resp
}

// echo sends msg and returns the text frame that comes back.
func (ws *wsConn) echo(msg string) (string, error) {
	mask := []byte{1, 2, 3, 4}
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	if _, err := ws.c.Write(frame); err != nil {
		return "", err
	}
	var head [2]byte
	if _, err := io.ReadFull(ws.br, head[:]); err != nil {
		return "", err
	}
	payload := make([]byte, head[1]&0x7f)
	_, err := io.ReadFull(ws.br, payload)
	return string(payload), err
}

// A WebSocket through a preview URL is a hijacked connection, which the
// connection caps stop counting once upgraded: before the ingress caps, a
// client held as many as it liked (twelve here, with a cap of eight per
// address: two descriptors each on the server, and goroutines, without
// bound). Now WebSockets count as preview requests for as long as they are
// open.
func TestIngressWebSocketsAreCapped(t *testing.T) {
	needRoot(t)
	const perAddress, flood = 8, 12
	ts := startServer(t, Options{MaxConnections: 2 * perAddress, MaxConnectionsPerAddress: perAddress})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	ts.startInLease(sb.ID, "/workspace/ws.py", wsEchoServerThreaded, 9000)

	var open []*wsConn
	for range flood {
		ws, resp := ts.openWebSocket(sb.ID, 9000)
		if ws != nil {
			open = append(open, ws)
			continue
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("upgrade refused with %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if len(open) != perAddress/2 {
		t.Errorf("%d WebSockets open through one preview URL (server sockets by address: %v), want the ingress cap, %d",
			len(open), serverSockets(t, serverAddr(t, ts)), perAddress/2)
	}
	// Those open still echo, and a closed one frees its place.
	for _, ws := range open {
		if got, err := ws.echo("ping"); err != nil || got != "echo: ping" {
			t.Fatalf("echo: %q %v", got, err)
		}
	}
	if len(open) > 0 {
		open[0].c.Close()
		ts.waitInFlight(sb.ID, len(open)-1)
		if ws, resp := ts.openWebSocket(sb.ID, 9000); ws == nil {
			t.Errorf("after one WebSocket closed: %d", resp.StatusCode)
		}
	}
}

// One lease cannot take every place: its cap is below the server's.
func TestIngressCapsPerLeaseAndInAll(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{MaxIngressRequests: 3, MaxIngressRequestsPerLease: 2})
	a := ts.createWith(map[string]any{"ingress_enabled": true})
	b := ts.createWith(map[string]any{"ingress_enabled": true})
	ts.startInLease(a.ID, "/workspace/held.py", heldServer, 8000)
	ts.startInLease(b.ID, "/workspace/held.py", heldServer, 8000)
	const get = "GET / HTTP/1.1\r\nHost: %s\r\n\r\n"
	refused := func(lease, what, want string) {
		t.Helper()
		_, br := ts.previewConn(lease, 8000, get)
		if resp, body := readAnswer(t, br, what); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, want) {
			t.Errorf("%s: %d %q, want 503 %q", what, resp.StatusCode, body, want)
		}
	}
	held, _ := ts.previewConn(a.ID, 8000, get)
	ts.previewConn(a.ID, 8000, get)
	ts.waitInFlight(a.ID, 2)
	refused(a.ID, "a third request to one lease", "to this sandbox (2 in flight)")
	ts.previewConn(b.ID, 8000, get)
	ts.waitInFlight(b.ID, 1)
	refused(b.ID, "a fourth request in all", "in flight (3)")

	held.Close() // the client goes away: its place is free again
	ts.waitInFlight(a.ID, 1)
	ts.previewConn(b.ID, 8000, get)
	ts.waitInFlight(b.ID, 2)
}

// A body that stalls through a preview URL is cut off at BodyReadTimeout,
// as on the API, and answered 408; its place is free again. (Before, the
// answer was 502 "nothing answers on port 8000", blaming the server in the
// lease.)
func TestIngressSlowBody(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{BodyReadTimeout: 100 * time.Millisecond})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	ts.startInLease(sb.ID, "/workspace/held.py", heldServer, 8000)
	c, br := ts.previewConn(sb.ID, 8000, "POST /upload HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\nx")
	if resp, body := readAnswer(t, br, "a stalled body"); resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("a stalled body through a preview URL: %d %q, want 408", resp.StatusCode, body)
	}
	assertClosed(t, c, br)
	ts.waitInFlight(sb.ID, 0)
}

// Host headers that try to reach what they should not: another lease (one
// without ingress), a port out of range or written otherwise, the domain in
// other cases, an IDN look-alike, a trailing dot, an absolute URI naming
// another host. None reaches a lease it does not name with ingress on, and
// anything that is not exactly a preview host is an API request (which
// needs the key).
func TestIngressHostTricks(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{})
	a := ts.createWith(map[string]any{"ingress_enabled": true})
	b := ts.createWith(nil)
	for lease, who := range map[string]string{a.ID: "A", b.ID: "B"} {
		if status := ts.putFile(lease, "/workspace/site/who", who); status != http.StatusOK {
			t.Fatalf("upload: %d", status)
		}
		ts.startProcess(lease, "cd /workspace/site && exec python3 -m http.server 8000 --bind 0.0.0.0")
		ts.waitListening(lease, 8000)
	}
	addr := serverAddr(t, ts).String()
	_, port, _ := net.SplitHostPort(addr)
	upper := strings.ToUpper(a.ID)
	for _, c := range []struct {
		host   string
		target string // the request target; default /who
		status int
		body   string
	}{
		{host: "8000-" + a.ID + ".localhost:" + port, status: 200, body: "A"},
		{host: "8000-" + upper + ".LOCALHOST:" + port, status: 200, body: "A"},
		{host: "8000-" + a.ID + ".localhost", status: 200, body: "A"},          // no port
		{host: "8000-" + a.ID + ".localhost:1", status: 200, body: "A"},        // another port: the listener decides
		{host: "8000-" + a.ID + ".localhost.:" + port, status: 200, body: "A"}, // the same name, fully qualified
		{host: "8000-" + b.ID + ".localhost:" + port, status: 403},             // no ingress
		{host: "8000-" + a.ID + "-" + b.ID + ".localhost", status: 404},
		{host: "8000-" + a.ID + "." + b.ID + ".localhost", status: 401},
		{host: "8000-" + a.ID + ".localhost..", status: 401},
		{host: "8000-" + a.ID + ".localhost.example", status: 401},
		{host: "x.8000-" + a.ID + ".localhost", status: 401},
		{host: "0-" + a.ID + ".localhost", status: 401},
		{host: "65536-" + a.ID + ".localhost", status: 401},
		{host: "08000-" + a.ID + ".localhost", status: 401},
		{host: "+8000-" + a.ID + ".localhost", status: 401},
		{host: "0x1f40-" + a.ID + ".localhost", status: 401},
		{host: "8000-" + a.ID + ".xn--localhst-9za", status: 401},
		{host: "8000-" + a.ID + ".locaⅼhost", status: 400},     // U+217C, not an l: not a valid Host
		{host: "8000-" + a.ID + ".localhost\x00", status: 400}, // nor a NUL
		// An absolute URI names the host; the Host header is ignored.
		{host: "8000-" + a.ID + ".localhost", target: "http://8000-" + b.ID + ".localhost/who", status: 403},
		{host: "8000-" + a.ID + ".localhost", target: "http://" + addr + "/v1/sandboxes", status: 401},
	} {
		target := c.target
		if target == "" {
			target = "/who"
		}
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, c.host)
		conn.SetReadDeadline(time.Now().Add(hangGuard))
		resp, body := readAnswer(t, bufio.NewReader(conn), c.host)
		conn.Close()
		if resp.StatusCode != c.status || (c.body != "" && body != c.body) || (c.body == "" && (body == "A" || body == "B")) {
			t.Errorf("Host %q, %s: %d %.80q, want %d %q", c.host, target, resp.StatusCode, body, c.status, c.body)
		}
	}
}

// manyPortsServer answers every request on ports 9000 to 9000+n-1 with
// "ok", keeping connections open between requests.
const manyPortsServer = `
import asyncio, sys
async def handle(r, w):
    try:
        while True:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
    except Exception:
        w.close()
async def main():
    for p in range(9000, 9000 + int(sys.argv[1])):
        await asyncio.start_server(handle, "0.0.0.0", p)
    await asyncio.Event().wait()
asyncio.run(main())
`

// leaseConnections counts the established TCP connections inside the
// lease whose local port is in [from, from+n): those its servers accepted.
func (ts *testServer) leaseConnections(lease string, from, n int) int {
	ts.t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", ts.leaseInit(lease)))
	if err != nil {
		ts.t.Fatal(err)
	}
	count := 0
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "01" { // 01: established
			continue
		}
		_, hexPort, _ := strings.Cut(f[1], ":")
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) >= from && int(p) < from+n {
			count++
		}
	}
	return count
}

// The proxy keeps connections into a lease open for the next request.
// Before, it kept one per port asked, up to four each, for 30 s: a client
// asking each of the ports a lease listens on in turn (one at a time, so
// no cap on requests in flight applies) made the server hold a descriptor
// per port, 100 here, 65,535 a lease at most. Now it keeps at most
// network.MaxIdlePerLease per lease.
func TestIngressIdleConnectionsAreBounded(t *testing.T) {
	needRoot(t)
	const ports = 100
	ts := startServer(t, Options{})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	if status := ts.putFile(sb.ID, "/workspace/ports.py", manyPortsServer); status != http.StatusOK {
		t.Fatalf("upload: %d", status)
	}
	ts.startProcess(sb.ID, fmt.Sprintf("exec python3 /workspace/ports.py %d", ports))
	ts.waitListening(sb.ID, 9000+ports-1)
	for p := 9000; p < 9000+ports; p++ {
		_, br := ts.previewConn(sb.ID, p, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n")
		if resp, body := readAnswer(t, br, fmt.Sprintf("port %d", p)); resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("port %d: %d %q", p, resp.StatusCode, body)
		}
	}
	if n := ts.leaseConnections(sb.ID, 9000, ports); n > network.MaxIdlePerLease {
		t.Errorf("the server holds %d connections into the lease after %d requests, one at a time; want at most %d", n, ports, network.MaxIdlePerLease)
	}
}

// floodServer is a server for a lease, on port 8000, whose answers cost
// the proxy what it can be made to hold: /headers 9 MiB of headers (under
// net/http's default cap of 10 MiB), /early four 103 Early Hints of 56 KiB
// of headers each before its answer, /body 8 MiB of body.
const floodServer = `
import socket, threading
LINE = b"X-Big: " + b"a" * 8000 + b"\r\n"
HEADERS = LINE * (9 * 1024 * 1024 // len(LINE))
CHUNK = b"b" * (1 << 20)
def serve(c):
    try:
        f = c.makefile("rb")
        path = f.readline().split()[1]
        while f.readline() not in (b"\r\n", b""):
            pass
        if path == b"/headers":
            c.sendall(b"HTTP/1.1 200 OK\r\n" + HEADERS + b"Content-Length: 0\r\n\r\n")
        elif path == b"/early":
            for _ in range(4):
                c.sendall(b"HTTP/1.1 103 Early Hints\r\n" + LINE * 7 + b"\r\n")
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        else:
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (8 * len(CHUNK)))
            for _ in range(8):
                c.sendall(CHUNK)
    except OSError:
        pass
    finally:
        c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8000)); s.listen(256)
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
`

// peakRSS resets the process's peak resident set to its current one and
// returns a function that reports how far the peak rose since (VmHWM,
// proc(5): writing 5 to clear_refs resets it).
func peakRSS(t *testing.T) (rose func() (peak, base int64)) {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("resetting the peak RSS: %v", err)
	}
	base := procStatusKiB(t, "VmHWM")
	return func() (int64, int64) { return procStatusKiB(t, "VmHWM"), base }
}

// procStatusKiB is a field of /proc/self/status, in KiB.
func procStatusKiB(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", field, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// A server in a lease answering huge headers to many preview requests at
// once (a page of the lease in the user's browser can open them) must not
// flood the server's memory. Before, each response's headers could take
// net/http's default 10 MiB: 40 such answers at once raised this process's
// peak RSS by hundreds of MiB. Now headers past network.MaxResponseHeaderBytes
// are a 502 that names them, 1xx headers are capped alike, bodies stream,
// and the peak stays within floodRSSBound whatever the mix.
func TestIngressResponseFloodIsBounded(t *testing.T) {
	needRoot(t)
	const (
		headers, early, bodies = 40, 8, 8
		floodRSSBound          = 48 << 10 // KiB
	)
	ts := startServer(t, Options{})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	ts.startInLease(sb.ID, "/workspace/flood.py", floodServer, 8000)

	type answer struct {
		path, status string
		bytes        int64
		err          error
	}
	paths := slices.Concat(slices.Repeat([]string{"/headers"}, headers), slices.Repeat([]string{"/early"}, early), slices.Repeat([]string{"/body"}, bodies))
	answers := make(chan answer, len(paths))
	rose := peakRSS(t)
	host := previewHost(sb.ID, 8000, ts.addr())
	for _, path := range paths {
		go func() {
			a := answer{path: path}
			defer func() { answers <- a }()
			c, err := net.Dial("tcp", ts.addr())
			if err != nil {
				a.err = err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * hangGuard))
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
			// The answer is read and dropped as it comes: this client holds
			// no more than a line of it.
			br := bufio.NewReader(c)
			if a.status, a.err = br.ReadString('\n'); a.err != nil {
				return
			}
			a.bytes, a.err = io.Copy(io.Discard, br)
		}()
	}
	byPath := map[string][]answer{}
	for range paths {
		a := <-answers
		byPath[a.path] = append(byPath[a.path], a)
		if a.err != nil {
			t.Errorf("GET %s: %v", a.path, a.err)
		}
	}
	peak, base := rose()
	t.Logf("peak RSS %d MiB over a base of %d MiB (+%d KiB) for %d preview requests at once", peak>>10, base>>10, peak-base, len(paths))
	for _, a := range byPath["/headers"] {
		if !strings.HasPrefix(a.status, "HTTP/1.1 502") {
			t.Errorf("9 MiB of headers: %q, want 502", a.status)
			break
		}
	}
	for _, a := range byPath["/early"] {
		if !strings.HasPrefix(a.status, "HTTP/1.1 103") {
			t.Errorf("early hints: %q, want 103 then 200", a.status)
			break
		}
	}
	for _, a := range byPath["/body"] {
		if !strings.HasPrefix(a.status, "HTTP/1.1 200") || a.bytes < 8<<20 {
			t.Errorf("an 8 MiB body: %q, %d bytes", a.status, a.bytes)
			break
		}
	}
	if peak-base > floodRSSBound {
		t.Errorf("the server's peak RSS rose by %d MiB under the flood, want at most %d MiB", (peak-base)>>10, floodRSSBound>>10)
	}
	// The 502 names what the server in the lease did.
	if status, body := ts.preview(sb.ID, 8000, "/headers"); status != http.StatusBadGateway || !strings.Contains(body, "64 KiB of headers") {
		t.Errorf("huge headers: %d %q", status, body)
	}
}
