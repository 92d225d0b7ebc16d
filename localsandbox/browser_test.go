package localsandbox

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without a key (--insecure-no-auth) the server trusts whatever reaches
// its loopback address, and a browser on the same machine reaches it: a
// page of any site may send a "simple" cross-site POST (text/plain, no
// preflight), and a site whose name is made to resolve to 127.0.0.1 (DNS
// rebinding) may even read the answers. Either way a page the user merely
// visits would create sandboxes and run commands in them. The keyless
// server therefore answers only requests that no browser page can make:
// no Origin header, and a Host that names loopback.
func TestKeylessServerRefusesBrowserPages(t *testing.T) {
	ts := startServer(t, Options{InsecureNoAuth: true})
	send := func(host, origin string) int {
		t.Helper()
		req, err := http.NewRequest("POST", ts.base+"/sandboxes", strings.NewReader(`{"shape":"s-1vcpu-1gb"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain") // what a form or no-cors fetch may send
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	port := ts.base[strings.LastIndex(ts.base[:len(ts.base)-len("/v1")], ":") : len(ts.base)-len("/v1")]
	for _, c := range []struct{ name, host, origin string }{
		{"a cross-site page", "", "https://evil.example"},
		{"a page on the server's own origin", "", "http://127.0.0.1" + port},
		{"a rebound name", "evil.example" + port, ""},
		{"a rebound name without a port", "evil.example", ""},
		{"a name under localhost that is no preview host", "api.localhost" + port, ""},
	} {
		if got := send(c.host, c.origin); got != http.StatusForbidden {
			t.Errorf("%s: HTTP %d, want 403", c.name, got)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(ts.root, leasesDir)); len(entries) != 0 {
		t.Errorf("%d sandboxes created by browser pages", len(entries))
	}
	for _, host := range []string{"", "localhost" + port, "LOCALHOST" + port, "[::1]" + port, "127.0.0.2" + port} {
		if got := send(host, ""); got != http.StatusOK {
			t.Errorf("a program's request to Host %q: HTTP %d, want 200", host, got)
		}
	}
}
