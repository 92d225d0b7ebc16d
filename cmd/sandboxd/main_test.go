package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"
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
