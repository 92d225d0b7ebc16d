package confine_test

import (
	"os"
	"syscall"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/confine"
)

// An init's last steps before the command: mounts done, descriptors the
// command must keep moved below 3, then on one goroutine confine and exec.
// (Not run: Apply is irreversible.)
func ExampleApply() {
	if err := confine.CloseFrom(3); err != nil {
		os.Exit(127)
	}
	if err := confine.Apply(confine.Policy{}); err != nil {
		os.Exit(127) // partly confined: never run the command now
	}
	err := syscall.Exec("/bin/sh", []string{"sh", "-c", "id"}, os.Environ())
	_ = err // only returns on failure
	os.Exit(127)
}
