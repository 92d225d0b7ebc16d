package machine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A lease's disk, bounded by the kernel.
//
// Everything a lease writes — its root's upper layer, /workspace, /tmp —
// lives in its lease directory, and on a root server that directory is the
// mount of a file system of its own: a sparse image file of disk_mib
// (<root>/disks/<id>.img), formatted ext4 (a copy of one mkfs.ext4 of
// e2fsprogs per size, see formattedImage: no journal, nothing reserved) and mounted through a loop device that clears
// itself when the file system is unmounted. Past disk_mib a write fails with
// ENOSPC, inside the lease and through the files API alike, and the host's
// disk holds only what the lease really wrote. Without root (or without
// mkfs.ext4 or loop devices) the disk is not bounded, and the view says so.

// Disk is the mounted disk of one lease.
type Disk struct {
	image string // the image file
	mount string // where it is mounted: the lease directory
	size  int64  // its size in bytes, held in the server's disk budget

	// mu orders usage and remove: once the disk is unmounted, its mount
	// point is a directory of the host's file system.
	mu      sync.Mutex
	removed bool
	budget  *DiskBudget // holds size until Remove (nil: none)
}

// The host's disk.
//
// Images are sparse: a lease's disk takes on the host only what the lease
// wrote, so the disks of all leases may together be larger than the host's
// free space (4096 MiB each by default, 256 leases). Two checks keep the
// leases from filling the host's file system:
//
//   - Room, always: a disk is made (for a create or a fork) only while the
//     host's file system holds, beyond a reserve (a twentieth of it, at
//     most 256 MiB), what is promised to it and not yet written there: what
//     the leases wrote that the kernel has not yet written back into their
//     images, and for each fork in flight what its source holds, which its
//     copy is about to write. Without it, forks of a paused lease, each
//     copying what the lease wrote in one request, filled the host's disk,
//     and the kernel then failed to write back the leases' data (ext4
//     "error while async write back") while the forks reported running.
//   - A budget, when the operator sets Options.DiskBudgetMiB: the sizes of
//     all leases' disks together (disk_mib each) stay within it, so that
//     every lease can fill its disk, whatever the others do. Without it a
//     lease writing its whole disk can use space another lease counted on.
//
// Both refuse with 503 (no capacity, as the hosted service says it) before
// anything is made or copied.

// DiskBudget is Options.DiskBudgetMiB in bytes and what the live leases'
// disks hold of it.
type DiskBudget struct {
	mu    sync.Mutex
	bytes int64 // 0: no budget
	held  int64
}

// NewDiskBudget returns a budget of bytes (0: none).
func NewDiskBudget(bytes int64) *DiskBudget { return &DiskBudget{bytes: bytes} }

const mib = 1 << 20

// take holds size bytes of the budget, or says why it cannot.
func (b *DiskBudget) take(size int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bytes > 0 && b.held+size > b.bytes {
		return &CapacityError{fmt.Sprintf(
			"no disk capacity: the sandboxes hold %d MiB of the server's %d MiB disk budget, this one needs %d MiB (ask for a smaller disk_mib, or destroy a sandbox)",
			b.held/mib, b.bytes/mib, size/mib)}
	}
	b.held += size
	return nil
}

func (b *DiskBudget) give(size int64) {
	b.mu.Lock()
	b.held -= size
	b.mu.Unlock()
}

// hostReserveMax bounds the reserve kept free on the host's file system.
const hostReserveMax = 256 << 20

// CheckRoom refuses a new disk (a *CapacityError) unless the file system
// of dir, the server's root, holds promised (the sum of the leases' disks'
// Promised) and the reserve.
func CheckRoom(dir string, promised int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("the root's file system: %w", err)
	}
	free := int64(st.Bavail) * st.Bsize
	reserve := min(int64(st.Blocks)*st.Bsize/20, hostReserveMax)
	if free-promised < reserve {
		return &CapacityError{fmt.Sprintf(
			"no disk capacity: the host's file system has %d MiB free, %d MiB of it promised to sandboxes, %d MiB kept in reserve (destroy a sandbox, or free disk space)",
			free/mib, promised/mib, reserve/mib)}
	}
	return nil
}

// Promised is what the host's file system is promised for d: what the
// lease wrote that the kernel has not yet written back into its image, and
// for each of copies (forks copying the lease now) what the lease holds.
func (d *Disk) Promised(copies int) int64 {
	used, written := d.usage()
	// A copy writes what the source holds, and a new image's metadata: as
	// much as the source's image holds, or more.
	return max(0, used-written) + int64(copies)*max(used, written)
}

// usage returns what the lease's file system holds (used) and what its
// image holds on the host (written); used is ahead while the kernel has
// not written it back yet. A removed disk holds nothing.
func (d *Disk) usage() (used, written int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.removed {
		return 0, 0
	}
	var st unix.Statfs_t
	if unix.Statfs(d.mount, &st) == nil {
		used = int64(st.Blocks-st.Bfree) * st.Bsize
	}
	var fi unix.Stat_t
	if unix.Stat(d.image, &fi) == nil {
		written = fi.Blocks * 512
	}
	return used, written
}

// DiskSupport reports whether this server can bound disks, or why not.
func DiskSupport() error {
	if os.Geteuid() != 0 {
		return errors.New("the server is not root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return errors.New("no mkfs.ext4 (e2fsprogs)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return errors.New("no /dev/loop-control")
	}
	return nil
}

// NewDisk makes a disk of size bytes for lease id, its image in the
// directory images, and mounts it at dir (which must exist and be empty),
// if budget has room for it (a *CapacityError if not). Check the host's
// room first (CheckRoom).
func NewDisk(images, id string, size int64, dir string, budget *DiskBudget) (*Disk, error) {
	if err := budget.take(size); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(images, 0o700); err != nil {
		budget.give(size)
		return nil, err
	}
	d := &Disk{image: filepath.Join(images, id+".img"), mount: dir, size: size, budget: budget}
	if err := d.create(size); err != nil {
		os.Remove(d.image)
		budget.give(size)
		return nil, err
	}
	return d, nil
}

func (d *Disk) create(size int64) error {
	f, err := os.OpenFile(d.image, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	blank, err := formattedImage(filepath.Dir(d.image), size)
	if err != nil {
		return err
	}
	if err := copySparse(f, blank); err != nil {
		return fmt.Errorf("copying the formatted disk image: %w", err)
	}
	loop, err := attachLoop(int(f.Fd()), filepath.Dir(d.image))
	if err != nil {
		return err
	}
	defer unix.Close(loop)
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", loop), d.mount, "ext4", unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mounting the lease's disk: %w", err)
	}
	return nil
}

// Formatted images.
//
// A create does not run mkfs.ext4: it copies a file system formatted once
// per disk size (<root>/disks/.ext4-<size>.img, made on the first create of
// that size after the server starts) into the lease's sparse image, extent
// by extent. A new ext4 of 4 GiB holds about 2 MiB, so the copy takes a
// few milliseconds where mkfs.ext4 took 14 ms and more under load (make
// bench, P6). The copies share the file system's UUID, which nothing reads:
// a lease's disk is mounted by its loop device, never by UUID.

// formatting serialises the making of formatted images; a copy does not
// hold it.
var formatting sync.Mutex

// formattedImage returns the formatted image of size bytes in images,
// making it if it is not there yet (through a temporary file renamed into
// place, so that an image found there is whole).
func formattedImage(images string, size int64) (string, error) {
	formatting.Lock()
	defer formatting.Unlock()
	path := filepath.Join(images, ".ext4-"+strconv.FormatInt(size, 10)+".img")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	err = f.Truncate(size)
	f.Close()
	if err == nil {
		var out []byte
		out, err = exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
			"-E", "lazy_itable_init=1,nodiscard", tmp).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("mkfs.ext4: %v: %s", err, out)
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return path, nil
}

// copySparse copies the data extents of the file at src into dst, which
// has src's size and holds only holes: a clone where the file system
// shares extents (FICLONE), else copy_file_range over each extent that
// SEEK_DATA finds.
func copySparse(dst *os.File, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if unix.IoctlFileClone(int(dst.Fd()), int(in.Fd())) == nil {
		return nil
	}
	fd := int(in.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO { // no data past off
			return nil
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for r, w := data, data; r < hole; {
			n, err := unix.CopyFileRange(fd, &r, int(dst.Fd()), &w, int(hole-r), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
		}
		off = hole
	}
	return nil
}

// loopAttach serialises attachLoop.
var loopAttach sync.Mutex

// attachLoop binds a free loop device to the backing file and returns it
// open. It clears itself once nothing holds it (the file system is
// unmounted). Device nodes the host's /dev lacks (no devtmpfs) are made in
// nodes, and removed again.
func attachLoop(backing int, nodes string) (int, error) {
	// One attach at a time in this process: LOOP_CTL_GET_FREE answers
	// every concurrent caller the same device, and 50 creates at once
	// spent their 32 attempts each on one another ("no free loop device",
	// TestFiftyConcurrentLeases). Other processes' attaches are the
	// attempts' to outlast.
	loopAttach.Lock()
	defer loopAttach.Unlock()
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ctl)
	for attempt := 0; attempt < 32; attempt++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return -1, fmt.Errorf("finding a free loop device: %w", err)
		}
		dev, err := openLoop(n, nodes)
		if err != nil {
			return -1, err
		}
		cfg := &unix.LoopConfig{Fd: uint32(backing), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
		err = unix.IoctlLoopConfigure(dev, cfg)
		if err == nil {
			return dev, nil
		}
		unix.Close(dev)
		if err != unix.EBUSY {
			return -1, fmt.Errorf("configuring loop device %d: %w", n, err)
		}
		// Another lease took it meanwhile.
	}
	return -1, errors.New("no free loop device")
}

func openLoop(n int, nodes string) (int, error) {
	fd, err := unix.Open("/dev/loop"+strconv.Itoa(n), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	node := filepath.Join(nodes, ".loop"+strconv.Itoa(n))
	os.Remove(node)
	if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
		return -1, fmt.Errorf("making loop device node %d: %w", n, err)
	}
	defer os.Remove(node)
	return unix.Open(node, unix.O_RDWR|unix.O_CLOEXEC, 0)
}

// Growing a disk.
//
// A disk grows online, its lease running or paused (a paused lease's
// processes are frozen; its file system is not): Grow holds the extra size
// in the budget, extends the image file (through its own descriptor: the
// image is in <root>/disks, the server's), tells the loop device its
// backing file grew (LOOP_SET_CAPACITY on the device the mount is on,
// found by the mount point's st_dev: the disk keeps no descriptor of it,
// so that the device still clears itself at unmount), and grows the ext4
// file system in place (EXT4_IOC_RESIZE_FS on the mount point, the lease
// directory, which the server made and owns: no resize2fs needed). A disk
// never shrinks.

// ErrNotLarger is Grow's refusal of a size that is not larger than the
// disk's.
var ErrNotLarger = errors.New("the new size must be larger than the disk's")

// ext4ResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a mounted
// ext4 to the given number of blocks.
const ext4ResizeFS = 0x40086610

// loopMajor is the block major of loop devices.
const loopMajor = 7

// ResizeSupport reports whether this server can grow a mounted disk, or
// why not: the kernel grows a mounted ext4 only for a process with
// CAP_SYS_RESOURCE, which some container runtimes drop even for root
// (resize2fs, which uses the same ioctl, cannot either).
func ResizeSupport() error {
	if err := DiskSupport(); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading the server's capabilities: %w", err)
	}
	if data[unix.CAP_SYS_RESOURCE/32].Effective&(1<<(unix.CAP_SYS_RESOURCE%32)) == 0 {
		return errors.New("the server lacks CAP_SYS_RESOURCE, which growing a mounted file system needs")
	}
	return nil
}

// Size is the disk's size in bytes.
func (d *Disk) Size() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.size
}

// Grow makes the disk size bytes, if size is larger than it is
// (ErrNotLarger if not) and the budget holds the difference (a
// *CapacityError if not; check the host's room first, CheckRoom). On a
// failure the budget and the disk's size are as they were; the image file
// may be left longer, which costs the host nothing (it is sparse).
func (d *Disk) Grow(size int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.removed {
		return errors.New("the disk was removed")
	}
	if size <= d.size {
		return fmt.Errorf("%w (%d MiB)", ErrNotLarger, d.size/mib)
	}
	if err := d.budget.take(size - d.size); err != nil {
		return err
	}
	if err := d.grow(size); err != nil {
		d.budget.give(size - d.size)
		return err
	}
	d.size = size
	return nil
}

func (d *Disk) grow(size int64) error {
	f, err := os.OpenFile(d.image, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("extending the disk image: %w", err)
	}
	mount, err := unix.Open(d.mount, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(mount)
	var st unix.Stat_t
	if err := unix.Fstat(mount, &st); err != nil {
		return err
	}
	if unix.Major(st.Dev) != loopMajor {
		return fmt.Errorf("the lease's disk is not on a loop device (device %d:%d)", unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	loop, err := openLoop(int(unix.Minor(st.Dev)), filepath.Dir(d.image))
	if err != nil {
		return err
	}
	err = unix.IoctlSetInt(loop, unix.LOOP_SET_CAPACITY, 0)
	unix.Close(loop)
	if err != nil {
		return fmt.Errorf("telling the loop device its size: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(mount, &fs); err != nil {
		return err
	}
	blocks := uint64(size) / uint64(fs.Bsize)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mount), ext4ResizeFS, uintptr(unsafe.Pointer(&blocks))); errno != 0 {
		return fmt.Errorf("growing the lease's file system: %w", errno)
	}
	return nil
}

// Remove unmounts the disk (the loop device clears itself), deletes its
// image and gives its size back to the budget; again, it does nothing.
func (d *Disk) Remove() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.removed = true
	if err := unix.Unmount(d.mount, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmounting the lease's disk: %w", err)
	}
	if err := os.Remove(d.image); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if d.budget != nil {
		d.budget.give(d.size)
		d.budget = nil
	}
	return nil
}

// SweepDisks unmounts what a crashed server left mounted below the leases
// directory and removes the images directory.
func SweepDisks(leases, images string) {
	entries, _ := os.ReadDir(leases)
	for _, e := range entries {
		unix.Unmount(filepath.Join(leases, e.Name()), unix.MNT_DETACH)
	}
	os.RemoveAll(images)
}

// CapacityError is a refusal for lack of room (a host id range, disk): the
// API answers it 503, no capacity.
type CapacityError struct{ Msg string }

func (e *CapacityError) Error() string { return e.Msg }
