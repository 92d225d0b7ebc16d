package confine

import (
	"os"
	"syscall"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

func init() {
	children["exec-true-plain"] = func() error { return execTrue(false) }
	children["exec-true-confined"] = func() error { return execTrue(true) }
}

func execTrue(confined bool) error {
	if confined {
		if err := Apply(Policy{}); err != nil {
			return err
		}
	}
	return syscall.Exec("/bin/true", []string{"true"}, os.Environ())
}

// BenchmarkStart is what confinement adds to starting a command: a child
// of this binary that execs /bin/true, plain and after Apply. The
// difference between the two is the cost of Apply (building and installing
// the filter, dropping capabilities) plus the filter's cost on every
// syscall of the exec and of true itself.
func BenchmarkStart(b *testing.B) {
	testenv.RequireRoot(b, "Apply needs CAP_SETPCAP")
	for _, mode := range []string{"plain", "confined"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				if err := child(b, "exec-true-"+mode).Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBuildFilters is the part of Apply that is pure computation:
// resolving Docker's profile and assembling the programs.
func BenchmarkBuildFilters(b *testing.B) {
	for b.Loop() {
		if _, err := programs(Policy{}); err != nil {
			b.Fatal(err)
		}
	}
}
