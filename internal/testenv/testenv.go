// Package testenv is the one way a test says what it needs from the
// machine: root, a program, a file. Without it the test is skipped on a
// developer's machine, and fails under CI (CI=true), where everything a
// test needs is provided (.ci/run runs as root and installs what is
// missing): a guarantee that cannot be checked there must never pass
// unseen.
//
// It lives in the library module and is imported by the tests of the
// nested modules too (localsandbox, devserver): Go's internal rule is by
// import path, and theirs are below this module's.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run under CI: CI=true, as .ci/run and the
// usual CI services set it.
func CI() bool { return os.Getenv("CI") == "true" }

// Missing ends a test that cannot run here, saying why: it is skipped, or
// under CI it fails.
func Missing(t testing.TB, why string) {
	t.Helper()
	if CI() {
		t.Fatal(why + " (CI=true: a test that cannot run fails)")
	}
	t.Skip(why)
}

// RequireRoot ends the test (Missing) unless the process runs as root;
// why says what needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, why)
	}
}

// RequireCommand returns the path of the program name on PATH, or ends
// the test (Missing) naming the Debian package to install.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name+" is not installed (apt-get install "+debianPackage(name)+")")
	}
	return path
}

// RequireFile ends the test (Missing) unless path exists: a program that
// the leases' lower layer (the host's /usr) must hold, such as
// /usr/bin/python3.
func RequireFile(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, "no "+path+" on this host")
	}
}

// debianPackage names the package that installs a program the tests use.
func debianPackage(program string) string {
	switch program {
	case "bwrap":
		return "bubblewrap"
	case "mkfs.ext4":
		return "e2fsprogs"
	}
	return program
}
