package machine

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

// copySparse reproduces the file byte for byte and leaves its holes holes.
func TestCopySparseKeepsDataAndHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	const size = 64 << 20
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	chunks := map[int64][]byte{0: bytes.Repeat([]byte("a"), 4096), 17 << 20: bytes.Repeat([]byte("b"), 3<<20), size - 4096: bytes.Repeat([]byte("c"), 4096)}
	for off, b := range chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := dst.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := copySparse(dst, src); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(got, want) {
		t.Fatal("the copy differs from its source")
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(dst.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if allocated := st.Blocks * 512; allocated > 8<<20 {
		t.Errorf("the copy allocates %d bytes of a file holding about 3 MiB: its holes were filled", allocated)
	}
}

// Two disks of one size are copies of one formatted image, yet file
// systems of their own: what one lease writes, the other does not see,
// and neither costs the host more than the file system's metadata.
func TestDisksOfOneSizeAreSeparateFileSystems(t *testing.T) {
	testenv.RequireRoot(t, "disks are loop-mounted file systems")
	if err := DiskSupport(); err != nil {
		t.Fatalf("disks unsupported here: %v", err)
	}
	root := t.TempDir()
	images := filepath.Join(root, "disks")
	budget := NewDiskBudget(0)
	var disks []*Disk
	for _, id := range []string{"a", "b"} {
		dir := filepath.Join(root, id)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		d, err := NewDisk(images, id, 256<<20, dir, budget)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Remove() })
		disks = append(disks, d)
	}
	if err := os.WriteFile(filepath.Join(root, "a", "only-in-a"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "b", "only-in-a")); !os.IsNotExist(err) {
		t.Fatalf("disk b sees disk a's file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "b", "lost+found")); err != nil {
		t.Fatalf("disk b is not a fresh ext4: %v", err)
	}
	for _, d := range disks {
		if _, written := d.usage(); written > 16<<20 {
			t.Errorf("%s holds %d bytes on the host: the copy was not sparse", d.image, written)
		}
	}
}
