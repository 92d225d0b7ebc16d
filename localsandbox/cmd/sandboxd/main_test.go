package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/localsandbox"
)

func TestAKeyIsRequiredUnlessLoopbackWithoutAuth(t *testing.T) {
	t.Setenv("SANDBOXD_API_KEY", "")
	root := filepath.Join(t.TempDir(), "root")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--root", root}, "an API key is required"},
		{[]string{"--root", root, "--insecure-no-auth", "--listen", "0.0.0.0:0"}, "only allowed on a loopback address"},
		{[]string{"--root", root, "--insecure-no-auth", "--api-key", "k"}, "exclude each other"},
		{[]string{"--root", root, "--api-key", "k", "--uid", "0"}, "never map to host root"},
		{[]string{"--root", root, "--api-key", "k", "extra"}, "unexpected arguments"},
	} {
		err := run(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

func TestTheKeyComesFromTheEnvironment(t *testing.T) {
	t.Setenv("SANDBOXD_API_KEY", "from-env")
	c, err := parseFlags(nil, io.Discard)
	if err != nil || c.apiKey != "from-env" || c.listen != "127.0.0.1:7575" {
		t.Errorf("%+v, %v", c, err)
	}
}

func TestMachineFlags(t *testing.T) {
	t.Setenv("SANDBOXD_API_KEY", "k")
	dir := t.TempDir()
	c, err := parseFlags([]string{"--require-limits", "--rootfs-dir", dir, "--disk-budget-mib", "100000",
		"--image-cache", dir + "/images", "--host-image", "--default-image", "host"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var o localsandbox.Options
	c.machine.apply(&o)
	if !o.RequireLimits || o.RootfsDir != dir || o.DiskBudgetMiB != 100000 || o.ImageCache != dir+"/images" || !o.HostImage || o.DefaultImage != "host" {
		t.Errorf("options %+v", o)
	}
	// A rootfs directory that does not exist stops the server from starting.
	t.Setenv("SANDBOXD_API_KEY", "k") // parseFlags unset it once read
	err = run([]string{"--root", filepath.Join(dir, "root"), "--listen", "127.0.0.1:0", "--rootfs-dir", filepath.Join(dir, "none")}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "rootfs directory") {
		t.Errorf("a missing --rootfs-dir: %v", err)
	}
}
