//go:build !linux

package confine

import "errors"

// errUnsupported: confinement is built from Linux capabilities and seccomp.
var errUnsupported = errors.New("not supported on this operating system")

// Apply fails: confinement needs Linux.
func Apply(Policy) error { return &Error{Step: StepSeccomp, Err: errUnsupported} }

// CloseFrom fails: it is only needed (and only built) on Linux.
func CloseFrom(int) error { return &Error{Step: StepCloseFrom, Err: errUnsupported} }
