package reliability

import (
	"fmt"
	"os"
	"testing"
)

// binDir holds the binaries built for the tests.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "reliability-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
