package confine

import (
	"encoding/binary"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// These tests run the assembled filter in x/net/bpf's interpreter, so every
// syscall, architecture and argument can be checked without installing it.

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// mustDeny are the syscalls issue 14 names, refused outright (EPERM).
var mustDeny = []string{
	"mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig",
	"fspick", "mount_setattr", "unshare", "setns", "ptrace", "pidfd_getfd", "process_vm_readv",
	"process_vm_writev", "bpf", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
	"init_module", "finit_module", "delete_module", "perf_event_open", "userfaultfd",
	"open_by_handle_at", "name_to_handle_at", "reboot", "swapon", "swapoff", "acct", "quotactl",
	"lookup_dcookie", "syslog", "iopl", "ioperm", "settimeofday", "clock_settime", "adjtimex",
	"clock_adjtime", "modify_ldt", "vhangup", "nfsservctl", "kcmp", "fanotify_init",
	"io_uring_setup", "io_uring_enter", "io_uring_register", "chroot_not_a_syscall",
}

// mustAllow is a sample of what ordinary root-inside workloads call.
var mustAllow = []string{
	"read", "write", "openat", "openat2", "close", "close_range", "execve", "execveat", "exit_group",
	"wait4", "waitid", "mmap", "mprotect", "munmap", "brk", "futex", "rt_sigaction", "rt_sigprocmask",
	"chown", "fchownat", "lchown", "setuid", "setgid", "setresuid", "setgroups", "capget", "capset",
	"chroot", "mknodat", "bind", "listen", "connect", "accept4", "sendto", "recvfrom", "epoll_pwait",
	"faccessat2", "fchmodat2", "statx", "getrandom", "rseq", "prctl", "seccomp", "pidfd_open",
	"pidfd_send_signal", "memfd_create", "prlimit64", "uname", "kill", "ioctl", "socket", "personality",
	"clone",
}

// seccompData lays out struct seccomp_data for the interpreter, which loads
// words big-endian where the kernel loads them native (little-endian on
// the architectures that matter here): each 32-bit word is written the
// interpreter's way at the offset the kernel's layout gives it.
func seccompData(nr, auditArch uint32, args ...uint64) []byte {
	buf := make([]byte, 64)
	binary.BigEndian.PutUint32(buf[0:], nr)
	binary.BigEndian.PutUint32(buf[4:], auditArch)
	for i, a := range args {
		off := 16 + 8*i
		binary.BigEndian.PutUint32(buf[off:], uint32(a))       // low word first in memory
		binary.BigEndian.PutUint32(buf[off+4:], uint32(a>>32)) // then the high word
	}
	return buf
}

// verdicter runs the stack of programs the way the kernel does: every
// program, newest first, and the most restrictive action wins (the first
// seen among equals).
type verdicter struct {
	t    *testing.T
	vms  []*bpf.VM // in installation order
	info *arch.Info
}

func newVerdicter(t *testing.T, p Policy) verdicter {
	t.Helper()
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the interpreter layout assumes a little-endian machine")
	}
	progs, err := programs(p)
	if err != nil {
		t.Fatal(err)
	}
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	v := verdicter{t: t, info: info}
	for _, prog := range progs {
		if len(prog) > 4096 {
			t.Fatalf("a program has %d instructions; the kernel takes at most 4096", len(prog))
		}
		vm, err := bpf.NewVM(prog)
		if err != nil {
			t.Fatal(err)
		}
		v.vms = append(v.vms, vm)
	}
	return v
}

// run returns the filter's verdict on a raw syscall number.
func (v verdicter) run(nr, auditArch uint32, args ...uint64) uint32 {
	v.t.Helper()
	data := seccompData(nr, auditArch, args...)
	verdict := uint32(unix.SECCOMP_RET_ALLOW)
	for i := len(v.vms) - 1; i >= 0; i-- {
		ret, err := v.vms[i].Run(data)
		if err != nil {
			v.t.Fatal(err)
		}
		if int32(uint32(ret)&unix.SECCOMP_RET_ACTION_FULL) < int32(verdict&unix.SECCOMP_RET_ACTION_FULL) {
			verdict = uint32(ret)
		}
	}
	return verdict
}

// call returns the verdict on the named syscall of the native ABI; ok is
// false if this architecture has no such syscall.
func (v verdicter) call(name string, args ...uint64) (ret uint32, ok bool) {
	nr, ok := v.info.SyscallNames[name]
	if !ok {
		return 0, false
	}
	return v.run(uint32(nr), uint32(v.info.ID), args...), true
}

func TestFilterRefusesTheIssueList(t *testing.T) {
	v := newVerdicter(t, Policy{})
	for _, name := range mustDeny {
		ret, ok := v.call(name)
		if !ok {
			continue // not a syscall here (nfsservctl on arm64, the made-up name)
		}
		if ret != retEPERM {
			t.Errorf("%s: verdict %#x, want EPERM (%#x)", name, ret, retEPERM)
		}
	}
	if ret, _ := v.call("clone3"); ret != retENOSYS {
		t.Errorf("clone3: verdict %#x, want ENOSYS so that libc falls back to clone", ret)
	}
}

func TestFilterAllowsOrdinaryWork(t *testing.T) {
	v := newVerdicter(t, Policy{})
	for _, name := range mustAllow {
		if ret, ok := v.call(name); !ok {
			t.Errorf("%s: not a syscall of %s", name, v.info.Name)
		} else if ret != retAllow {
			t.Errorf("%s: verdict %#x, want allow", name, ret)
		}
	}
}

func TestFilterArguments(t *testing.T) {
	v := newVerdicter(t, Policy{})
	const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID
	cases := []struct {
		what string
		name string
		args []uint64
		want uint32
	}{
		{"fork", "clone", []uint64{uint64(unix.SIGCHLD)}, retAllow},
		{"a thread", "clone", []uint64{threadFlags}, retAllow},
		{"a new user namespace", "clone", []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, retEPERM},
		{"a new mount namespace", "clone", []uint64{unix.CLONE_NEWNS | uint64(unix.SIGCHLD)}, retEPERM},
		{"TIOCSTI", "ioctl", []uint64{0, unix.TIOCSTI}, retEPERM},
		{"TIOCSTI, junk in the upper half", "ioctl", []uint64{0, 0xdeadbeef_00000000 | unix.TIOCSTI}, retEPERM},
		{"TIOCLINUX", "ioctl", []uint64{0, unix.TIOCLINUX}, retEPERM},
		{"TIOCLINUX, all upper bits", "ioctl", []uint64{0, 0xffffffff_00000000 | unix.TIOCLINUX}, retEPERM},
		{"TCGETS", "ioctl", []uint64{0, unix.TCGETS}, retAllow},
		{"TIOCGWINSZ (TIOCSTI's bits and one more)", "ioctl", []uint64{0, unix.TIOCGWINSZ}, retAllow},
		{"FIONREAD (a TIOCSTI bit less)", "ioctl", []uint64{0, unix.TIOCSTI &^ 0x2}, retAllow},
		{"AF_INET", "socket", []uint64{unix.AF_INET}, retAllow},
		{"AF_UNIX", "socket", []uint64{unix.AF_UNIX}, retAllow},
		{"AF_NETLINK", "socket", []uint64{unix.AF_NETLINK}, retAllow},
		{"AF_VSOCK (reaches the host, not namespaced)", "socket", []uint64{unix.AF_VSOCK}, retEPERM},
		{"AF_INET, junk in the upper half", "socket", []uint64{1<<32 | unix.AF_INET}, retEPERM},
		{"personality query", "personality", []uint64{0xffffffff}, retAllow},
		{"personality PER_LINUX", "personality", []uint64{0}, retAllow},
		{"personality ADDR_NO_RANDOMIZE", "personality", []uint64{0x0040000}, retEPERM},
	}
	for _, c := range cases {
		if got, ok := v.call(c.name, c.args...); ok && got != c.want {
			t.Errorf("%s(%s): verdict %#x, want %#x", c.name, c.what, got, c.want)
		}
	}
}

// On amd64 a process can also enter the kernel through the i386 ABI (int
// 0x80) and the x32 ABI (syscall numbers with bit 30 set), each with its
// own numbering: a filter that checked only amd64 numbers would be
// bypassed. Anything not of the native ABI is refused.
func TestFilterRefusesOtherABIs(t *testing.T) {
	v := newVerdicter(t, Policy{})
	if v.info.ID != arch.X86_64.ID {
		t.Skip("the i386 and x32 ABIs exist on amd64 only")
	}
	for nr := uint32(0); nr < 500; nr++ {
		if got := v.run(nr, uint32(arch.I386.ID)); got != retEPERM {
			t.Fatalf("i386 syscall %d: verdict %#x, want EPERM", nr, got)
		}
		if got := v.run(nr|uint32(arch.X32.SeccompMask), uint32(arch.X86_64.ID)); got != retENOSYS {
			t.Fatalf("x32 syscall %d: verdict %#x, want ENOSYS", nr, got)
		}
	}
}

// Syscalls newer than the profile (numbers the tables do not know) are
// refused, like everything else the allow-list does not name.
func TestFilterRefusesUnknownSyscalls(t *testing.T) {
	v := newVerdicter(t, Policy{})
	for _, nr := range []uint32{1000, 0xffff, 0x3fffffff} {
		if got := v.run(nr, uint32(v.info.ID)); got != retEPERM {
			t.Errorf("syscall %d: verdict %#x, want EPERM", nr, got)
		}
	}
}

func TestFilterAllowNestedUserNS(t *testing.T) {
	v := newVerdicter(t, Policy{AllowNestedUserNS: true})
	for _, c := range []struct {
		name string
		args []uint64
		want uint32
	}{
		{"clone", []uint64{unix.CLONE_NEWUSER | unix.CLONE_NEWPID | uint64(unix.SIGCHLD)}, retAllow},
		{"clone3", nil, retAllow},
		{"unshare", []uint64{unix.CLONE_NEWUSER}, retAllow},
		{"setns", nil, retAllow},
		{"mount", nil, retEPERM},
		{"ptrace", nil, retEPERM},
	} {
		if got, _ := v.call(c.name, c.args...); got != c.want {
			t.Errorf("%s with AllowNestedUserNS: verdict %#x, want %#x", c.name, got, c.want)
		}
	}
}

// Docker's profile names syscalls this architecture may not have; the
// translation drops those and must not drop anything else.
func TestDockerProfileTranslates(t *testing.T) {
	pols, err := filters(Policy{})
	if err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for _, g := range pols[0].Syscalls {
		if g.Action == seccomp.ActionAllow {
			allowed += len(g.Names) + len(g.NamesWithCondtions)
		}
	}
	if allowed < 300 {
		t.Fatalf("only %d syscalls allowed: the profile translation lost most of Docker's list", allowed)
	}
}
