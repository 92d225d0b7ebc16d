package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"
)

// DescribeMachine reads the CPU count and model and the Go version. The
// load averages are left for the caller to fill in.
func DescribeMachine() Machine {
	return Machine{
		CPUs:      runtime.NumCPU(),
		CPUModel:  cpuModel(),
		GoVersion: runtime.Version(),
	}
}

// cpuModel is the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return "unknown CPU"
}

// LoadAverage is the 1-minute load average of /proc/loadavg.
func LoadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if fields := strings.Fields(string(data)); len(fields) > 0 {
		return fields[0]
	}
	return "?"
}
