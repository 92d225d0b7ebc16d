package localsandbox

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"golang.org/x/net/websocket"
)

// needRoot skips a test that needs a server running as root (which makes
// the leases' network namespaces), and fails it under CI.
func needRoot(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "ingress needs a server running as root")
}

// preview sends GET path to the server with the preview Host of port in
// lease, without an API key.
func (ts *testServer) preview(lease string, port int, path string) (int, string) {
	ts.t.Helper()
	addr := ts.addr()
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		ts.t.Fatal(err)
	}
	req.Host = previewHost(lease, port, addr)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatalf("preview GET: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// addr is the server's host:port.
func (ts *testServer) addr() string {
	return strings.TrimSuffix(strings.TrimPrefix(ts.base, "http://"), "/v1")
}

func previewHost(lease string, port int, serverAddr string) string {
	_, serverPort, _ := net.SplitHostPort(serverAddr)
	return fmt.Sprintf("%d-%s.localhost:%s", port, lease, serverPort)
}

// waitListening waits, inside the lease, until something listens on port.
func (ts *testServer) waitListening(lease string, port int) {
	ts.t.Helper()
	out := ts.exec(lease, fmt.Sprintf(`for i in $(seq 1000); do (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null && exit 0; sleep 0.01; done; exit 1`, port))
	if out.ExitCode != 0 {
		ts.t.Fatalf("nothing listens on %d in the lease", port)
	}
}

// The host-name form (--ingress-domain); the address form, the default:
// preview_address_test.go.
func TestPreviewURLServesAServerInTheLease(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{IngressDomain: "localhost"})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	addr := ts.addr()
	_, serverPort, _ := net.SplitHostPort(addr)
	if want := "http://<port>-" + sb.ID + ".localhost:" + serverPort; !sb.IngressEnabled || sb.IngressURLTemplate != want {
		t.Fatalf("view: ingress %v template %q, want %q", sb.IngressEnabled, sb.IngressURLTemplate, want)
	}
	if status := ts.putFile(sb.ID, "/workspace/site/hello.txt", "hello through the preview URL\n"); status != http.StatusOK {
		t.Fatalf("upload: %d", status)
	}
	ts.startProcess(sb.ID, `cd /workspace/site && exec python3 -m http.server 8000 --bind 0.0.0.0`)
	ts.waitListening(sb.ID, 8000)

	// No API key: a preview URL carries none.
	if status, body := ts.preview(sb.ID, 8000, "/hello.txt"); status != http.StatusOK || body != "hello through the preview URL\n" {
		t.Errorf("preview: %d %q", status, body)
	}
	if status, _ := ts.preview(sb.ID, 8001, "/"); status != http.StatusBadGateway {
		t.Errorf("a port nobody listens on: %d, want 502", status)
	}
	if status, _ := ts.preview("sb-nosuchsandbox", 8000, "/"); status != http.StatusNotFound {
		t.Errorf("unknown sandbox: %d, want 404", status)
	}

	// Disabled ingress, then paused, then destroyed.
	var v networkData
	ts.mustCall("PATCH", "/sandboxes/"+sb.ID, map[string]any{"ingress_enabled": false}, &v)
	if v.IngressEnabled || v.IngressURLTemplate != "" {
		t.Errorf("after PATCH false: %+v", v)
	}
	if status, _ := ts.preview(sb.ID, 8000, "/hello.txt"); status != http.StatusForbidden {
		t.Errorf("ingress disabled: %d, want 403", status)
	}
	ts.mustCall("PATCH", "/sandboxes/"+sb.ID, map[string]any{"ingress_enabled": true}, &v)
	if !v.IngressEnabled || v.IngressURLTemplate == "" {
		t.Errorf("after PATCH true: %+v", v)
	}
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/pause", nil, nil)
	waitStatus(t, ts, sb.ID, "paused")
	if status, _ := ts.preview(sb.ID, 8000, "/hello.txt"); status != http.StatusConflict {
		t.Errorf("paused: %d, want 409", status)
	}
	ts.mustCall("DELETE", "/sandboxes/"+sb.ID, nil, nil)
	if status, _ := ts.preview(sb.ID, 8000, "/hello.txt"); status != http.StatusNotFound {
		t.Errorf("destroyed: %d, want 404", status)
	}
}

func TestPreviewNeedsIngressEnabled(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{})
	sb := ts.createWith(nil)
	if sb.IngressEnabled || sb.IngressURLTemplate != "" {
		t.Fatalf("view %+v", sb)
	}
	if status, _ := ts.preview(sb.ID, 8000, "/"); status != http.StatusForbidden {
		t.Errorf("preview without ingress: %d, want 403", status)
	}
}

// wsEchoServer is a WebSocket echo server over raw sockets (RFC 6455, text
// frames up to 125 bytes), run inside the lease. It answers "saw-key" if
// the upgrade request carried an X-Api-Key.
const wsEchoServer = `
import base64, hashlib, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen(4)
while True:
    c, _ = s.accept()
    req = b""
    while b"\r\n\r\n" not in req:
        got = c.recv(4096)
        if not got:
            break
        req += got
    if b"\r\n\r\n" not in req:
        c.close()
        continue
    headers = {}
    for line in req.decode().split("\r\n")[1:]:
        if ": " in line:
            k, v = line.split(": ", 1); headers[k.lower()] = v
    accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n").encode())
    def frame(text):
        b = text.encode(); return bytes([0x81, len(b)]) + b
    if "x-api-key" in headers:
        c.sendall(frame("saw-key"))
    while True:
        h = c.recv(2)
        if len(h) < 2 or h[0] & 0x0f == 8:
            break
        n = h[1] & 0x7f; mask = c.recv(4); data = b""
        while len(data) < n:
            data += c.recv(n - len(data))
        c.sendall(frame("echo: " + bytes(b ^ mask[i % 4] for i, b in enumerate(data)).decode()))
    c.close()
`

func TestWebSocketThroughIngress(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	if status := ts.putFile(sb.ID, "/workspace/ws.py", wsEchoServer); status != http.StatusOK {
		t.Fatalf("upload: %d", status)
	}
	ts.startProcess(sb.ID, `exec python3 /workspace/ws.py`)
	ts.waitListening(sb.ID, 9000)

	addr := ts.addr()
	host := previewHost(sb.ID, 9000, addr)
	cfg, err := websocket.NewConfig("ws://"+host+"/echo", "http://"+host)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Header = http.Header{"X-Api-Key": {testKey}} // must not reach the lease
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		t.Fatalf("upgrade through ingress: %v", err)
	}
	defer ws.Close()
	for _, msg := range []string{"hello", "second message"} {
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil {
			t.Fatal(err)
		}
		if got != "echo: "+msg {
			t.Errorf("got %q, want the echo of %q (saw-key means the API key reached the lease)", got, msg)
		}
	}
}

func TestPreviewHostParsing(t *testing.T) {
	for _, c := range []struct {
		host string
		port int
		id   string
		ok   bool
	}{
		{"8000-sb-0123.localhost:7575", 8000, "sb-0123", true},
		{"8000-SB-0123.LOCALHOST", 8000, "sb-0123", true},
		{"65535-sb-1.localhost", 65535, "sb-1", true},
		{"8000-sb-1.localhost.:7575", 8000, "sb-1", true},
		{"8000-sb-1.localhost..", 0, "", false},
		{"0-sb-1.localhost", 0, "", false},
		{"65536-sb-1.localhost", 0, "", false},
		{"080-sb-1.localhost", 0, "", false},
		{"8000-sb-1.example.com", 0, "", false},
		{"127.0.0.1:7575", 0, "", false},
		{"localhost:7575", 0, "", false},
		{"8000-.localhost", 0, "", false},
		{"a.8000-sb-1.localhost", 0, "", false},
	} {
		port, id, ok := parsePreviewHost(c.host, "localhost")
		if port != c.port || id != c.id || ok != c.ok {
			t.Errorf("%q: %d %q %v", c.host, port, id, ok)
		}
	}
}

func TestPreviewIsLoopbackOnly(t *testing.T) {
	needRoot(t)
	var public net.IP
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			public = ipn.IP
			break
		}
	}
	if public == nil {
		testenv.Missing(t, "this machine has no address but loopback")
	}
	ts := startServer(t, Options{})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	ln, err := net.Listen("tcp", net.JoinHostPort(public.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.Serve(ln)
	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/", nil)
	req.Host = previewHost(sb.ID, 8000, ln.Addr().String())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("preview off loopback: %d, want 403", resp.StatusCode)
	}
}
