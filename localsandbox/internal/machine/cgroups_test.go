package machine

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3"
)

func TestChooseCgroups(t *testing.T) {
	all := []string{"memory", "pids", "cpu", "freezer"}
	for _, tc := range []struct {
		name    string
		host    cgroupHost
		want    cgroupVersion
		missing []string
	}{
		{"unified with everything delegated", cgroupHost{mode: cgroups.Unified, v2Controllers: []string{"cpuset", "cpu", "io", "memory", "pids"}}, cgroupV2, nil},
		{"unified without memory", cgroupHost{mode: cgroups.Unified, v2Controllers: []string{"cpu", "pids"}}, cgroupNone, all},
		{"hybrid, v2 with only hugetlb (this machine)", cgroupHost{mode: cgroups.Hybrid, v2Controllers: []string{"hugetlb"}, v1Controllers: all}, cgroupV1, nil},
		{"hybrid, v2 with everything", cgroupHost{mode: cgroups.Hybrid, v2Controllers: []string{"memory", "pids", "cpu"}, v1Controllers: all}, cgroupV2, nil},
		{"legacy without freezer", cgroupHost{mode: cgroups.Legacy, v1Controllers: []string{"memory", "pids", "cpu"}}, cgroupV1, []string{"freezer"}},
		{"legacy, nothing writable", cgroupHost{mode: cgroups.Legacy}, cgroupNone, all},
		{"unavailable", cgroupHost{mode: cgroups.Unavailable}, cgroupNone, all},
	} {
		v, missing := chooseCgroups(tc.host)
		if v != tc.want || !slices.Equal(missing, tc.missing) {
			t.Errorf("%s: %q missing %v, want %q missing %v", tc.name, v, missing, tc.want, tc.missing)
		}
	}
}

func TestCgroupV2Resources(t *testing.T) {
	r := v2Resources(Limits{MemoryBytes: 256 << 20, MaxTasks: 512, VCPUs: 0.25})
	got := map[string]string{}
	for _, v := range r.Values() {
		// Value keeps its fields to itself; its printed form is {file value}.
		file, value, _ := strings.Cut(strings.Trim(fmt.Sprint(v), "{}"), " ")
		got[file] = value
	}
	for file, want := range map[string]string{
		"memory.max": "268435456", "memory.swap.max": "0", "pids.max": "512", "cpu.max": "25000 100000",
	} {
		if got[file] != want {
			t.Errorf("%s = %q, want %q (all: %v)", file, got[file], want, got)
		}
	}
	if c := r.EnabledControllers(); !slices.Contains(c, "memory") || !slices.Contains(c, "pids") || !slices.Contains(c, "cpu") {
		t.Errorf("controllers %v", c)
	}
}
