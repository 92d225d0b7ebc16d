package confine

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// attackModes are the three ways the attack child runs: unconfined (the
// control: every attack must get past the kernel's permission checks, or
// the confined runs prove nothing), with only no_new_privs and the seccomp
// filter (all capabilities held, so an EPERM can only be the filter's), and
// fully confined by Apply.
var attackModes = []string{"none", "filter", "apply"}

func init() {
	for _, mode := range attackModes {
		children["attacks-"+mode] = func() error { return attackChild(mode) }
	}
}

// mustSucceedUnconfined are the attacks that must succeed outright in the
// control run (the others must at least not fail with EPERM there: they are
// called with arguments the kernel rejects after its permission check, or
// the kernel lacks them, so that the control run stays harmless).
var mustSucceedUnconfined = []string{
	"mount", "umount2", "fsopen", "open_tree", "clone(CLONE_NEWUSER)", "unshare(CLONE_NEWUSER)",
	"setns", "ptrace(PTRACE_ATTACH) sibling", "process_vm_readv", "pidfd_getfd", "bpf(BPF_MAP_CREATE)",
	"keyctl", "add_key", "perf_event_open", "ioctl(TIOCSTI)", "ioctl(TIOCSTI) high bits set",
	"userfaultfd", "syslog", "personality(PER_BSD)", "io_uring_setup", "adjtimex", "modify_ldt",
	"kcmp", "capset regain CAP_SYS_ADMIN", "open /proc/<sibling>/mem",
}

func TestApplyRefusesEscapes(t *testing.T) {
	requireRoot(t)
	reports := map[string]map[string]string{}
	for _, mode := range attackModes {
		cmd := child(t, "attacks-"+mode)
		// A private mount namespace, so that the control run's mounts
		// vanish with it.
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
		var report map[string]string
		runChild(t, cmd, &report)
		reports[mode] = report
	}
	for _, name := range sortedKeys(reports["none"]) {
		t.Logf("%-32s unconfined=%-10s filter=%-10s apply=%s", name, reports["none"][name], reports["filter"][name], reports["apply"][name])
	}
	for _, name := range mustSucceedUnconfined {
		if got := reports["none"][name]; got != "ok" {
			t.Errorf("control: %s unconfined = %q, want ok (else the confined runs prove nothing)", name, got)
		}
	}
	for name, none := range reports["none"] {
		want := "EPERM"
		switch name {
		case "clone3":
			want = "ENOSYS" // so that glibc falls back to clone, which can be filtered
		case "no_new_privs after clearing":
			if none != "0" || reports["filter"][name] != "1" || reports["apply"][name] != "1" {
				t.Errorf("%s: unconfined=%s filter=%s apply=%s, want 0 1 1", name, none, reports["filter"][name], reports["apply"][name])
			}
			continue
		case "open /proc/<sibling>/mem":
			// Not a syscall the filter can refuse: the kernel's ptrace
			// access check keeps a process out of one holding capabilities
			// it lacks, which the sibling (like an unconfined init) does.
			if got := reports["apply"][name]; got != "EACCES" && got != "EPERM" {
				t.Errorf("%s under Apply = %q, want EACCES", name, got)
			}
			continue
		case "capset regain CAP_SYS_ADMIN":
			// The filter allows capset (as Docker's does); the dropped
			// capabilities are what refuse it.
			if got := reports["apply"][name]; got != "EPERM" {
				t.Errorf("%s under Apply = %q, want EPERM", name, got)
			}
			continue
		}
		if none == want {
			t.Errorf("control: %s unconfined = %s already; the test cannot tell the filter's refusal from the kernel's", name, none)
		}
		for _, mode := range []string{"filter", "apply"} {
			if got := reports[mode][name]; got != want {
				t.Errorf("%s with %s = %q, want %s", name, mode, got, want)
			}
		}
	}
}

// attackChild sets up what an init has before confinement (a private mount
// tree, a sibling process, a pty), confines itself as mode says, tries
// every attack and reports each outcome.
func attackChild(mode string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "confine-attack")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mnt, premounted := filepath.Join(dir, "mnt"), filepath.Join(dir, "premounted")
	for _, d := range []string{mnt, premounted} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("confine", premounted, "tmpfs", 0, ""); err != nil {
		return err
	}
	defer unix.Unmount(premounted, unix.MNT_DETACH)
	sibling := exec.Command("/bin/sleep", "600")
	if err := sibling.Start(); err != nil {
		return err
	}
	defer func() { _ = sibling.Process.Kill(); _ = sibling.Wait() }()
	ptmx, pts, err := openPty()
	if err != nil {
		return err
	}
	defer ptmx.Close()
	defer pts.Close()

	switch mode {
	case "filter":
		pols, err := filters(Policy{})
		if err != nil {
			return err
		}
		if err := seccomp.SetNoNewPrivs(); err != nil {
			return err
		}
		if err := installFilters(pols); err != nil {
			return err
		}
	case "apply":
		if err := Apply(Policy{}); err != nil {
			return err
		}
	}

	self := os.Getpid()
	tty := pts.Fd()
	report := map[string]string{}
	try := func(name string, f func() error) { report[name] = outcome(f()) }

	try("mount", func() error {
		if err := unix.Mount("confine", mnt, "tmpfs", 0, ""); err != nil {
			return err
		}
		return unix.Unmount(mnt, 0)
	})
	try("umount2", func() error { return unix.Unmount(premounted, unix.MNT_DETACH) })
	try("pivot_root", func() error { return unix.PivotRoot(mnt, mnt) }) // EINVAL: not a mount point
	try("fsopen", func() error { return closeFD(unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)) })
	try("fsmount", func() error { return closeFD(unix.Fsmount(-1, unix.FSMOUNT_CLOEXEC, 0)) })
	try("fsconfig", func() error { return unix.FsconfigCreate(-1) })
	try("move_mount", func() error { return unix.MoveMount(-1, "", unix.AT_FDCWD, mnt, unix.MOVE_MOUNT_F_EMPTY_PATH) })
	try("open_tree", func() error {
		return closeFD(unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC))
	})
	try("mount_setattr", func() error { return unix.MountSetattr(-1, "", 0, &unix.MountAttr{}) })
	try("clone(CLONE_NEWUSER)", func() error {
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		return cmd.Run()
	})
	try("unshare(CLONE_NEWUSER)", func() error {
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWUSER}
		return cmd.Run()
	})
	try("clone3", func() error { return rawErr(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)) }) // EINVAL: size 0
	try("setns", func() error {
		f, err := os.Open("/proc/self/ns/uts")
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.Setns(int(f.Fd()), unix.CLONE_NEWUTS)
	})
	try("ptrace(PTRACE_ATTACH) sibling", func() error { return unix.PtraceAttach(sibling.Process.Pid) })
	try("open /proc/<sibling>/mem", func() error {
		f, err := os.OpenFile("/proc/"+strconv.Itoa(sibling.Process.Pid)+"/mem", os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		return err
	})
	try("process_vm_readv", func() error {
		src, dst := []byte("secret"), make([]byte, 6)
		_, err := unix.ProcessVMReadv(self,
			[]unix.Iovec{{Base: &dst[0], Len: uint64(len(dst))}},
			[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: len(src)}}, 0)
		return err
	})
	try("pidfd_getfd", func() error {
		pidfd, err := unix.PidfdOpen(self, 0)
		if err != nil {
			return err
		}
		defer unix.Close(pidfd)
		return closeFD(unix.PidfdGetfd(pidfd, 1, 0))
	})
	try("bpf(BPF_MAP_CREATE)", func() error {
		// union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries.
		attr := [16]uint32{unix.BPF_MAP_TYPE_ARRAY, 4, 4, 1}
		fd, _, e := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		return closeFD(int(fd), errnoOrNil(e))
	})
	try("keyctl", func() error {
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_PROCESS_KEYRING, 1, 0, 0)
		return err
	})
	try("add_key", func() error {
		_, err := unix.AddKey("user", "confine-test", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
		return err
	})
	try("request_key", func() error {
		_, err := unix.RequestKey("user", "confine-test-absent", "", unix.KEY_SPEC_PROCESS_KEYRING)
		if errors.Is(err, unix.ENOKEY) {
			return unix.ENOKEY
		}
		return err
	})
	try("perf_event_open", func() error {
		attr := unix.PerfEventAttr{
			Type:   unix.PERF_TYPE_SOFTWARE,
			Config: unix.PERF_COUNT_SW_CPU_CLOCK,
			Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
			Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
		}
		return closeFD(unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC))
	})
	try("ioctl(TIOCSTI)", func() error {
		c := byte('x')
		return rawErr(unix.Syscall(unix.SYS_IOCTL, tty, unix.TIOCSTI, uintptr(unsafe.Pointer(&c))))
	})
	try("ioctl(TIOCSTI) high bits set", func() error {
		// The kernel truncates the request to 32 bits; the filter must too.
		c := byte('x')
		return rawErr(unix.Syscall(unix.SYS_IOCTL, tty, 0xffffffff_00000000|unix.TIOCSTI, uintptr(unsafe.Pointer(&c))))
	})
	try("ioctl(TIOCLINUX)", func() error {
		sub := byte(0)
		return rawErr(unix.Syscall(unix.SYS_IOCTL, tty, unix.TIOCLINUX, uintptr(unsafe.Pointer(&sub))))
	})
	try("init_module", func() error {
		empty := []byte{0}
		return rawErr(unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, uintptr(unsafe.Pointer(&empty[0]))))
	})
	try("finit_module", func() error {
		empty := []byte{0}
		return rawErr(unix.Syscall(unix.SYS_FINIT_MODULE, ^uintptr(0), uintptr(unsafe.Pointer(&empty[0])), 0))
	})
	try("delete_module", func() error {
		name := []byte("confine_test_absent\x00")
		return rawErr(unix.Syscall(unix.SYS_DELETE_MODULE, uintptr(unsafe.Pointer(&name[0])), 0, 0))
	})
	try("kexec_load", func() error { return rawErr(unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0xdead0000, 0, 0)) })
	try("kexec_file_load", func() error {
		return rawErr(unix.Syscall6(unix.SYS_KEXEC_FILE_LOAD, ^uintptr(0), ^uintptr(0), 0, 0, 0xdead0000, 0))
	})
	try("userfaultfd", func() error {
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
		return closeFD(int(fd), errnoOrNil(e))
	})
	try("kcmp", func() error { return rawErr(unix.Syscall6(unix.SYS_KCMP, uintptr(self), uintptr(self), 0, 0, 0, 0)) })
	try("syslog", func() error { return rawErr(unix.Syscall(unix.SYS_SYSLOG, 10, 0, 0)) }) // SYSLOG_ACTION_SIZE_BUFFER
	try("personality(PER_BSD)", func() error {
		const perBSD = 0x0006
		old, _, e := unix.Syscall(unix.SYS_PERSONALITY, perBSD, 0, 0)
		if e == 0 {
			unix.Syscall(unix.SYS_PERSONALITY, old, 0, 0)
		}
		return errnoOrNil(e)
	})
	try("io_uring_setup", func() error {
		var params [120]byte // struct io_uring_params
		fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
		return closeFD(int(fd), errnoOrNil(e))
	})
	try("socket(AF_VSOCK)", func() error { return closeFD(unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)) })
	try("open_by_handle_at", func() error { return rawErr(unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(99), 0, 0)) })
	try("name_to_handle_at", func() error {
		_, _, err := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
		return err
	})
	try("reboot", func() error { return rawErr(unix.Syscall6(unix.SYS_REBOOT, 0, 0, 0, 0, 0, 0)) }) // bad magic: EINVAL
	try("swapon", func() error { return swapCall(unix.SYS_SWAPON, filepath.Join(dir, "absent")) })
	try("swapoff", func() error { return swapCall(unix.SYS_SWAPOFF, filepath.Join(dir, "absent")) })
	try("acct", func() error { return unix.Acct(filepath.Join(dir, "absent")) })
	try("quotactl", func() error { return rawErr(unix.Syscall6(unix.SYS_QUOTACTL, 0, 0, 0, 0, 0, 0)) })
	try("lookup_dcookie", func() error { return rawErr(unix.Syscall(unix.SYS_LOOKUP_DCOOKIE, 0, 0, 0)) })
	try("clock_settime", func() error {
		return unix.ClockSettime(unix.CLOCK_REALTIME, &unix.Timespec{Nsec: 2e9}) // invalid: EINVAL
	})
	try("settimeofday", func() error { return unix.Settimeofday(&unix.Timeval{Usec: 2e6}) })
	try("adjtimex", func() error {
		var tx unix.Timex // modes 0: read only
		_, err := unix.Adjtimex(&tx)
		return err
	})
	try("iopl", func() error { return rawErr(unix.Syscall(unix.SYS_IOPL, 4, 0, 0)) }) // level 4: EINVAL
	try("ioperm", func() error { return rawErr(unix.Syscall(unix.SYS_IOPERM, 0x10000, 1, 1)) })
	try("modify_ldt", func() error {
		buf := make([]byte, 16)
		return rawErr(unix.Syscall(unix.SYS_MODIFY_LDT, 0, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf))))
	})
	try("capset regain CAP_SYS_ADMIN", func() error {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return err
		}
		data[0].Permitted |= 1 << unix.CAP_SYS_ADMIN
		data[0].Effective |= 1 << unix.CAP_SYS_ADMIN
		return unix.Capset(&hdr, &data[0])
	})
	_ = unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 0, 0, 0, 0) // the kernel refuses; the bit must stay
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return err
	}
	report["no_new_privs after clearing"] = strconv.Itoa(nnp)
	return jsonOut(report)
}

// jsonOut writes a child's report.
func jsonOut(report map[string]string) error { return json.NewEncoder(os.Stdout).Encode(report) }

// openPty opens a pseudo-terminal pair the way posix_openpt, unlockpt and
// ptsname do.
func openPty() (ptmx, pts *os.File, err error) {
	ptmx, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		ptmx.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetUint32(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		ptmx.Close()
		return nil, nil, err
	}
	pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		ptmx.Close()
		return nil, nil, err
	}
	return ptmx, pts, nil
}

func swapCall(nr uintptr, path string) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	return rawErr(unix.Syscall(nr, uintptr(unsafe.Pointer(p)), 0, 0))
}

// closeFD closes fd if the call that returned it succeeded.
func closeFD(fd int, err error) error {
	if err == nil && fd >= 0 {
		unix.Close(fd)
	}
	return err
}

func rawErr(_, _ uintptr, e unix.Errno) error { return errnoOrNil(e) }

func errnoOrNil(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
