package localsandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

// The official SDK's dev-server scenario, with a real browser as the
// client: a server started in the background inside a lease, opened
// through its preview URL in headless Chromium (Debian's package, which
// .ci/run installs), and a page of the lease whose script talks WebSocket
// back to the lease through the preview host.

// needChromium returns the path of Chromium; it skips the test without it,
// and fails it under CI.
func needChromium(t *testing.T) string {
	t.Helper()
	return testenv.RequireCommand(t, "chromium") // .ci/run installs it
}

// browser is headless Chromium driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe: JSON messages separated by NUL bytes, commands
// on its descriptor 3, answers and events on 4). One page, one session.
type browser struct {
	t       *testing.T
	ctx     context.Context
	in      io.WriteCloser
	out     *bufio.Reader
	nextID  int
	session string
	events  []cdpMessage // received, not yet waited for
}

type cdpMessage struct {
	ID        int             `json:"id"`
	Method    string          `json:"method"`
	SessionID string          `json:"sessionId"`
	Params    json.RawMessage `json:"params"`
	Result    json.RawMessage `json:"result"`
	Error     *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// browserTimeout bounds a whole browser session: a failure, not a measure.
const browserTimeout = 2 * time.Minute

// startBrowser starts Chromium with a fresh profile, on about:blank, and
// attaches to its page. Chromium is killed (with its helpers, which share
// its process group) when the test ends.
func startBrowser(t *testing.T, path string) *browser {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	profile := t.TempDir()
	cmdIn, in, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	out, cmdOut, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// The flags that work on this machine: headless, no sandbox (root),
	// no GPU, and no connection the page did not ask for.
	cmd := exec.CommandContext(ctx, path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-quic", "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-extensions", "--no-proxy-server",
		"--password-store=basic", "--user-data-dir="+profile, "--remote-debugging-pipe", "about:blank")
	cmd.ExtraFiles = []*os.File{cmdIn, cmdOut}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 64 << 10}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	cmdIn.Close()
	cmdOut.Close()
	t.Cleanup(func() {
		in.Close() // Chromium exits when its command pipe closes
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		cancel()
		out.Close()
		if t.Failed() {
			t.Logf("chromium's stderr:\n%s", stderr.String())
		}
	})
	b := &browser{t: t, ctx: ctx, in: in, out: bufio.NewReader(out)}
	var targets struct {
		TargetInfos []struct {
			TargetID string `json:"targetId"`
			Type     string `json:"type"`
		} `json:"targetInfos"`
	}
	b.call("Target.getTargets", nil, &targets)
	page := ""
	for _, ti := range targets.TargetInfos {
		if ti.Type == "page" {
			page = ti.TargetID
		}
	}
	if page == "" {
		t.Fatalf("chromium has no page: %+v", targets)
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	b.call("Target.attachToTarget", map[string]any{"targetId": page, "flatten": true}, &attached)
	b.session = attached.SessionID
	b.call("Page.enable", nil, nil)
	return b
}

// call sends a command (to the page's session once attached) and decodes
// its result into result.
func (b *browser) call(method string, params any, result any) {
	b.t.Helper()
	b.nextID++
	msg := map[string]any{"id": b.nextID, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if b.session != "" {
		msg["sessionId"] = b.session
	}
	raw, _ := json.Marshal(msg)
	if _, err := b.in.Write(append(raw, 0)); err != nil {
		b.t.Fatalf("%s: writing to chromium: %v", method, err)
	}
	for {
		m := b.read(method)
		if m.ID != b.nextID {
			if m.Method != "" {
				b.events = append(b.events, m)
			}
			continue
		}
		if m.Error != nil {
			b.t.Fatalf("%s: %s", method, m.Error.Message)
		}
		if result != nil {
			if err := json.Unmarshal(m.Result, result); err != nil {
				b.t.Fatalf("%s: %v in %s", method, err, m.Result)
			}
		}
		return
	}
}

// waitEvent returns the next event method of the page's session.
func (b *browser) waitEvent(method string) cdpMessage {
	b.t.Helper()
	for {
		for i, m := range b.events {
			if m.Method == method && m.SessionID == b.session {
				b.events = append(b.events[:i], b.events[i+1:]...)
				return m
			}
		}
		b.events = append(b.events, b.read(method))
	}
}

func (b *browser) read(waitingFor string) cdpMessage {
	b.t.Helper()
	raw, err := b.out.ReadBytes(0)
	if err != nil {
		if b.ctx.Err() != nil {
			b.t.Fatalf("waiting for %s: chromium ran past %s", waitingFor, browserTimeout)
		}
		b.t.Fatalf("waiting for %s: reading from chromium: %v", waitingFor, err)
	}
	var m cdpMessage
	if err := json.Unmarshal(raw[:len(raw)-1], &m); err != nil {
		b.t.Fatalf("a message from chromium: %v: %q", err, raw)
	}
	return m
}

// open navigates the page to url and waits for its load event.
func (b *browser) open(url string) {
	b.t.Helper()
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	b.call("Page.navigate", map[string]any{"url": url}, &nav)
	if nav.ErrorText != "" {
		b.t.Fatalf("opening %s: %s", url, nav.ErrorText)
	}
	b.waitEvent("Page.loadEventFired")
}

// eval evaluates a JavaScript expression in the page, waits for it if it
// is a promise, and returns its value as a string.
func (b *browser) eval(expression string) string {
	b.t.Helper()
	var res struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	b.call("Runtime.evaluate", map[string]any{"expression": expression, "awaitPromise": true, "returnByValue": true}, &res)
	if e := res.ExceptionDetails; e != nil {
		b.t.Fatalf("%s: %s %s", expression, e.Text, e.Exception.Description)
	}
	return fmt.Sprint(res.Result.Value)
}

// previewURL fills the view's ingress_url_template with port.
func previewURL(template string, port int) string {
	return strings.Replace(template, "<port>", fmt.Sprint(port), 1)
}

// wsPage is a page whose script opens a WebSocket to port 9000 of its own
// lease, through the preview host it came from, sends a message and
// writes the answer into the DOM; window.echoed settles with it.
const wsPage = `<!doctype html>
<title>websocket through ingress</title>
<p id="out">waiting</p>
<script>
window.echoed = new Promise((resolve, reject) => {
  const out = document.getElementById("out");
  // Port 9000 of the same lease: its preview host name, or its preview
  // address.
  const host = /^\d+-/.test(location.host) ? location.host.replace(/^\d+-/, "9000-") : location.hostname + ":9000";
  const ws = new WebSocket("ws://" + host + "/echo");
  ws.onopen = () => ws.send("hello from chromium");
  ws.onmessage = (e) => { out.textContent = e.data; ws.close(); resolve(); };
  ws.onerror = () => { out.textContent = "websocket error"; reject(new Error("websocket error")); };
});
</script>
`

func TestPreviewInHeadlessChromium(t *testing.T) {
	needRoot(t)
	chromium := needChromium(t)
	// The preview address (the default), and the host name.
	for _, domain := range []string{"", "localhost"} {
		t.Run("domain="+domain, func(t *testing.T) { previewInChromium(t, chromium, domain) })
	}
}

func previewInChromium(t *testing.T, chromium, domain string) {
	ts := startServer(t, Options{IngressDomain: domain})
	sb := ts.createWith(map[string]any{"ingress_enabled": true})
	if sb.IngressURLTemplate == "" {
		t.Fatalf("no ingress_url_template in %+v", sb)
	}
	for path, content := range map[string]string{
		"/workspace/site/index.html": "<!doctype html><title>dev server</title><h1>hello from a dev server in the lease</h1>\n",
		"/workspace/site/ws.html":    wsPage,
		"/workspace/ws.py":           wsEchoServer,
	} {
		if status := ts.putFile(sb.ID, path, content); status != http.StatusOK {
			t.Fatalf("upload %s: %d", path, status)
		}
	}
	// As the SDK's example does it: one exec starts the server in the
	// background and returns; the server lives on in the lease.
	if r := ts.exec(sb.ID, `cd /workspace/site && nohup python3 -m http.server 8000 >/dev/null 2>&1 &
		nohup python3 /workspace/ws.py >/dev/null 2>&1 &`); r.ExitCode != 0 {
		t.Fatalf("starting the servers: %+v", r)
	}
	ts.waitListening(sb.ID, 8000)
	ts.waitListening(sb.ID, 9000)
	if domain == "" { // published within publishEvery
		waitPublished(t, previewURL(sb.IngressURLTemplate, 8000))
		waitPublished(t, previewURL(sb.IngressURLTemplate, 9000))
	}

	b := startBrowser(t, chromium)
	b.open(previewURL(sb.IngressURLTemplate, 8000) + "/")
	if got := b.eval(`document.body.innerText`); got != "hello from a dev server in the lease" {
		t.Errorf("the page's text: %q", got)
	}
	b.open(previewURL(sb.IngressURLTemplate, 8000) + "/ws.html")
	if got := b.eval(`window.echoed.then(() => document.getElementById("out").textContent)`); got != "echo: hello from chromium" {
		t.Errorf("the DOM after the WebSocket echo: %q", got)
	}
}
