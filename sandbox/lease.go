package sandbox

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"
)

//go:generate go tool mockgen -destination=sandboxmock/provider.go -package=sandboxmock -typed . Provider

// LeaseSpec describes the sandbox to lease. Empty fields take the
// provider's defaults. Validate checks it before anything is sent.
type LeaseSpec struct {
	// Shape is the machine size, for example "s-1vcpu-1gb".
	Shape string `json:"shape,omitempty"`
	// Rootfs names the root filesystem image (a catalog name such as
	// "devbox:1", or a template).
	Rootfs string `json:"rootfs,omitempty"`
	// Region is where the sandbox runs.
	Region string `json:"region,omitempty"`
	// DiskMiB is the disk size; zero means the shape's default.
	DiskMiB int `json:"diskMiB,omitempty"`
	// Egress is the allowlist of outward destinations (see CheckEgress):
	// "*" allows everything, and so does an empty list, as far as the
	// server's own policy allows (sandboxd's default allows nothing);
	// ["none"] asks for nothing (sandboxd [ext], which also reports a
	// lease with nothing in force so, never as the empty list).
	// A session changes it between commands (workflows.UpdateSetEgress).
	Egress []string `json:"egress,omitempty"`
	// IngressEnabled turns on the sandbox's preview URLs: HTTP from
	// outside to its ports (the server's ingress_url_template).
	IngressEnabled bool `json:"ingressEnabled,omitempty"`
	// Env sets variables in every command run in the sandbox. Values are
	// workflow input, stored in history: put secrets in SecretEnv.
	Env map[string]string `json:"env,omitempty"`
	// SecretEnv sets variables whose values are secrets: variable name →
	// secret name. Only the names are stored; the provider resolves the
	// values just before it creates the sandbox, as
	// activities.ExecuteInput.SecretEnv does for a command.
	SecretEnv map[string]string `json:"secretEnv,omitempty"`
	// AutoPauseAfter pauses the sandbox after this long without activity:
	// whole seconds from one minute to a day. Zero leaves it running.
	AutoPauseAfter time.Duration `json:"autoPauseAfter,omitempty"`
	// NamePrefix starts the sandbox's name (lowercase letters, digits and
	// single hyphens, at most MaxNamePrefix characters). Providers whose
	// servers name sandboxes derive the rest of the name from Labels and
	// IdempotencyKey, so that a create whose answer was lost can be found
	// again by name.
	NamePrefix string `json:"namePrefix,omitempty"`
	// Labels are attached to the sandbox so that it can be found again with
	// Provider.ListLeases, for example to sweep the orphans of lost create
	// responses. Providers that do not support labels ignore them.
	Labels map[string]string `json:"labels,omitempty"`
	// IdempotencyKey, when set, makes a repeated create with the same key
	// return the same sandbox instead of a second one, on servers that honour
	// it. Servers that do not simply create another sandbox.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// Limits of a LeaseSpec.
const (
	// MaxNamePrefix is the longest LeaseSpec.NamePrefix.
	MaxNamePrefix = 16
	// MinAutoPause and MaxAutoPause bound a non-zero AutoPauseAfter.
	MinAutoPause = time.Minute
	MaxAutoPause = 24 * time.Hour
)

var namePrefixPattern = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// Validate checks the spec without sending anything. It returns an
// *InvalidInputError naming the first field at fault. Error text never
// contains an environment value.
func (s LeaseSpec) Validate() error {
	for field, value := range map[string]string{"shape": s.Shape, "rootfs": s.Rootfs, "region": s.Region, "idempotencyKey": s.IdempotencyKey} {
		if strings.ContainsFunc(value, isControl) {
			return &InvalidInputError{Field: field, Reason: "must not contain control characters"}
		}
	}
	if s.DiskMiB < 0 {
		return &InvalidInputError{Field: "diskMiB", Reason: "must not be negative"}
	}
	if err := CheckEgress("egress", s.Egress); err != nil {
		return err
	}
	for name, value := range s.Env {
		if !ValidEnvName(name) {
			return &InvalidInputError{Field: "env", Reason: fmt.Sprintf("%q is not a valid variable name", name)}
		}
		if strings.ContainsRune(value, 0) {
			return &InvalidInputError{Field: "env", Reason: fmt.Sprintf("the value of %s contains a NUL byte", name)}
		}
	}
	for name, secret := range s.SecretEnv {
		if !ValidEnvName(name) {
			return &InvalidInputError{Field: "secretEnv", Reason: fmt.Sprintf("%q is not a valid variable name", name)}
		}
		if secret == "" {
			return &InvalidInputError{Field: "secretEnv", Reason: fmt.Sprintf("%s names no secret", name)}
		}
		if _, clash := s.Env[name]; clash {
			return &InvalidInputError{Field: "secretEnv", Reason: fmt.Sprintf("%s is also a plain environment variable", name)}
		}
	}
	if a := s.AutoPauseAfter; a != 0 && (a < MinAutoPause || a > MaxAutoPause || a%time.Second != 0) {
		return &InvalidInputError{Field: "autoPauseAfter", Reason: "must be whole seconds from 1m to 24h, or zero"}
	}
	if s.NamePrefix != "" && (len(s.NamePrefix) > MaxNamePrefix || !namePrefixPattern.MatchString(s.NamePrefix)) {
		return &InvalidInputError{Field: "namePrefix", Reason: fmt.Sprintf("must be at most %d lowercase letters, digits and single inner hyphens", MaxNamePrefix)}
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// CheckEgress returns an *InvalidInputError naming the first rule at fault
// (field[i]) when rules are not egress rules: each is "*" or a host, an IP
// address or a CIDR, each with or without ":port" — non-empty, without
// spaces or control characters. What a rule may name beyond that is the
// server's to decide.
func CheckEgress(field string, rules []string) error {
	for i, rule := range rules {
		if rule == "" || strings.ContainsFunc(rule, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return &InvalidInputError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: "must be \"*\", a host, an IP or a CIDR, with or without :port, without spaces"}
		}
	}
	return nil
}

// ForkSpec describes a fork: a new sandbox whose files start as a copy of
// a paused one's (Provider.ForkLease). Empty fields inherit the source's.
type ForkSpec struct {
	// Egress, when not empty, replaces the source's egress rules in the
	// fork (["*"] allows everything); empty inherits them.
	Egress []string `json:"egress,omitempty"`
	// Labels are attached to the fork, as LeaseSpec.Labels: so that a fork
	// whose answer was lost can be found again, and swept. The source's
	// labels are not inherited (they name the source).
	Labels map[string]string `json:"labels,omitempty"`
}

// Validate checks the spec without sending anything.
func (s ForkSpec) Validate() error {
	return CheckEgress("egress", s.Egress)
}

// LeaseStatus is the lifecycle state of a sandbox as the server reports it.
type LeaseStatus string

// The states of a sandbox (docs/CREATEOS-API.md §2.1). Destroying, Destroyed and
// Failed are terminal: a sandbox in them never runs again.
const (
	StatusCreating LeaseStatus = "creating"
	StatusRunning  LeaseStatus = "running"
	StatusPausing  LeaseStatus = "pausing"
	StatusPaused   LeaseStatus = "paused"
	StatusResuming LeaseStatus = "resuming"
	// StatusForking: a new sandbox being cloned from a paused one.
	StatusForking LeaseStatus = "forking"
	// StatusError: a non-fatal error; a resume may recover it.
	StatusError  LeaseStatus = "error"
	StatusFailed LeaseStatus = "failed"
	// StatusDestroying: the sandbox is being reclaimed; it will read back
	// as destroyed.
	StatusDestroying LeaseStatus = "destroying"
	StatusDestroyed  LeaseStatus = "destroyed"
)

// Known reports whether s is one of the states above.
func (s LeaseStatus) Known() bool {
	switch s {
	case StatusCreating, StatusRunning, StatusPausing, StatusPaused, StatusResuming, StatusForking,
		StatusError, StatusFailed, StatusDestroying, StatusDestroyed:
		return true
	}
	return false
}

// Terminal reports whether a sandbox in this state can never run again.
// Destroying is terminal although it is also transitional: it only ever
// ends in destroyed.
func (s LeaseStatus) Terminal() bool {
	return s == StatusDestroying || s == StatusDestroyed || s == StatusFailed
}

// Transitional reports whether the state will change on its own, so that a
// client waiting for a stable state should poll again.
func (s LeaseStatus) Transitional() bool {
	return s == StatusCreating || s == StatusPausing || s == StatusResuming || s == StatusForking || s == StatusDestroying
}

// Lease is a sandbox held for running commands.
type Lease struct {
	// ID is the provider's sandbox id.
	ID string `json:"id"`
	// Status is the state last observed.
	Status LeaseStatus `json:"status,omitempty"`
	// Workspace is the directory, as the sandbox's processes see it, where
	// commands start and where staged files live. Empty means the
	// provider's default.
	Workspace string `json:"workspace,omitempty"`
	// Labels are the labels the sandbox carries, when the provider reports them.
	Labels map[string]string `json:"labels,omitempty"`
	// Host names the sandbox host the lease lives on, when sandboxes are
	// spread over a fleet of hosts, each with its own sandbox server: the
	// lease exists on that host only, and work on it must go there. Empty
	// when one sandbox service serves every worker (the hosted service, or
	// one sandboxd). Providers leave it empty; whoever knows the host sets
	// it.
	Host string `json:"host,omitempty"`
}

// MaxHostName is the longest host name (Lease.Host).
const MaxHostName = 64

var hostNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// CheckHostName returns an *InvalidInputError naming field when name is
// not a host name: 1 to MaxHostName letters, digits, dots, underscores and
// hyphens, starting with a letter or digit.
func CheckHostName(field, name string) error {
	if len(name) > MaxHostName || !hostNamePattern.MatchString(name) {
		return &InvalidInputError{Field: field, Reason: fmt.Sprintf("must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", MaxHostName)}
	}
	return nil
}

// Provider leases sandboxes and runs commands in them. Implementations must be
// safe for concurrent use.
//
// Errors are context errors or the typed errors of this package (see the
// package documentation); nothing else.
type Provider interface {
	// CreateLease creates a sandbox and returns once it is running and ready
	// for commands. If any setup step fails after the sandbox was created, the
	// sandbox is destroyed before the error is returned; if that cannot be
	// confirmed, the error is a *CleanupError naming the sandbox.
	CreateLease(ctx context.Context, spec LeaseSpec) (Lease, error)
	// GetLease reports a sandbox's current state. A sandbox that no longer
	// exists is a *LeaseGoneError.
	GetLease(ctx context.Context, leaseID string) (Lease, error)
	// DestroyLease destroys a sandbox and every process in it. A sandbox that
	// is already gone is success.
	DestroyLease(ctx context.Context, leaseID string) error
	// ListLeases returns the sandboxes carrying all of the given labels.
	ListLeases(ctx context.Context, labels map[string]string) ([]Lease, error)
	// PauseLease freezes every process of a sandbox; ResumeLease thaws them.
	PauseLease(ctx context.Context, leaseID string) error
	ResumeLease(ctx context.Context, leaseID string) error
	// ForkLease makes a new sandbox whose files start as a copy of a paused
	// sandbox's, and returns it once it runs and is ready for commands;
	// processes are not carried over. The source must be paused: the
	// caller pauses it (PauseLease, then GetLease until it reads paused)
	// and resumes it when it wants it back; a source in any other state is
	// an *InvalidInputError before anything is sent. A fork whose answer
	// never came is looked for (by spec.Labels, or as the one new fork of
	// the source); when it is not found it may still exist, and the error
	// is a *CleanupError with Reason ForkUnconfirmed. As CreateLease, a
	// fork that cannot be made ready is destroyed before the error returns.
	ForkLease(ctx context.Context, sourceID string, spec ForkSpec) (Lease, error)
	// SetEgress replaces a sandbox's egress rules (see LeaseSpec.Egress; an
	// empty list allows everything the server allows). New connections
	// follow them; established ones are left alone.
	SetEgress(ctx context.Context, leaseID string, rules []string) error

	// Execute runs cmd in the lease and follows its output until it exits,
	// its timeout expires or ctx ends. A non-zero exit and a timeout are
	// Results, not errors. obs, if not nil, learns the process as soon as it
	// exists, before the command can run (see Observer.Started), and
	// receives its output as it arrives.
	Execute(ctx context.Context, lease Lease, cmd Command, obs Observer) (Result, error)
	// Attach follows a process that an earlier Execute started (for example in
	// a worker that has since died) from the start of its output, and returns
	// its Result exactly as Execute would have. It never starts the command
	// again. If the server no longer holds the start of the output, Attach
	// waits for the exit status and returns the Result with Truncated set.
	Attach(ctx context.Context, lease Lease, proc Process, obs Observer) (Result, error)
}
