package confine

import "fmt"

// Policy says what a confined command may do beyond the defaults. The zero
// Policy is the strict one.
type Policy struct {
	// AllowNestedUserNS lets the command create namespaces of its own
	// (unshare, setns, clone and clone3 with namespace flags): what
	// Chromium's sandbox, bubblewrap-style tools and `unshare -r` need.
	// A nested user namespace grants capabilities only over itself, and
	// mount stays refused by the filter.
	AllowNestedUserNS bool
}

// Step names the part of Apply (or CloseFrom) that failed.
type Step string

const (
	StepCapabilities Step = "capabilities" // dropping the bounding, ambient, inheritable, permitted sets
	StepNoNewPrivs   Step = "no_new_privs" // prctl(PR_SET_NO_NEW_PRIVS)
	StepSeccomp      Step = "seccomp"      // building or installing the filter
	StepCloseFrom    Step = "close_from"   // marking descriptors close-on-exec
)

// Error is why Apply or CloseFrom failed.
type Error struct {
	Step Step
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("confine: %s: %v", e.Step, e.Err) }
func (e *Error) Unwrap() error { return e.Err }
