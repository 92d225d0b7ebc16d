package leaseinit_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// sourceOfVersion pins ProtocolVersion to the code an init program is
// built from: this package and the two it runs (confine, proctree),
// without tests and comments. An init program built from other code would
// pass a server's handshake unless the version changed with the code.
var sourceOfVersion = map[string]string{
	"sandboxflow-init/2": "687d2a0bfb81a75f6734b72f98e3944fdff06cf9ff85ec44f7eb39e6581ead4d",
	"sandboxflow-init/3": "6c9d1f3388dc99d39ac62a68fdb53476c071c6af7e4670dfb39ba94836e3dc95",
	"sandboxflow-init/4": "da07e5fc6890b591164ee00bd30feca3500e66773e5bcda1869ea4206904e14b",
	"sandboxflow-init/5": "73578340227a7450f822828f55aab3535511810a10365f7d266aaf04904bfc22",
	"sandboxflow-init/6": "74edf4b97ac78635baa414edcd5839c685478978232c456ac937a19605eb00bb",
	"sandboxflow-init/7": "7fc1e99175b74b4d7d2cf940c6382d425e95e5983b336eda85403fb21ed82c8e",
}

// TestProtocolVersionFollowsTheSource fails when the code of an init
// program changed and ProtocolVersion did not.
func TestProtocolVersionFollowsTheSource(t *testing.T) {
	got := initSourceHash(t)
	want, ok := sourceOfVersion[leaseinit.ProtocolVersion]
	if !ok || want != got {
		t.Fatalf("the init program's code is not the code of ProtocolVersion %q: "+
			"if it changed, a server must refuse init programs built before the change — "+
			"set ProtocolVersion to a new value and pin it here to %q", leaseinit.ProtocolVersion, got)
	}
}

// initSourceHash hashes the init program's Go files, without comments,
// as gofmt would print them.
func initSourceHash(t *testing.T) string {
	t.Helper()
	var files []string
	for _, dir := range []string{".", "../confine", "../proctree"} {
		matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range matches {
			if !strings.HasSuffix(m, "_test.go") {
				files = append(files, m)
			}
		}
	}
	slices.Sort(files)
	h := sha256.New()
	fset := token.NewFileSet()
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0) // no comments
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := printer.Fprint(&buf, fset, f); err != nil {
			t.Fatal(err)
		}
		h.Write([]byte(filepath.ToSlash(name) + "\n"))
		h.Write(buf.Bytes())
	}
	return hex.EncodeToString(h.Sum(nil))
}
