package confine

import (
	"runtime"

	seccomp "github.com/elastic/go-seccomp-bpf"
)

// Apply confines the calling process for good, in this order: it drops
// every capability outside the kept set from the calling thread's bounding,
// ambient, inheritable, permitted and effective sets; sets no_new_privs; and
// installs the seccomp filter on every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC, which also sets no_new_privs on them). None of
// it can be undone.
//
// Apply locks the calling goroutine to its OS thread and leaves it locked,
// because capabilities belong to a thread and execve runs with the calling
// thread's: exec (syscall.Exec), or fork (syscall.ForkExec), from the same
// goroutine that called Apply. The process's other threads keep their
// capabilities until the execve ends them; they are the Go runtime's and
// run no untrusted code.
//
// The confined process must still be able to do what the code before the
// exec needs: Go's runtime (clone without namespace flags, futex, mmap,
// signals) and execve are all allowed. Mount setup must be finished before.
//
// A failure is an *Error naming the step; the process is then partly
// confined and should exit rather than run the command.
func Apply(p Policy) error {
	runtime.LockOSThread() // never unlocked: see above
	pols, err := filters(p)
	if err != nil {
		return &Error{Step: StepSeccomp, Err: err}
	}
	if err := dropCapabilities(); err != nil {
		return &Error{Step: StepCapabilities, Err: err}
	}
	if err := seccomp.SetNoNewPrivs(); err != nil {
		return &Error{Step: StepNoNewPrivs, Err: err}
	}
	if err := installFilters(pols); err != nil {
		return &Error{Step: StepSeccomp, Err: err}
	}
	return nil
}

// installFilters loads pols, in order, on every thread of the process.
func installFilters(pols []seccomp.Policy) error {
	for _, pol := range pols {
		err := seccomp.LoadFilter(seccomp.Filter{
			NoNewPrivs: true,
			Flag:       seccomp.FilterFlagTSync,
			Policy:     pol,
		})
		if err != nil {
			return err
		}
	}
	return nil
}
