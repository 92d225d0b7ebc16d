package sandbox

import "context"

//go:generate go tool mockgen -destination=sandboxmock/provider.go -package=sandboxmock -typed . Provider

// LeaseSpec describes the sandbox to lease. Empty fields take the
// provider's defaults.
type LeaseSpec struct {
	// Shape is the machine size, for example "s-1vcpu-1gb".
	Shape string `json:"shape,omitempty"`
	// Rootfs names the root filesystem image.
	Rootfs string `json:"rootfs,omitempty"`
	// Region is where the sandbox runs.
	Region string `json:"region,omitempty"`
	// Labels are attached to the sandbox so that it can be found again with
	// Provider.ListLeases, for example to sweep the orphans of lost create
	// responses. Providers that do not support labels ignore them.
	Labels map[string]string `json:"labels,omitempty"`
	// IdempotencyKey, when set, makes a repeated create with the same key
	// return the same sandbox instead of a second one, on servers that honour
	// it. Servers that do not simply create another sandbox.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// LeaseStatus is the lifecycle state of a sandbox as the server reports it.
type LeaseStatus string

// The states of a sandbox. Destroyed and Failed are terminal.
const (
	StatusCreating  LeaseStatus = "creating"
	StatusRunning   LeaseStatus = "running"
	StatusPausing   LeaseStatus = "pausing"
	StatusPaused    LeaseStatus = "paused"
	StatusResuming  LeaseStatus = "resuming"
	StatusError     LeaseStatus = "error"
	StatusDestroyed LeaseStatus = "destroyed"
	StatusFailed    LeaseStatus = "failed"
)

// Terminal reports whether a sandbox in this state can never run again.
func (s LeaseStatus) Terminal() bool { return s == StatusDestroyed || s == StatusFailed }

// Transitional reports whether the state will change on its own, so that a
// client waiting for a stable state should poll again.
func (s LeaseStatus) Transitional() bool {
	return s == StatusCreating || s == StatusPausing || s == StatusResuming
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

	// Execute runs cmd in the lease and follows its output until it exits,
	// its timeout expires or ctx ends. A non-zero exit and a timeout are
	// Results, not errors. obs, if not nil, learns the process as soon as it
	// exists and receives its output as it arrives.
	Execute(ctx context.Context, lease Lease, cmd Command, obs Observer) (Result, error)
	// Attach follows a process that an earlier Execute started (for example in
	// a worker that has since died) from the start of its output, and returns
	// its Result exactly as Execute would have. It never starts the command
	// again. If the server no longer holds the start of the output, Attach
	// waits for the exit status and returns the Result with Truncated set.
	Attach(ctx context.Context, lease Lease, proc Process, obs Observer) (Result, error)
}
