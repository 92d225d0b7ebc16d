package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestRecipeNameFollowsTheRecipe(t *testing.T) {
	r, err := DefaultRecipe()
	if err != nil {
		t.Fatal(err)
	}
	same := r
	same.Include = []string{"python3", "procps", "iproute2", "ca-certificates"} // another order
	if r.Name() != same.Name() {
		t.Errorf("the order of the packages changed the name: %s, %s", r.Name(), same.Name())
	}
	for what, other := range map[string]Recipe{
		"a package":   {Suite: r.Suite, Variant: r.Variant, Include: append([]string{"curl"}, r.Include...), DpkgOpts: r.DpkgOpts, SourceDateEpoch: r.SourceDateEpoch},
		"the epoch":   {Suite: r.Suite, Variant: r.Variant, Include: r.Include, DpkgOpts: r.DpkgOpts, SourceDateEpoch: r.SourceDateEpoch + 1},
		"the suite":   {Suite: "trixie", Variant: r.Variant, Include: r.Include, DpkgOpts: r.DpkgOpts, SourceDateEpoch: r.SourceDateEpoch},
		"an option":   {Suite: r.Suite, Variant: r.Variant, Include: r.Include, SourceDateEpoch: r.SourceDateEpoch},
		"the variant": {Suite: r.Suite, Variant: "apt", Include: r.Include, DpkgOpts: r.DpkgOpts, SourceDateEpoch: r.SourceDateEpoch},
	} {
		if other.Name() == r.Name() {
			t.Errorf("changing %s kept the name %s", what, r.Name())
		}
	}
	if !strings.HasPrefix(r.Name(), r.Suite+"-") {
		t.Errorf("name %s", r.Name())
	}
}

// fakeBuilder puts an mmdebstrap first in PATH that makes a one-file
// image (or fails, with FAKE_MMDEBSTRAP_FAIL) and counts its runs in the
// returned file: the cache's locking and renaming are what is tested here;
// the real build runs in the server's tests (TestMain of localsandbox).
func fakeBuilder(t *testing.T) string {
	bin := t.TempDir()
	count := filepath.Join(t.TempDir(), "runs")
	script := `#!/bin/sh
eval target=\${$(($# - 1))}
[ "$(cat | wc -l)" -gt 0 ] || { echo "no sources on stdin" >&2; exit 2; }
mkdir -p "$target/etc"
echo "$SOURCE_DATE_EPOCH" > "$target/etc/epoch"
echo run >> "$FAKE_MMDEBSTRAP_COUNT"
echo "I: a line of progress"
[ -z "$FAKE_MMDEBSTRAP_FAIL" ] || exit 3
`
	if err := os.WriteFile(filepath.Join(bin, "mmdebstrap"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_MMDEBSTRAP_COUNT", count)
	return count
}

func TestEnsureBuildsOnceForConcurrentCallers(t *testing.T) {
	count := fakeBuilder(t)
	r, err := DefaultRecipe()
	if err != nil {
		t.Fatal(err)
	}
	var progress syncBuffer
	cache := Cache{Dir: filepath.Join(t.TempDir(), "images"), Progress: &progress}
	var wg sync.WaitGroup
	dirs := make([]string, 4)
	errs := make([]error, 4)
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = cache.Ensure(context.Background(), r) })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != cache.Path(r) {
			t.Fatalf("caller %d: %q, %v", i, dirs[i], errs[i])
		}
	}
	if runs, _ := os.ReadFile(count); string(runs) != "run\n" {
		t.Errorf("mmdebstrap ran %d times, want once", strings.Count(string(runs), "run"))
	}
	if epoch, _ := os.ReadFile(filepath.Join(cache.Path(r), "etc", "epoch")); strings.TrimSpace(string(epoch)) != "1796428800" {
		t.Errorf("SOURCE_DATE_EPOCH %q", epoch)
	}
	if !strings.Contains(progress.String(), "image: I: a line of progress\n") {
		t.Errorf("progress not shown, prefixed: %q", progress.String())
	}
	if left, _ := filepath.Glob(filepath.Join(cache.Dir, ".build-*")); len(left) > 0 {
		t.Errorf("build directories left: %v", left)
	}
	// Built, it is found without a build.
	if _, err := cache.Ensure(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if runs, _ := os.ReadFile(count); string(runs) != "run\n" {
		t.Errorf("an image in the cache was built again")
	}
}

func TestAFailedBuildLeavesNoImage(t *testing.T) {
	fakeBuilder(t)
	t.Setenv("FAKE_MMDEBSTRAP_FAIL", "1")
	r, err := DefaultRecipe()
	if err != nil {
		t.Fatal(err)
	}
	cache := Cache{Dir: filepath.Join(t.TempDir(), "images")}
	_, err = cache.Ensure(context.Background(), r)
	var ie *Error
	if !errors.As(err, &ie) || ie.Step != StepBuild || ie.Image != r.Name() {
		t.Fatalf("Ensure: %v, want an *Error of step %s", err, StepBuild)
	}
	if _, ok := cache.Lookup(r); ok {
		t.Error("a failed build left an image")
	}
	if left, _ := filepath.Glob(filepath.Join(cache.Dir, ".build-*")); len(left) > 0 {
		t.Errorf("build directories left: %v", left)
	}
}

func TestEnsureGivesUpWaitingWhenCancelled(t *testing.T) {
	r, err := DefaultRecipe()
	if err != nil {
		t.Fatal(err)
	}
	cache := Cache{Dir: t.TempDir()}
	held, err := lockFile(context.Background(), filepath.Join(cache.Dir, "."+r.Name()+".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = cache.Ensure(ctx, r)
	var ie *Error
	if !errors.As(err, &ie) || ie.Step != StepCache || !errors.Is(err, context.Canceled) {
		t.Fatalf("Ensure while another builds, cancelled: %v", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
