package workflows

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// DefaultMaxFreshLeases is how many fresh leases a run may take when
// Request.MaxFreshLeases is zero.
const DefaultMaxFreshLeases = 2

// Request is the input of RunCommand (and of Run).
type Request struct {
	// Command is what to run. It is workflow input, so it is stored in
	// history: its sizes are bounded (sandbox.MaxArgvEnvBytes,
	// MaxStdinBytes), and so is the whole request's JSON
	// (sandbox.MaxPayloadBytes); Validate checks them all. Put secrets in
	// SecretEnv, not in Env or Argv.
	Command sandbox.Command `json:"command"`
	// SecretEnv adds environment variables whose values are secrets:
	// variable name → secret name. Only the names enter workflow history;
	// the worker resolves the values (see activities.Secrets).
	SecretEnv map[string]string `json:"secretEnv,omitempty"`
	// Lease describes the sandbox to create, and every fresh one.
	Lease sandbox.LeaseSpec `json:"lease,omitzero"`
	// Image holds Dockerfile, an image of the run's own.
	Image
	// LeaseID, when set, runs the command on this existing lease instead of
	// creating one. If that lease turns out to be unusable, compensation
	// replaces it with a fresh lease made from Lease, like any other.
	LeaseID string `json:"leaseId,omitempty"`
	// LeaseHost is the host of LeaseID when sandboxes are spread over a
	// fleet of hosts (Result.LeaseHost of the run that kept the lease);
	// there, a LeaseID without it fails as SandboxInvalidInput. Leave it
	// empty otherwise.
	LeaseHost string `json:"leaseHost,omitempty"`
	// MaxFreshLeases bounds compensation: how many fresh leases the
	// command may take to replace an unusable one. Zero means
	// DefaultMaxFreshLeases; a negative value disables compensation.
	MaxFreshLeases int `json:"maxFreshLeases,omitempty"`
	// KeepLease leaves the lease the command ran on alive at the end (the
	// caller then owns it). Orphans are still swept.
	KeepLease bool `json:"keepLease,omitempty"`
	// ActivityOptions overrides the documented defaults of the activities.
	ActivityOptions *ActivityOverrides `json:"activityOptions,omitempty"`

	// decodeErr is why the JSON of the request could not be decoded.
	decodeErr error
}

// UnmarshalJSON decodes a request, its durations given as integer
// nanoseconds or as Go duration strings ("10s"; sandbox.JSONDuration). It
// never fails: a field of the wrong shape is kept as the request's decode
// error, which Validate returns as SandboxInvalidInput naming the field, so
// that a workflow given such input fails typed before a lease is created
// (a decoding error would fail it as an untyped wrapError).
func (r *Request) UnmarshalJSON(b []byte) error {
	type plain Request
	r.decodeErr = sandbox.DecodeError(json.Unmarshal(b, (*plain)(r)))
	return nil
}

// RefusePlaintext makes Validate fail: the request arrived unencrypted at
// a worker that holds a key ring (codec.PlaintextRefuser).
func (r *Request) RefusePlaintext() { r.decodeErr = errPlaintextInput }

// errPlaintextInput is how an input refused by codec.PlaintextRefuser
// fails. It names the input as a whole, as sandbox.DecodeError does for an
// input that is no JSON object, and the way out.
var errPlaintextInput = &sandbox.InvalidInputError{Field: "input",
	Reason: "plaintext input: this worker holds encryption keys and takes only encrypted input (encrypt it with the namespace's codec, or start the worker with --allow-plaintext-input)"}

// Validate checks the request without running anything. It returns an
// *sandbox.InvalidInputError naming the first field at fault by its JSON
// path ("command.argv", "lease.autoPauseAfter").
func (r Request) Validate() error {
	if r.decodeErr != nil {
		return r.decodeErr
	}
	if err := r.Command.Validate(); err != nil {
		return inField("command", err)
	}
	if err := r.Lease.Validate(); err != nil {
		return inField("lease", err)
	}
	if err := checkLease(r.LeaseID, r.LeaseHost); err != nil {
		return err
	}
	if err := r.Image.check(r.Lease); err != nil {
		return err
	}
	for variable, secret := range r.SecretEnv {
		if !sandbox.ValidEnvName(variable) {
			return &sandbox.InvalidInputError{Field: "secretEnv", Reason: fmt.Sprintf("%q is not a valid variable name", variable)}
		}
		if secret == "" {
			return &sandbox.InvalidInputError{Field: "secretEnv", Reason: fmt.Sprintf("%s names no secret", variable)}
		}
		if _, clash := r.Command.Env[variable]; clash {
			return &sandbox.InvalidInputError{Field: "secretEnv", Reason: fmt.Sprintf("%s is also a plain environment variable", variable)}
		}
	}
	// The request is workflow input (or an execute Update's argument) and
	// Execute's input: one payload each, so it must fit one.
	return sandbox.CheckPayloadSize("request", r)
}

func (r Request) maxFreshLeases() int {
	switch {
	case r.MaxFreshLeases == 0:
		return DefaultMaxFreshLeases
	case r.MaxFreshLeases < 0:
		return 0
	}
	return r.MaxFreshLeases
}

// Result is what RunCommand returns: the command's Result, and which lease
// it ran on.
type Result struct {
	sandbox.Result
	// LeaseID is the lease the command ran on (destroyed by now unless
	// Request.KeepLease).
	LeaseID string `json:"leaseId"`
	// LeaseHost is the host LeaseID lived on, on a fleet of sandbox hosts.
	LeaseHost string `json:"leaseHost,omitempty"`
	// FreshLeases counts the fresh leases taken to replace an unusable
	// one (compensation).
	FreshLeases int `json:"freshLeases"`
	// DestroyedLeases lists every lease the run destroyed, in order.
	DestroyedLeases []string `json:"destroyedLeases,omitempty"`
	// LostLeases lists the leases the run gave up with their lost host,
	// without destroying them: the host sweeps them when it returns.
	LostLeases []string `json:"lostLeases,omitempty"`
}

// inField names the field of an *sandbox.InvalidInputError found inside
// the JSON object at path by its path from the input's top, as a caller in
// any language sees the input: "command" and "argv" make "command.argv".
func inField(path string, err error) error {
	var invalid *sandbox.InvalidInputError
	if !errors.As(err, &invalid) {
		return err
	}
	return &sandbox.InvalidInputError{Field: path + "." + invalid.Field, Reason: invalid.Reason}
}

// checkLease checks an existing lease named by a request, if any.
func checkLease(id, host string) error {
	switch {
	case id != "":
		if err := sandbox.CheckID("leaseId", id); err != nil {
			return err
		}
	case host != "":
		return &sandbox.InvalidInputError{Field: "leaseHost", Reason: "names the host of leaseId, which is empty"}
	}
	if host != "" {
		return sandbox.CheckHostName("leaseHost", host)
	}
	return nil
}
