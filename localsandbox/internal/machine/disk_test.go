package machine

import (
	"bytes"
	"errors"
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

// A full disk grows online: past its size a write fails with ENOSPC; after
// Grow the mounted file system is the new size and takes the rest. A
// budget that cannot hold the growth refuses it with nothing changed, and
// a size not larger is refused; Remove gives back the grown size.
func TestDiskGrowsOnline(t *testing.T) {
	testenv.RequireRoot(t, "disks are loop-mounted file systems")
	if err := DiskSupport(); err != nil {
		t.Fatalf("disks unsupported here: %v", err)
	}
	root := t.TempDir()
	dir := filepath.Join(root, "lease")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	budget := NewDiskBudget(160 << 20)
	d, err := NewDisk(filepath.Join(root, "disks"), "a", 64<<20, dir, budget)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Remove() })
	fill := func(name string, n int64) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		defer f.Close()
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for written := int64(0); written < n; written += int64(len(chunk)) {
			if _, err := f.Write(chunk); err != nil {
				return err
			}
		}
		return f.Sync()
	}
	if err := fill("full", 1<<30); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling a 64 MiB disk: %v, want ENOSPC", err)
	}
	if err := d.Grow(64 << 20); !errors.Is(err, ErrNotLarger) {
		t.Errorf("Grow to the same size: %v, want ErrNotLarger", err)
	}
	var ce *CapacityError
	if err := d.Grow(256 << 20); !errors.As(err, &ce) {
		t.Errorf("Grow past the budget: %v, want a *CapacityError", err)
	}
	if d.Size() != 64<<20 || budget.held != 64<<20 {
		t.Errorf("after a refused Grow: size %d, budget holds %d; want both 64 MiB", d.Size(), budget.held)
	}
	if why := ResizeSupport(); why != nil {
		// Not testenv.Missing: a server without the capability answers
		// resize UNSUPPORTED (TestResizeIsUnsupportedWithoutCapability).
		if err := d.Grow(128 << 20); err == nil || d.Size() != 64<<20 || budget.held != 64<<20 {
			t.Errorf("Grow without the capability: %v, size %d, budget holds %d; want an error and both 64 MiB", err, d.Size(), budget.held)
		}
		t.Skipf("disks cannot grow here: %v", why)
	}
	if err := d.Grow(128 << 20); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if total := int64(st.Blocks) * st.Bsize; total < 120<<20 || total > 128<<20 {
		t.Errorf("the grown file system holds %d MiB, want about 128", total>>20)
	}
	if err := fill("more", 32<<20); err != nil {
		t.Fatalf("writing 32 MiB after growing to 128 MiB: %v", err)
	}
	if d.Size() != 128<<20 || budget.held != 128<<20 {
		t.Errorf("after Grow: size %d, budget holds %d; want both 128 MiB", d.Size(), budget.held)
	}
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}
	if budget.held != 0 {
		t.Errorf("after Remove the budget holds %d", budget.held)
	}
}
