package localsandbox

import "net/http"

// metricsView is GET /v1/sandboxes/{id}/metrics: a snapshot of what the
// kernel counts for the sandbox. docs/CREATEOS-API.md §3.8 names the route
// ("CPU and memory snapshot") but not its fields, which are sandboxd's:
// the numbers it already has — the lease cgroup's memory, tasks and CPU
// throttling, its disk's use, and the bytes through its outward interface
// (slirp4netns). CPU time itself is not counted. Measured says whether the
// kernel counts for the sandbox at all (a cgroup of its own); without one
// the cgroup's numbers are zero.
type metricsView struct {
	ID                  string  `json:"id"`
	Status              string  `json:"status"`
	Measured            bool    `json:"measured"`
	MemoryBytes         uint64  `json:"memory_bytes"`
	MemoryLimitBytes    int64   `json:"memory_limit_bytes"`
	VCPUs               float64 `json:"vcpus"`
	CPUThrottledPeriods uint64  `json:"cpu_throttled_periods"`
	CPUThrottledNanos   uint64  `json:"cpu_throttled_ns"`
	Tasks               uint64  `json:"tasks"`
	OOMKills            uint64  `json:"oom_kills"`
	DiskUsedBytes       uint64  `json:"disk_used_bytes"`
	DiskBytes           int64   `json:"disk_bytes"`
	EgressBytes         int64   `json:"egress_bytes"`
	IngressBytes        int64   `json:"ingress_bytes"`
}

func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) error {
	l, err := s.peekLease(r) // reading numbers is no activity (auto-pause)
	if err != nil {
		return err
	}
	lim, bw := s.limitsView(l), s.bandwidth(l)
	v := metricsView{ID: l.id, Status: l.status(), Measured: lim.Cgroup != "", MemoryLimitBytes: lim.MemoryBytes,
		VCPUs: lim.VCPUs, DiskBytes: lim.DiskBytes, EgressBytes: bw.UsedBytes, IngressBytes: bw.IngressBytes}
	if u := lim.Usage; u != nil {
		v.MemoryBytes, v.CPUThrottledPeriods, v.CPUThrottledNanos = u.MemoryBytes, u.CPUThrottled, u.CPUThrottledNanos
		v.Tasks, v.OOMKills, v.DiskUsedBytes = u.Tasks, u.OOMKills, u.DiskUsedBytes
	}
	return writeData(w, v)
}
