package localsandbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// The rule of package hostfs, kept: no server-side code names a path to
// an os or filepath function that creates, writes, re-owns, re-modes,
// removes or walks files, except at the host-owned paths allowed below,
// each with why no lease can write there. Everything below a lease
// directory goes through internal/hostfs (openat2 with RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS from a directory descriptor). Package leaseinit is
// not checked: it runs inside the lease, as the lease's root.
func TestHostFileOperationsGoThroughHostfs(t *testing.T) {
	guarded := map[string]bool{}
	for _, f := range []string{"WriteFile", "Mkdir", "MkdirAll", "Chmod", "Chown", "Lchown", "Remove", "RemoveAll",
		"Rename", "Symlink", "Link", "OpenFile", "Create", "Truncate", "Chtimes"} {
		guarded["os."+f] = true
	}
	for _, f := range []string{"Walk", "WalkDir", "Glob"} {
		guarded["filepath."+f] = true
	}
	// file:function → why its paths are the host's, not a lease's.
	allowed := map[string]string{
		"server.go:takeRoot":                      "the server's root, its marker and lock: made before any lease, mode 0711, root's",
		"sweep.go:sweep":                          "re-makes <root>/leases, the server's",
		"lease.go:newLeaseDirs":                   "the lease directory itself, in <root>/leases, before anything of the lease exists",
		"lease.go:guardDir":                       "the lease directory itself (or its disk's root), before anything of the lease exists",
		"internal/machine/disk.go:NewDisk":        "<root>/disks and the disk image: the server's only",
		"internal/machine/disk.go:create":         "the disk image, in <root>/disks",
		"internal/machine/disk.go:formattedImage": "the formatted image a create copies, in <root>/disks",
		"internal/machine/disk.go:openLoop":       "a loop device node in <root>/disks",
		"internal/machine/disk.go:grow":           "the disk image, in <root>/disks",
		"internal/machine/disk.go:Remove":         "the disk image, in <root>/disks",
		"internal/machine/disk.go:SweepDisks":     "<root>/disks",
		"internal/machine/cgroups.go:removeGroup": "the lease's cgroup directories, in cgroupfs",
		"internal/machine/cgroups.go:Close":       "the lease's cgroup directories, in cgroupfs",
		"internal/machine/freezer.go:freezeV1":    "the freezer's control files, in cgroupfs",
		"internal/machine/freezer.go:freezeV2":    "the freezer's control files, in cgroupfs",
		"preview_claim.go:claimPreviewAddr":       "the host-wide claims of preview addresses, in /run (root) or the user's own directory: no lease can write them",
		"images.go:hostMasks":                     "reads (never writes) the host's system directories that the host image is made of: no lease can write them",
	}
	var files []string
	for _, dir := range []string{".", "internal/machine", "internal/network", "internal/journal", "internal/proctree"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		files = append(files, m...)
	}
	used := map[string]bool{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			key := filepath.ToSlash(file) + ":" + fn.Name.Name
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok || !guarded[pkg.Name+"."+sel.Sel.Name] {
					return true
				}
				if _, ok := allowed[key]; ok {
					used[key] = true
					return true
				}
				t.Errorf("%s: %s.%s in %s: a file operation by path; below a lease directory use internal/hostfs, or allow a host-owned path here with why",
					fset.Position(sel.Pos()), pkg.Name, sel.Sel.Name, fn.Name.Name)
				return true
			})
		}
	}
	for key := range allowed {
		if !used[key] {
			t.Errorf("%s is allowed but makes no such call: drop it from the list", key)
		}
	}
}
