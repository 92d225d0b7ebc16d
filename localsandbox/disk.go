package localsandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// A lease's disk, bounded by the kernel.
//
// Everything a lease writes — its root's upper layer, /workspace, /tmp —
// lives in its lease directory, and on a root server that directory is the
// mount of a file system of its own: a sparse image file of disk_mib
// (<root>/disks/<id>.img), formatted ext4 (mkfs.ext4 of e2fsprogs, no
// journal, nothing reserved) and mounted through a loop device that clears
// itself when the file system is unmounted. Past disk_mib a write fails with
// ENOSPC, inside the lease and through the files API alike, and the host's
// disk holds only what the lease really wrote. Without root (or without
// mkfs.ext4 or loop devices) the disk is not bounded, and the view says so.

// disksDir holds the image files, below Options.Root.
const disksDir = "disks"

// leaseDisk is the mounted disk of one lease.
type leaseDisk struct {
	image string // the image file
	mount string // where it is mounted: the lease directory
}

// diskSupport reports whether this server can bound disks, or why not.
func diskSupport() error {
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

// newLeaseDisk makes a disk of size bytes for lease id and mounts it at
// dir (which must exist and be empty).
func (s *Server) newLeaseDisk(id string, size int64, dir string) (*leaseDisk, error) {
	images := filepath.Join(s.opts.Root, disksDir)
	if err := os.MkdirAll(images, 0o700); err != nil {
		return nil, err
	}
	d := &leaseDisk{image: filepath.Join(images, id+".img"), mount: dir}
	if err := d.create(size); err != nil {
		os.Remove(d.image)
		return nil, err
	}
	return d, nil
}

func (d *leaseDisk) create(size int64) error {
	f, err := os.OpenFile(d.image, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
		"-E", "lazy_itable_init=1,nodiscard", d.image).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, out)
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

// attachLoop binds a free loop device to the backing file and returns it
// open. It clears itself once nothing holds it (the file system is
// unmounted). Device nodes the host's /dev lacks (no devtmpfs) are made in
// nodes, and removed again.
func attachLoop(backing int, nodes string) (int, error) {
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

// remove unmounts the disk (the loop device clears itself) and deletes
// its image; again, it does nothing.
func (d *leaseDisk) remove() error {
	if err := unix.Unmount(d.mount, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmounting the lease's disk: %w", err)
	}
	if err := os.Remove(d.image); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// sweepDisks unmounts what a crashed server left mounted below the leases
// directory and removes its images.
func (s *Server) sweepDisks() {
	leases, _ := os.ReadDir(filepath.Join(s.opts.Root, leasesDir))
	for _, e := range leases {
		unix.Unmount(filepath.Join(s.opts.Root, leasesDir, e.Name()), unix.MNT_DETACH)
	}
	os.RemoveAll(filepath.Join(s.opts.Root, disksDir))
}
