package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ErrNoEgressPath is why the egress row cannot be measured here.
var ErrNoEgressPath = errors.New("the P7 egress row needs root and slirp4netns, the leases' outward path: " +
	"run as root with Debian's slirp4netns installed (apt-get install -y slirp4netns; `make bench` does it), or leave p7 out with -only")

// CheckEgressPath returns ErrNoEgressPath unless this process is root and
// slirp4netns is on PATH.
func CheckEgressPath() error {
	if _, err := exec.LookPath("slirp4netns"); err != nil || os.Geteuid() != 0 {
		return ErrNoEgressPath
	}
	return nil
}

// Names of the sub-benchmarks of localsandbox's BenchmarkEgressThroughput.
const (
	egressBenchmark = "BenchmarkEgressThroughput/slirp4netns"
	egressFloor     = "BenchmarkEgressThroughput/lease-loopback"
)

// EgressThroughput is P7: bulk TCP out of a lease through its outward
// path (slirp4netns, to a sink on the host) beside the same bytes sent to a
// sink on the lease's own loopback, in the same lease and the same run:
// what the user-mode network costs against the kernel's loopback. It runs
// localsandbox's BenchmarkEgressThroughput with `go test -bench` in the
// localsandbox module below moduleDir, the library module, runs times
// each (64 MiB a run, one exec's overhead included). Informational: the
// issue sets no target.
func EgressThroughput(ctx context.Context, moduleDir string, runs int) ([]Row, error) {
	if err := CheckEgressPath(); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", "^BenchmarkEgressThroughput$",
		"-benchtime", fmt.Sprintf("%dx", runs), "-count", "1", ".")
	cmd.Dir = filepath.Join(moduleDir, "localsandbox") // the sandbox server's own module
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go test -bench BenchmarkEgressThroughput: %w\n%s%s", err, out.String(), stderr.String())
	}
	rates, err := parseBenchmarks(out.Bytes())
	if err != nil {
		return nil, err
	}
	return egressRows(rates)
}

func egressRows(rates map[string]float64) ([]Row, error) {
	fig, ok1 := rates[egressBenchmark]
	floor, ok2 := rates[egressFloor]
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("go test -bench did not report %s and %s (skipped? it needs root and slirp4netns)", egressBenchmark, egressFloor)
	}
	return []Row{{
		Name:      "P7 egress throughput: bulk TCP from a lease through slirp4netns to the host",
		Figure:    Value{fig, "MB/s"},
		FloorName: "the same bytes over the lease's own loopback",
		Floor:     Value{floor, "MB/s"},
	}}, nil
}
