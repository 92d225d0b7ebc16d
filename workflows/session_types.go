package workflows

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// SessionWorkflowName is the registered name of SessionWorkflow.
const SessionWorkflowName = "sandboxflow.Session"

// The Updates and the query a session answers.
const (
	// UpdateExecute runs one command: SessionCommand in, SessionResult out.
	UpdateExecute = "execute"
	// UpdatePause pauses the session's lease; UpdateResume resumes it. Both
	// return the SessionState. A command resumes a paused lease by itself.
	UpdatePause  = "pause"
	UpdateResume = "resume"
	// UpdateClose runs the commands already queued, destroys the lease and
	// ends the session: it returns the SessionSummary.
	UpdateClose = "close"
	// UpdateFork forks the session's lease into a new session: it returns
	// the SessionFork. The lease is paused for the fork and stays paused
	// (the next command resumes it).
	UpdateFork = "fork"
	// UpdateSnapshot keeps the session's lease as a template that later
	// leases start from: SessionSnapshot in, sandbox.Template
	// ({"templateId", "name"}) out. The lease is left running or paused
	// as it was.
	UpdateSnapshot = "snapshot"
	// UpdateSetEgress replaces the egress rules of the session's lease and
	// of every lease it takes later: SessionEgress in, SessionState out.
	UpdateSetEgress = "set_egress"
	// The session answers StateQuery with its SessionState.
)

// Defaults of a SessionRequest's zero fields.
const (
	// DefaultIdleTimeout is how long a session's lease may stay idle
	// before the session pauses it.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultCommandsPerRun is how many commands a session runs before it
	// continues as new, carrying its lease, so that its history stays
	// small. It also continues as new when Temporal suggests it.
	DefaultCommandsPerRun = 200
	// DefaultRememberedUpdates is how many answered execute and fork
	// Updates a session remembers across continue-as-new (see
	// SessionRequest.RememberedUpdates).
	DefaultRememberedUpdates = 32
	// MaxRememberedUpdates bounds SessionRequest.RememberedUpdates: the
	// answers travel in the continue-as-new input, one Temporal payload.
	MaxRememberedUpdates = 1000
)

// TypeSessionClosed is the error type with which a closing or closed
// session rejects an Update.
const TypeSessionClosed = sandbox.TypeSessionClosed

// SessionRequest is the input of SessionWorkflow.
type SessionRequest struct {
	// Lease describes the sandbox to create, and every fresh one.
	Lease sandbox.LeaseSpec `json:"lease,omitzero"`
	// Image holds Dockerfile, an image of the session's own, built
	// before the session takes its first lease, as in Request; a
	// session continued as new carries the template instead.
	Image
	// LeaseID, when set, starts the session on this existing lease instead
	// of creating one. The session owns it from then on: it is destroyed
	// when the session closes.
	LeaseID string `json:"leaseId,omitempty"`
	// LeaseHost is the host of LeaseID on a fleet of sandbox hosts, as in
	// Request.
	LeaseHost string `json:"leaseHost,omitempty"`
	// MaxFreshLeases bounds the compensation of each command, as in
	// Request.
	MaxFreshLeases int `json:"maxFreshLeases,omitempty"`
	// IdleTimeout: a lease with no command for this long is paused, and
	// resumed by the next command. Zero means DefaultIdleTimeout; negative
	// never pauses.
	IdleTimeout time.Duration `json:"idleTimeout,omitempty"`
	// CommandsPerRun: the session continues as new after this many
	// commands. Zero means DefaultCommandsPerRun.
	CommandsPerRun int `json:"commandsPerRun,omitempty"`
	// RememberedUpdates is how many of its last answered execute and fork
	// Updates the session remembers, by Update id, across continue-as-new,
	// so that a repeat of one (an UpdateSession activity retried after its
	// worker died) gets the recorded answer instead of running again. A
	// repeat of an older Update runs its command again. Their output is
	// kept up to 256 KiB in all, the oldest dropped first (Truncated).
	// Zero means DefaultRememberedUpdates; at most MaxRememberedUpdates.
	RememberedUpdates int `json:"rememberedUpdates,omitempty"`
	// ActivityOptions overrides the documented defaults of the activities.
	ActivityOptions *ActivityOverrides `json:"activityOptions,omitempty"`

	// Carried is what a session hands to its next run when it continues
	// as new. Leave it nil.
	Carried *SessionCarried `json:"carried,omitempty"`

	// decodeErr is why the JSON of the request could not be decoded.
	decodeErr error
}

// UnmarshalJSON decodes a request as Request.UnmarshalJSON does: durations
// as integer nanoseconds or Go duration strings, and a field of the wrong
// shape kept for Validate, never failing the decoding.
func (r *SessionRequest) UnmarshalJSON(b []byte) error {
	type plain SessionRequest
	aux := struct {
		*plain
		IdleTimeout *sandbox.JSONDuration `json:"idleTimeout,omitempty"`
	}{plain: (*plain)(r), IdleTimeout: (*sandbox.JSONDuration)(&r.IdleTimeout)}
	r.decodeErr = sandbox.DecodeError(json.Unmarshal(b, &aux))
	return nil
}

// RefusePlaintext makes Validate fail, as Request.RefusePlaintext does.
func (r *SessionRequest) RefusePlaintext() { r.decodeErr = errPlaintextInput }

// SessionCarried is the state a session carries across continue-as-new.
type SessionCarried struct {
	RunKey         string         `json:"runKey"`
	Lease          *sandbox.Lease `json:"lease,omitempty"`
	Paused         bool           `json:"paused,omitempty"`
	HadLease       bool           `json:"hadLease,omitempty"`
	NextGeneration int            `json:"nextGeneration"`
	Commands       int            `json:"commands"`
	FreshLeases    int            `json:"freshLeases"`
	// DestroyedLeases keeps the last few leases destroyed, for the state.
	DestroyedLeases []string `json:"destroyedLeases,omitempty"`
	// LostLeases keeps the last few leases left to their lost hosts.
	LostLeases []string `json:"lostLeases,omitempty"`
	// TemplateHost is the host that keeps the template of the session's
	// leases (Image), on a fleet of sandbox hosts.
	TemplateHost string `json:"templateHost,omitempty"`
	// Answered are the last execute Updates answered, so that a repeat
	// of one on the next run gets its answer instead of running again.
	Answered []AnsweredUpdate `json:"answered,omitempty"`
}

// Validate checks the request without running anything.
func (r SessionRequest) Validate() error {
	if r.decodeErr != nil {
		return r.decodeErr
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
	if r.CommandsPerRun < 0 {
		return &sandbox.InvalidInputError{Field: "commandsPerRun", Reason: "must not be negative"}
	}
	if r.RememberedUpdates < 0 || r.RememberedUpdates > MaxRememberedUpdates {
		return &sandbox.InvalidInputError{Field: "rememberedUpdates", Reason: fmt.Sprintf("must be 0 (the default, %d) to %d", DefaultRememberedUpdates, MaxRememberedUpdates)}
	}
	return nil
}

func (r SessionRequest) rememberedUpdates() int {
	if r.RememberedUpdates == 0 {
		return DefaultRememberedUpdates
	}
	return r.RememberedUpdates
}

func (r SessionRequest) idleTimeout() time.Duration {
	if r.IdleTimeout == 0 {
		return DefaultIdleTimeout
	}
	return r.IdleTimeout
}

func (r SessionRequest) commandsPerRun() int {
	if r.CommandsPerRun == 0 {
		return DefaultCommandsPerRun
	}
	return r.CommandsPerRun
}

// SessionCommand is the input of UpdateExecute: a command and its secret
// environment, as in Request.
type SessionCommand struct {
	Command   sandbox.Command   `json:"command"`
	SecretEnv map[string]string `json:"secretEnv,omitempty"`

	// decodeErr is why the JSON of the command could not be decoded.
	decodeErr error
}

// UnmarshalJSON decodes the command as Request.UnmarshalJSON does, never
// failing: a field of the wrong shape is kept for Validate.
func (c *SessionCommand) UnmarshalJSON(b []byte) error {
	type plain SessionCommand
	c.decodeErr = sandbox.DecodeError(json.Unmarshal(b, (*plain)(c)))
	return nil
}

// RefusePlaintext makes Validate fail, as Request.RefusePlaintext does.
func (c *SessionCommand) RefusePlaintext() { c.decodeErr = errPlaintextInput }

// Validate checks the command without running anything, as the execute
// Update's validator does: a command it rejects never enters history.
func (c SessionCommand) Validate() error {
	if c.decodeErr != nil {
		return c.decodeErr
	}
	return Request{Command: c.Command, SecretEnv: c.SecretEnv}.Validate()
}

// SessionResult is the outcome of one command of a session.
type SessionResult struct {
	sandbox.Result
	// Seq numbers the session's commands: 1, 2, 3…
	Seq int `json:"seq"`
	// LeaseID is the lease the command ran on.
	LeaseID string `json:"leaseId"`
	// WorkspaceReset is set when the command did not run on the lease of
	// the commands before it: that lease was unusable and was replaced,
	// so the files earlier commands left in the workspace are gone.
	WorkspaceReset bool `json:"workspaceReset,omitempty"`
	// FreshLeases counts the leases this command took to replace an
	// unusable one.
	FreshLeases int `json:"freshLeases,omitempty"`
}

// SessionState is the answer to StateQuery, and what the pause, resume
// and set_egress Updates return.
type SessionState struct {
	State
	// Paused is set while the lease is paused.
	Paused bool `json:"paused,omitempty"`
	// Egress is the session's egress rules (LeaseSpec.Egress), as the last
	// set_egress left them.
	Egress []string `json:"egress,omitempty"`
	// Commands counts the commands run so far, across continue-as-new.
	Commands int `json:"commands"`
	// Queued counts the Updates waiting for their turn.
	Queued int `json:"queued,omitempty"`
}

// SessionEgress is the input of UpdateSetEgress.
type SessionEgress struct {
	// Egress replaces the rules (sandbox.LeaseSpec.Egress): "*" or empty
	// allows everything the sandbox server allows.
	Egress []string `json:"egress"`

	// refused is set when the rules arrived unencrypted at a worker that
	// holds a key ring.
	refused bool
}

// RefusePlaintext makes Validate fail, as Request.RefusePlaintext does.
func (e *SessionEgress) RefusePlaintext() { e.refused = true }

// Validate checks the rules without sending anything, as the set_egress
// Update's validator does.
func (e SessionEgress) Validate() error {
	if e.refused {
		return errPlaintextInput
	}
	return sandbox.CheckEgress("egress", e.Egress)
}

// SessionFork is what UpdateFork returns: the new session.
type SessionFork struct {
	// SessionID is the new session's workflow id: the parent session's id
	// with a "/fork-…" suffix.
	SessionID string `json:"sessionId"`
	// LeaseID is the new session's lease, a fork of the session's. It is
	// empty when the session had no lease to fork (no command had run, or
	// its lease had just been given up): the new session then starts
	// without one, with an empty workspace, as the session's own next
	// command would.
	LeaseID string `json:"leaseId,omitempty"`
}

// PhaseForking is the phase of a session while it forks its lease.
const PhaseForking Phase = "forking"

// SessionSummary is what a closed session returns, and what the close
// Update returns.
type SessionSummary struct {
	Commands    int `json:"commands"`
	FreshLeases int `json:"freshLeases"`
	// DestroyedLeases lists the last leases destroyed, the final one
	// included.
	DestroyedLeases []string `json:"destroyedLeases,omitempty"`
}
