package hostfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Every operation refuses to go through a symlink, and WriteFile replaces
// a symlink at its name instead of writing through it.
func TestNoOperationFollowsASymlink(t *testing.T) {
	tree, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("host"), 0o600)
	os.Symlink(outside, filepath.Join(tree, "dirlink"))
	os.Symlink(victim, filepath.Join(tree, "filelink"))
	d, err := Open(tree)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Mkdir("dirlink/x", 0o755, nil); !IsRefused(err) {
		t.Errorf("Mkdir through a link: %v", err)
	}
	if err := d.MkdirAll("dirlink/a/b", 0o755, nil); !IsRefused(err) {
		t.Errorf("MkdirAll through a link: %v", err)
	}
	if _, err := d.Mkdir("dirlink", 0o755, nil); !IsRefused(err) {
		t.Errorf("Mkdir over a link: %v", err)
	}
	if err := d.WriteFile("dirlink/f", []byte("x"), 0o644, nil); !IsRefused(err) {
		t.Errorf("WriteFile through a link: %v", err)
	}
	if err := d.Chmod("filelink", 0o777); !IsRefused(err) {
		t.Errorf("Chmod of a link: %v", err)
	}
	if err := d.Lchown("dirlink/victim", 0, 0); !IsRefused(err) {
		t.Errorf("Lchown through a link: %v", err)
	}
	if _, err := d.OpenDir("../" + filepath.Base(outside)); err == nil {
		t.Error(`OpenDir of ".." succeeded`)
	}
	if err := d.WriteFile("filelink", []byte("lease"), 0o644, nil); err != nil {
		t.Fatalf("WriteFile over a link: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host" {
		t.Errorf("the link's target was written: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(tree, "filelink")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("filelink is not the new file: %v %v", fi, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("outside holds %d files, want the victim alone", len(entries))
	}
	// Walk sees the links as links and never descends through them.
	var seen []string
	d.Walk(func(_ *Dir, name string, st *unix.Stat_t) error {
		seen = append(seen, name)
		return nil
	})
	if len(seen) != 2 {
		t.Errorf("Walk saw %q", seen)
	}
}

// Mkdir sets the exact mode, sticky bit included, whatever the umask.
func TestMkdirModeIsExact(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.MkdirAll("var/tmp", 0o1777|os.ModeSticky, nil); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(d.Name(), "var/tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("var/tmp: %v %v", fi.Mode(), err)
	}
}
