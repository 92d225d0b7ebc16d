package localsandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
)

// waitPublished waits until the host and port of u take connections: the
// lease's port is published within publishEvery of its server listening.
func waitPublished(t *testing.T, u string) {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.Dial("tcp", pu.Host)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not published: %v", pu.Host, err)
		}
		time.Sleep(20 * time.Millisecond) // polling, as the publisher does
	}
}

// openPreview GETs u with Go's net/http, without a key: the status and
// body, or 0 and the error.
func openPreview(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// previewAddrURL substitutes port in the view's template as the SDKs do
// (TS: template.replace("<port>", String(port))).
func previewAddrURL(t *testing.T, template string, port int) string {
	t.Helper()
	if !regexp.MustCompile(`^http://127\.100\.\d+\.\d+:<port>$`).MatchString(template) {
		t.Fatalf("ingress_url_template %q: want the lease's preview address", template)
	}
	return strings.Replace(template, "<port>", fmt.Sprint(port), 1)
}

// Before (issue 30 item 3): the template was http://<port>-<id>.localhost:…,
// which Node, Go and Python cannot resolve on a machine whose resolver has
// no *.localhost rule (this one: getaddrinfo ENOTFOUND), the lookup going
// to the configured resolver. Now it is an address: nothing is resolved.
func TestPreviewAddressOpensEverywhere(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	u := previewAddrURL(t, sb.IngressURLTemplate, 8000) + "/hello.txt"
	pu, _ := url.Parse(u)
	if _, err := netip.ParseAddr(pu.Hostname()); err != nil {
		t.Fatalf("the preview host %q is not an address: it would be looked up", pu.Hostname())
	}
	if status := ts.putFile(sb.ID, "/workspace/site/hello.txt", "hello through the preview address\n"); status != http.StatusOK {
		t.Fatalf("upload: %d", status)
	}
	ts.startProcess(sb.ID, `cd /workspace/site && exec python3 -m http.server 8000 --bind 0.0.0.0`)
	ts.waitListening(sb.ID, 8000)
	const want = "hello through the preview address\n"
	waitPublished(t, u)
	if status, body := openPreview(t, u); status != http.StatusOK || body != want {
		t.Fatalf("Go net/http: %d %q", status, body)
	}
	clients := map[string][]string{
		"node":    {"node", "-e", `fetch(process.argv[1]).then(r => r.text()).then(t => process.stdout.write(t), e => { console.log(String(e.cause || e)); process.exit(1) })`, u},
		"python3": {"python3", "-c", `import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())`, u},
		"curl":    {"curl", "-sS", "--max-time", "10", u},
	}
	// Under strace when it is installed: no client sends anything to a
	// resolver (port 53) to open it.
	strace, _ := exec.LookPath("strace")
	for name, argv := range clients {
		if _, err := exec.LookPath(argv[0]); err != nil {
			t.Logf("%s is not installed: not tried", name)
			continue
		}
		trace := filepath.Join(t.TempDir(), "trace")
		if strace != "" {
			argv = append([]string{strace, "-f", "-qq", "-o", trace, "-e", "trace=connect,sendto,sendmsg,sendmmsg"}, argv...)
		}
		if out, err := exec.Command(argv[0], argv[1:]...).Output(); err != nil || string(out) != want {
			t.Errorf("%s: %q %v", name, out, err)
		}
		if strace == "" {
			continue
		}
		if b, err := os.ReadFile(trace); err != nil || !strings.Contains(string(b), "connect(") {
			t.Errorf("%s: no trace of its connection (%v)", name, err)
		} else if strings.Contains(string(b), "htons(53)") {
			t.Errorf("%s asked a resolver:\n%s", name, b)
		}
	}

	// The answers of the proxy stand: a port nobody listens on is not
	// published; paused 409; disabled, then destroyed: nothing listens.
	if status, body := openPreview(t, previewAddrURL(t, sb.IngressURLTemplate, 8001)); status != 0 {
		t.Errorf("a port nobody listens on in the lease: %d %q, want no listener", status, body)
	}
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/pause", nil, nil)
	waitStatus(t, ts, sb.ID, "paused")
	if status, _ := openPreview(t, u); status != http.StatusConflict {
		t.Errorf("paused: %d, want 409", status)
	}
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/resume", nil, nil)
	waitStatus(t, ts, sb.ID, "running")
	var v networkData
	ts.mustCall("PATCH", "/sandboxes/"+sb.ID, map[string]any{"ingress_enabled": false}, &v)
	if status, body := openPreview(t, u); status != 0 {
		t.Errorf("ingress disabled: %d %q, want no listener", status, body)
	}
	ts.mustCall("PATCH", "/sandboxes/"+sb.ID, map[string]any{"ingress_enabled": true}, &v)
	if v.IngressURLTemplate != sb.IngressURLTemplate {
		t.Errorf("the address changed on enable again: %q, was %q", v.IngressURLTemplate, sb.IngressURLTemplate)
	}
	waitPublished(t, u)
	if status, _ := openPreview(t, u); status != http.StatusOK {
		t.Errorf("enabled again: %d", status)
	}
	ts.mustCall("DELETE", "/sandboxes/"+sb.ID, nil, nil)
	if status, body := openPreview(t, u); status != 0 {
		t.Errorf("destroyed: %d %q, want no listener", status, body)
	}
	assertNothingLeft(t, ts)
}

// Each lease's preview is its own origin: two leases serving the same
// port have different addresses, and each reaches its own server only;
// the key a client sends never reaches the lease.
func TestPreviewAddressIsTheLeasesOwn(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{})
	var urls []string
	for _, name := range []string{"A", "B"} {
		sb := ts.createWith(map[string]any{"ingress_enabled": true})
		ts.putFile(sb.ID, "/workspace/srv.py", `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("`+name+` key=" + str(self.headers.get("X-Api-Key"))).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
`)
		ts.startProcess(sb.ID, "exec python3 /workspace/srv.py")
		ts.waitListening(sb.ID, 8000)
		urls = append(urls, previewAddrURL(t, sb.IngressURLTemplate, 8000))
	}
	if urls[0] == urls[1] {
		t.Fatalf("two leases share the preview origin %s", urls[0])
	}
	for i, want := range []string{"A key=None", "B key=None"} {
		waitPublished(t, urls[i])
		req, _ := http.NewRequest("GET", urls[i], nil)
		req.Header.Set("X-Api-Key", testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != want {
			t.Errorf("%s: %q, want %q", urls[i], b, want)
		}
	}
}

// A lease listening on many ports gets MaxPublishedPorts of them
// published, the lowest: each is a listener of the server.
func TestPreviewAddressPublishesAtMostTheCap(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	const first, n = 20000, network.MaxPublishedPorts + 36
	ts.putFile(sb.ID, "/workspace/many.py", fmt.Sprintf(`
import socket, time
socks = []
for p in range(%d, %d):
    s = socket.socket(); s.bind(("0.0.0.0", p)); s.listen(); socks.append(s)
time.sleep(3600)
`, first, first+n))
	ts.startProcess(sb.ID, "exec python3 /workspace/many.py")
	ts.waitListening(sb.ID, first+n-1)
	last := previewAddrURL(t, sb.IngressURLTemplate, first+network.MaxPublishedPorts-1)
	waitPublished(t, last)
	pu, _ := url.Parse(last)
	for p := first; p < first+n; p++ {
		c, err := net.Dial("tcp", net.JoinHostPort(pu.Hostname(), fmt.Sprint(p)))
		if published := err == nil; published != (p < first+network.MaxPublishedPorts) {
			t.Errorf("port %d published: %v", p, published)
		}
		if c != nil {
			c.Close()
		}
	}
	ts.mustCall("DELETE", "/sandboxes/"+sb.ID, nil, nil)
}

// The vendor's Python example ingress_preview starts a server, waits for
// its port with wait_for_port (an exec inside the lease) and GETs the
// preview URL at once; the other SDKs' waitForPort is an exec too. Before,
// the port was published only at the publisher's next look (up to
// publishEvery later), so the GET was refused (ConnectionRefusedError in
// the example). Now an exec's answer, buffered or streamed, comes after the
// ports listening when its command ended are published. Four ports, each
// waited for and opened at once, without waitPublished.
func TestPreviewAddressIsPublishedWhenAnExecAnswers(t *testing.T) {
	needRoot(t)
	ts := startServer(t, Options{})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	if status := ts.putFile(sb.ID, "/workspace/site/index.html", "ready\n"); status != http.StatusOK {
		t.Fatalf("upload: %d", status)
	}
	for i, port := range []int{8000, 8001, 8002, 8003} {
		ts.startProcess(sb.ID, fmt.Sprintf(`cd /workspace/site && exec python3 -m http.server %d --bind 0.0.0.0`, port))
		wait := fmt.Sprintf(`for i in $(seq 1000); do (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null && exit 0; sleep 0.01; done; exit 1`, port)
		streamed := i%2 == 1
		if streamed {
			body, _ := json.Marshal(map[string]any{"cmd": "/bin/bash", "args": []string{"-c", wait}, "stream": true})
			resp := ts.request("POST", "/sandboxes/"+sb.ID+"/exec?stream=true", bytes.NewReader(body), nil)
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasSuffix(string(raw), `{"exit_code":0}`+"\n") {
				t.Fatalf("streamed wait for %d: %q", port, raw)
			}
		} else if r := ts.exec(sb.ID, wait); r.ExitCode != 0 {
			t.Fatalf("wait for %d: %+v", port, r)
		}
		u := previewAddrURL(t, sb.IngressURLTemplate, port) + "/index.html"
		if status, body := openPreview(t, u); status != http.StatusOK || body != "ready\n" {
			t.Errorf("port %d (streamed exec %v), opened as the exec answered: %d %q", port, streamed, status, body)
		}
	}
}
