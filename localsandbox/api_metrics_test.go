package localsandbox

import (
	"os"
	"testing"
)

// GET /sandboxes/{id}/metrics gives the numbers the server has: the
// shape's limits always, and what the kernel counted where the lease has a
// cgroup (a root server).
func TestSandboxMetricsAreTheKernelsCounts(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	ts.exec(lease, `head -c 8000000 /dev/zero > /workspace/eight-mb; sync`)
	var m metricsView
	ts.mustCall("GET", "/sandboxes/"+lease+"/metrics", nil, &m)
	if m.ID != lease || m.Status != "running" || m.MemoryLimitBytes != 1<<30 || m.VCPUs != 1 || m.DiskBytes == 0 {
		t.Errorf("metrics: %+v", m)
	}
	if os.Geteuid() == 0 {
		if !m.Measured || m.MemoryBytes == 0 || m.Tasks == 0 || m.DiskUsedBytes < 8000000 {
			t.Errorf("a root server's counts: %+v", m)
		}
	}
	if status, _ := ts.rawCall("GET", "/sandboxes/sb-unknown/metrics", nil); status != 404 {
		t.Errorf("metrics of an unknown sandbox: %d", status)
	}
}
