package machine

import (
	"os"
	"testing"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// A spawner that ends without answering fails the create that waits for
// it, and the next one (a new spawner, which ends too): nothing hangs.
// (Answered starts, and a spawner killed with leases running, are tested
// with the server: TestLeaseInitsAreClonedByTheSpawner.)
func TestASpawnerThatEndsFailsTheCreate(t *testing.T) {
	s := NewSpawner("/bin/true") // ends at once, answering nothing
	defer s.Close()
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		init, err := s.start(leaseinit.SpawnRequest{Root: t.TempDir()}, w, nil)
		r.Close()
		w.Close()
		if err == nil {
			t.Fatalf("a start through a spawner that ended: %+v, no error", init)
		}
	}
}
