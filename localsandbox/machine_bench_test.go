package localsandbox

import (
	"net/http"
	"testing"
)

// BenchmarkExecTrue measures POST /exec of `true` in a lease that exists:
// the cost of one command on a sandbox. Since leases have an init of their
// own, an exec is a fork of that init, not a new init (a re-exec of the
// server's binary) in new namespaces with a root file system built anew.
//
//	go test -run '^$' -bench ExecTrue -benchtime 200x ./localsandbox
func BenchmarkExecTrue(b *testing.B) {
	ts := startServer(b, Options{})
	lease := ts.createLease()
	body := map[string]any{"cmd": "true"}
	b.ResetTimer()
	for b.Loop() {
		if status := ts.call("POST", "/sandboxes/"+lease+"/exec", body, nil); status != http.StatusOK {
			b.Fatalf("exec: %d", status)
		}
	}
}

// BenchmarkProcessTrue is the same for a managed process (started, then
// waited for): it runs under a supervisor of its own, so that its tree can
// be waited for and killed as a whole.
func BenchmarkProcessTrue(b *testing.B) {
	ts := startServer(b, Options{})
	lease := ts.createLease()
	body := map[string]any{"cmd": "true"}
	b.ResetTimer()
	for b.Loop() {
		var p struct {
			ProcessID string `json:"process_id"`
		}
		ts.mustCall("POST", "/sandboxes/"+lease+"/processes", body, &p)
		if _, status := ts.waitTree(lease, p.ProcessID, maxWait); status != http.StatusOK {
			b.Fatalf("wait: %d", status)
		}
	}
}
