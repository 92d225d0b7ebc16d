package leaseinit_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// The hook runs before the package inits of what it does not import: run
// as a supervisor (which, without its configuration on fd 3, ends at once)
// under GODEBUG=inittrace=1, the test binary initializes none of the
// packages that run late in a large program and that the init code must
// therefore not import. This test binary links them all (testing imports
// path/filepath and os/exec; the test imports os/exec). The package's
// tests are external (package leaseinit_test): an internal test file would
// make the package itself import testing.
func TestHookRunsBeforeLatePackageInits(t *testing.T) {
	cmd := &exec.Cmd{Path: os.Args[0], Args: []string{leaseinit.Arg0, t.TempDir()}, Env: []string{"GODEBUG=inittrace=1"}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("a supervisor without its configuration exited 0")
	}
	var before []string
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] == "init" {
			before = append(before, f[1])
		}
	}
	if len(before) == 0 {
		t.Fatalf("no init trace: %q", stderr.String())
	}
	for _, late := range []string{"path/filepath", "os/exec", "net", "testing"} {
		for _, pkg := range before {
			if pkg == late {
				t.Errorf("%s was initialized before the hook ran; the hook's package must not import it: %v", late, before)
			}
		}
	}
}
