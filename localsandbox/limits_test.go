package localsandbox

import (
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
)

// limitsData is the limits part of a sandbox's view.
type limitsData struct {
	MemoryEnforced    bool   `json:"memory_enforced"`
	ProcessesEnforced bool   `json:"processes_enforced"`
	CPUEnforced       bool   `json:"cpu_enforced"`
	PauseFreezes      bool   `json:"pause_freezes"`
	Cgroup            string `json:"cgroup"`
	Usage             *struct {
		OOMKills     uint64 `json:"oom_kills"`
		Tasks        uint64 `json:"tasks"`
		CPUThrottled uint64 `json:"cpu_throttled_periods"`
	} `json:"usage"`
}

func (ts *testServer) createShaped(shape string) string {
	ts.t.Helper()
	var sb sandboxData
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": shape}, &sb)
	return sb.ID
}

func (ts *testServer) limits(lease string) limitsData {
	ts.t.Helper()
	var v struct {
		Limits limitsData `json:"limits"`
	}
	ts.mustCall("GET", "/sandboxes/"+lease, nil, &v)
	return v.Limits
}

// hostHasCgroups reports whether a server here (root, in namespace mode)
// gets the cgroups it needs.
func hostHasCgroups() bool { return machine.NewLimiter("", true).Version() != "" }

// requireEnforced skips a test on a host whose kernel cannot enforce the
// limit (the view says so there: TestViewSaysWhatIsNotEnforced), and fails
// it where the host can but the view does not say the lease has it.
func requireEnforced(t *testing.T, ts *testServer, lease string, what func(limitsData) bool) {
	t.Helper()
	if !hostHasCgroups() {
		testenv.Missing(t, "this host cannot enforce the limit")
	}
	if l := ts.limits(lease); !what(l) {
		t.Fatalf("the host has cgroups, but the view says the limit is not enforced: %+v", l)
	}
}

// Before leases had cgroups, a 256 MiB shape could allocate 4 GiB.
func TestMemoryLimitKillsInsideTheLease(t *testing.T) {
	ts := startServer(t, Options{})
	lease, other := ts.createShaped("s-1vcpu-256mb"), ts.createLease()
	requireEnforced(t, ts, lease, func(l limitsData) bool { return l.MemoryEnforced })
	// dd touches its whole 600 MiB buffer.
	r := ts.exec(lease, `exec dd if=/dev/zero of=/dev/null bs=600M count=1`)
	if r.ExitCode != 137 || r.Signal != "SIGKILL" {
		t.Errorf("600 MiB in a 256 MiB sandbox: %+v, want killed by SIGKILL", r)
	}
	if l := ts.limits(lease); l.Usage == nil || l.Usage.OOMKills == 0 {
		t.Errorf("the view counts no OOM kill: %+v", l.Usage)
	}
	// The lease, another lease and the server go on.
	if r := ts.exec(lease, `dd if=/dev/zero of=/dev/null bs=100M count=1 2>/dev/null && echo ok`); r.Stdout != "ok\n" {
		t.Errorf("100 MiB in the same sandbox after the kill: %+v", r)
	}
	if r := ts.exec(other, `dd if=/dev/zero of=/dev/null bs=600M count=1 2>/dev/null && echo ok`); r.Stdout != "ok\n" {
		t.Errorf("600 MiB in a 1 GiB sandbox: %+v", r)
	}
}

// Before leases had cgroups, one exec could start 1,512 processes; the
// limit is the lease's, shared by everything in it.
func TestProcessLimitIsPerLease(t *testing.T) {
	ts := startServer(t, Options{MaxProcesses: 64})
	lease, other := ts.createLease(), ts.createLease()
	requireEnforced(t, ts, lease, func(l limitsData) bool { return l.ProcessesEnforced })
	// (dash, unlike bash, does not retry a failed fork.)
	r := ts.exec(lease, `sh -c 'i=0; while [ $i -lt 40 ]; do sleep 1000 & i=$((i+1)); done; echo forty'`)
	if r.Stdout != "forty\n" {
		t.Fatalf("40 processes in a lease of 64: %+v", r)
	}
	// The forty live on in the lease: a second exec has what is left.
	r = ts.exec(lease, `sh -c 'i=0; while [ $i -lt 40 ]; do sleep 1000 & i=$((i+1)); done; echo forty more'`)
	if r.Stdout != "" || !strings.Contains(r.Stderr, "fork") {
		t.Errorf("80 processes in a lease of 64: %+v, want a failed fork", r)
	}
	if l := ts.limits(lease); l.Usage == nil || l.Usage.Tasks > 64 {
		t.Errorf("the lease holds %+v tasks, limit 64", l.Usage)
	}
	if r := ts.exec(other, `sh -c 'i=0; while [ $i -lt 40 ]; do sleep 1 & i=$((i+1)); done; wait; echo forty'`); r.Stdout != "forty\n" {
		t.Errorf("another lease cannot fork: %+v", r)
	}
}

// Before leases had cgroups, a 1-vCPU shape used 1.6 CPUs. A busy loop in
// a quarter of a CPU is throttled; in two CPUs it is not.
func TestCPUQuotaThrottles(t *testing.T) {
	ts := startServer(t, Options{})
	small, large := ts.createShaped("s-0.25vcpu-512mb"), ts.createShaped("s-2vcpu-2gb")
	requireEnforced(t, ts, small, func(l limitsData) bool { return l.CPUEnforced })
	for _, lease := range []string{small, large} {
		ts.exec(lease, `timeout 1 sh -c 'while :; do :; done'`)
	}
	if l := ts.limits(small); l.Usage == nil || l.Usage.CPUThrottled == 0 {
		t.Errorf("a busy loop in 0.25 vCPU was not throttled: %+v", l.Usage)
	}
	if l := ts.limits(large); l.Usage == nil || l.Usage.CPUThrottled != 0 {
		t.Errorf("one busy loop in 2 vCPUs was throttled: %+v", l.Usage)
	}
}

// A host without cgroups: the view says nothing is enforced, the log says
// so at start, and RequireLimits refuses to start.
func TestViewSaysWhatIsNotEnforced(t *testing.T) {
	t.Setenv(machine.NoCgroupsEnv, "1")
	var log strings.Builder
	ts := startServer(t, Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	l := ts.limits(ts.createLease())
	if l.MemoryEnforced || l.ProcessesEnforced || l.CPUEnforced || l.PauseFreezes || l.Cgroup != "" {
		t.Errorf("the view claims limits: %+v", l)
	}
	if !strings.Contains(log.String(), "NOT enforced") || !strings.Contains(log.String(), "not_enforced=memory,processes,cpu,freezer") {
		t.Errorf("the log does not say what is not enforced:\n%s", log.String())
	}
	_, err := New(Options{InsecureNoAuth: true, Root: filepath.Join(t.TempDir(), "r"), RequireLimits: true, Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, errLimitsNotEnforced) || !strings.Contains(err.Error(), "memory, processes, cpu") {
		t.Errorf("RequireLimits on a host without cgroups: %v", err)
	}
}

func TestRequireLimitsStartsWhereEnforced(t *testing.T) {
	if !hostHasCgroups() {
		testenv.Missing(t, "no cgroups here")
	}
	ts := startServer(t, Options{RequireLimits: true})
	if l := ts.limits(ts.createLease()); !l.MemoryEnforced || !l.ProcessesEnforced || !l.CPUEnforced || !l.PauseFreezes {
		t.Errorf("view %+v", l)
	}
}

// Before leases had disks of their own, 3 GiB could be written to a
// workspace. Past disk_mib every write fails with ENOSPC: in the root's
// upper layer, in /workspace, and through the files API.
func TestDiskLimitFailsWritesWithENOSPC(t *testing.T) {
	ts := startServer(t, Options{})
	var sb sandboxData
	ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "disk_mib": 64}, &sb)
	lease, other := sb.ID, ts.createLease()
	var v struct {
		Limits struct {
			DiskBytes    int64 `json:"disk_bytes"`
			DiskEnforced bool  `json:"disk_enforced"`
		} `json:"limits"`
	}
	ts.mustCall("GET", "/sandboxes/"+lease, nil, &v)
	if v.Limits.DiskBytes != 64<<20 {
		t.Errorf("disk_bytes %d", v.Limits.DiskBytes)
	}
	if machine.DiskSupport() != nil {
		testenv.Missing(t, "this host cannot bound disks")
	}
	if !v.Limits.DiskEnforced {
		t.Fatal("the host can bound disks, but the view says the disk is not bounded")
	}
	for _, path := range []string{"/workspace/big", "/opt/big", "/tmp/big"} {
		r := ts.exec(lease, `dd if=/dev/zero of=`+path+` bs=1M count=100 2>&1; s=$?; rm -f `+path+`; exit $s`)
		if r.ExitCode == 0 || !strings.Contains(r.Stdout, "No space left on device") {
			t.Errorf("100 MiB to %s on a 64 MiB disk: %+v, want ENOSPC", path, r)
		}
	}
	if status := ts.putFile(lease, "/workspace/upload", strings.Repeat("x", 63<<20)); status != http.StatusInsufficientStorage {
		t.Errorf("a 63 MiB upload to a 64 MiB disk: %d, want 507", status)
	}
	if r := ts.exec(lease, `echo small > /workspace/small && cat /workspace/small`); r.Stdout != "small\n" {
		t.Errorf("a small write after the full disk: %+v", r)
	}
	if r := ts.exec(other, `dd if=/dev/zero of=/workspace/big bs=1M count=100 2>/dev/null && echo ok`); r.Stdout != "ok\n" {
		t.Errorf("100 MiB in another lease: %+v", r)
	}
	for _, bad := range []int{1, 63, 1 << 21} {
		if status := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "disk_mib": bad}, nil); status != http.StatusBadRequest {
			t.Errorf("disk_mib %d: %d, want 400", bad, status)
		}
	}
}
