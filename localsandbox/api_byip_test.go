package localsandbox

import (
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

type byIPView struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	IP     string `json:"ip"`
}

// Each sandbox's ip is its own address, and by-ip finds the sandbox by it
// with the view GET by id gives. A destroyed sandbox's address finds
// nothing (404), and neither does one no sandbox has; a malformed one is
// 400. Before, every sandbox's ip was 10.0.2.100 (or 127.0.0.1) and by-ip
// was declined.
func TestByIPFindsTheSandboxOfItsAddress(t *testing.T) {
	ts := startServer(t, Options{})
	if ts.srv.Isolation() != IsolationNamespaces {
		testenv.Missing(t, "namespace isolation (process-group is TestByIPOfTheSharedAddressIsAConflict's)")
	}
	a, b := ts.createLease(), ts.createLease()
	var va, vb byIPView
	ts.mustCall("GET", "/sandboxes/"+a, nil, &va)
	ts.mustCall("GET", "/sandboxes/"+b, nil, &vb)
	if ip, err := netip.ParseAddr(va.IP); err != nil || !previewNet.Contains(ip) || va.IP == vb.IP {
		t.Fatalf("ips %q and %q: want two addresses of %s", va.IP, vb.IP, previewNet)
	}
	for _, v := range []byIPView{va, vb} {
		var got byIPView
		if status := ts.call("GET", "/sandboxes/by-ip/"+v.IP, nil, &got); status != http.StatusOK || got != v {
			t.Errorf("by-ip %s: %d %+v, want %+v", v.IP, status, got, v)
		}
	}
	ts.mustCall("DELETE", "/sandboxes/"+a, nil, nil)
	for ip, want := range map[string]int{
		va.IP:            http.StatusNotFound,
		"127.100.255.77": http.StatusNotFound,
		"10.0.2.100":     http.StatusNotFound,
		"not-an-ip":      http.StatusBadRequest,
		"fe80::1%25eth0": http.StatusBadRequest,
	} {
		if status, body := ts.rawCall("GET", "/sandboxes/by-ip/"+ip, nil); status != want {
			t.Errorf("by-ip %s: %d %s, want %d", ip, status, body, want)
		}
	}
}

// Under process-group isolation every sandbox's ip is the host's
// 127.0.0.1: by-ip of it names none of them (409), never one picked
// arbitrarily.
func TestByIPOfTheSharedAddressIsAConflict(t *testing.T) {
	dir, err := os.MkdirTemp("", "sandboxd-byip-") // searchable by the commands' uid, as t.TempDir is not
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ts := startServer(t, Options{Isolation: IsolationProcessGroup, Root: filepath.Join(dir, "root")})
	if status, _ := ts.rawCall("GET", "/sandboxes/by-ip/127.0.0.1", nil); status != http.StatusNotFound {
		t.Errorf("by-ip 127.0.0.1 with no sandbox: %d, want 404", status)
	}
	lease := ts.createLease()
	var v byIPView
	ts.mustCall("GET", "/sandboxes/"+lease, nil, &v)
	if v.IP != "127.0.0.1" {
		t.Errorf("a process-group sandbox's ip: %q", v.IP)
	}
	if status, body := ts.rawCall("GET", "/sandboxes/by-ip/127.0.0.1", nil); status != http.StatusConflict {
		t.Errorf("by-ip 127.0.0.1: %d %s, want 409", status, body)
	}
}
