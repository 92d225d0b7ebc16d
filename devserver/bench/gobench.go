package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// microBenchmark pairs a testing.B benchmark of the library with its
// floor, a benchmark of the same bytes without the part measured.
type microBenchmark struct {
	name, floor    string // benchmark names, without the -GOMAXPROCS suffix
	row, floorName string
}

// The journal rows use small chunks only: the journal keeps the buffers the
// pipe reader hands it without copying them, so its cost is per entry, and
// MB/s at 64 KiB chunks (hundreds of GB/s) would only restate that.
var microBenchmarks = []microBenchmark{
	{"BenchmarkDecodeOutput/frame=1KiB", "BenchmarkDecodeOutputFloor/frame=1KiB",
		"frame decoder (createos): 1 KiB frames", "base64 decoding alone"},
	{"BenchmarkDecodeOutput/frame=32KiB", "BenchmarkDecodeOutputFloor/frame=32KiB",
		"frame decoder (createos): 32 KiB frames", "base64 decoding alone"},
	{"BenchmarkDecodeOutput/frame=512KiB", "BenchmarkDecodeOutputFloor/frame=512KiB",
		"frame decoder (createos): 512 KiB frames", "base64 decoding alone"},
	{"BenchmarkJournal/live/chunk=256B", "BenchmarkJournalFloor/live/chunk=256B",
		"journal (localsandbox): append + live reader, 256 B chunks", "Go channel of as many bytes"},
	{"BenchmarkJournal/replay/chunk=256B", "BenchmarkJournalFloor/replay/chunk=256B",
		"journal (localsandbox): append 1 MiB, then replay, 256 B chunks", "Go channel of as many bytes"},
}

// MicroBenchmarks runs the testing.B benchmarks of the frame decoder
// (createos) and of the journal (localsandbox) with `go test -bench` in
// moduleDir, the library module, and in its localsandbox module, and
// returns their MB/s beside their floors. They have no target: they show
// where the bytes go.
func MicroBenchmarks(ctx context.Context, moduleDir, benchtime string) ([]Row, error) {
	// The journal is the sandbox server's, a module of its own
	// (localsandbox/go.mod): one go test a module.
	var out bytes.Buffer
	for _, pkg := range []struct{ dir, path string }{
		{moduleDir, "./createos"},
		{filepath.Join(moduleDir, "localsandbox"), "./internal/journal"},
	} {
		cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$",
			"-bench", "^(BenchmarkDecodeOutput|BenchmarkDecodeOutputFloor|BenchmarkJournal|BenchmarkJournalFloor)$",
			"-benchtime", benchtime, "-count", "1", pkg.path)
		cmd.Dir = pkg.dir
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go test -bench %s: %w\n%s%s", pkg.path, err, out.String(), stderr.String())
		}
	}
	rates, err := parseBenchmarks(out.Bytes())
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, m := range microBenchmarks {
		fig, ok1 := rates[m.name]
		floor, ok2 := rates[m.floor]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("go test -bench did not report %s and %s", m.name, m.floor)
		}
		rows = append(rows, Row{
			Name:   "µ " + m.row,
			Figure: Value{fig, "MB/s"}, FloorName: m.floorName, Floor: Value{floor, "MB/s"},
		})
	}
	return rows, nil
}

// benchLine is a result line of `go test -bench`: the name (with its
// -GOMAXPROCS suffix), the iterations, then value-unit pairs.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// parseBenchmarks returns the MB/s of every benchmark in the output.
func parseBenchmarks(out []byte) (map[string]float64, error) {
	rates := make(map[string]float64)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		fields := strings.Fields(m[2])
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i+1] != "MB/s" {
				continue
			}
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("benchmark %s: MB/s %q: %w", m[1], fields[i], err)
			}
			rates[m[1]] = v
		}
	}
	return rates, sc.Err()
}
