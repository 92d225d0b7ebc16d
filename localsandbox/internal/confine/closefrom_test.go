package confine

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func init() {
	children["closefrom-none"] = func() error { return execFDReport(false) }
	children["closefrom-3"] = func() error { return execFDReport(true) }
}

// fdProbe says, in the exec'd shell, whether descriptors 3 and 4 are open.
const fdProbe = `for fd in 3 4; do if { true >&$fd; } 2>/dev/null; then echo "$fd open"; else echo "$fd closed"; fi; done`

func execFDReport(closeFrom bool) error {
	if closeFrom {
		if err := CloseFrom(3); err != nil {
			return err
		}
	}
	return syscall.Exec("/bin/sh", []string{"sh", "-c", fdProbe}, os.Environ())
}

// TestCloseFromClosesInheritedDescriptors: a child inherits descriptors 3
// and 4 (as an init inherits the server's); after CloseFrom(3) the program
// it execs has neither. Without CloseFrom (the control) it has both.
func TestCloseFromClosesInheritedDescriptors(t *testing.T) {
	for role, want := range map[string]string{
		"closefrom-none": "3 open\n4 open\n",
		"closefrom-3":    "3 closed\n4 closed\n",
	} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := child(t, role)
		cmd.ExtraFiles = []*os.File{r, w}
		out, err := cmd.Output()
		r.Close()
		w.Close()
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		if string(out) != want {
			t.Errorf("%s: the exec'd program saw\n%s\nwant\n%s", role, out, want)
		}
	}
}

// TestCloseFromFallback exercises the /proc/self/fd path that kernels
// without close_range take.
func TestCloseFromFallback(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	fd := int(w.Fd())
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	if err := markFromProc(fd); err != nil {
		t.Fatal(err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("descriptor %d is not close-on-exec after the fallback", fd)
	}
}

func TestCloseFromRefusesNegative(t *testing.T) {
	var e *Error
	if err := CloseFrom(-1); !errors.As(err, &e) || e.Step != StepCloseFrom || !errors.Is(err, unix.EBADF) {
		t.Errorf("CloseFrom(-1) = %v, want a close_from *Error wrapping EBADF", err)
	}
}

func init() {
	children["apply-without-setpcap"] = func() error {
		// Lower CAP_SETPCAP from the effective set: the bounding set can
		// then not be changed.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return err
		}
		data[0].Effective &^= 1 << unix.CAP_SETPCAP
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return err
		}
		err := Apply(Policy{})
		var e *Error
		if errors.As(err, &e) && e.Step == StepCapabilities && errors.Is(err, unix.EPERM) {
			return jsonOut(map[string]string{"apply": "capabilities EPERM"})
		}
		return jsonOut(map[string]string{"apply": outcome(err)})
	}
}

// TestApplyFailsTyped: a process that may not drop capabilities from its
// bounding set gets a capabilities *Error, not a half confinement that
// looks whole.
func TestApplyFailsTyped(t *testing.T) {
	requireRoot(t)
	var report map[string]string
	runChild(t, child(t, "apply-without-setpcap"), &report)
	if report["apply"] != "capabilities EPERM" {
		t.Errorf("Apply without CAP_SETPCAP: %q, want a capabilities *Error wrapping EPERM", report["apply"])
	}
}
