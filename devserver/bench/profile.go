package bench

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// Profiler writes profiles of this process — the stack and its in-process
// worker — for each phase of the benchmarks into Dir:
//
//	cpu-PHASE.pprof                 CPU profile of the phase
//	allocs-PHASE-before.pprof       allocation profile when it began
//	allocs-PHASE.pprof              allocation profile when it ended
//
// Read the phase's allocations with
// `go tool pprof -sample_index=alloc_space -diff_base allocs-PHASE-before.pprof allocs-PHASE.pprof`.
// A nil *Profiler writes nothing.
type Profiler struct{ Dir string }

// Phase starts profiling a phase; stop ends it.
func (p *Profiler) Phase(name string) (stop func() error, err error) {
	if p == nil {
		return func() error { return nil }, nil
	}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := p.writeAllocs("allocs-" + name + "-before.pprof"); err != nil {
		return nil, err
	}
	cpu, err := os.Create(filepath.Join(p.Dir, "cpu-"+name+".pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		cpu.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return errors.Join(cpu.Close(), p.writeAllocs("allocs-"+name+".pprof"))
	}, nil
}

func (p *Profiler) writeAllocs(file string) error {
	f, err := os.Create(filepath.Join(p.Dir, file))
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
}
