package workflows

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// SessionSnapshot is the input of UpdateSnapshot.
type SessionSnapshot struct {
	// Name is the template's name; empty names it after the session and
	// the Update ("snap-" and 16 hex digits), so that a repeat of the
	// Update finds the template it made.
	Name string `json:"name,omitempty"`

	// refused is set when the input arrived unencrypted at a worker that
	// holds a key ring.
	refused bool
}

// RefusePlaintext makes Validate fail, as Request.RefusePlaintext does.
func (s *SessionSnapshot) RefusePlaintext() { s.refused = true }

// Validate checks the name without sending anything, as the snapshot
// Update's validator does.
func (s SessionSnapshot) Validate() error {
	if s.refused {
		return errPlaintextInput
	}
	if s.Name == "" {
		return nil
	}
	return sandbox.CheckTemplateName("name", s.Name)
}

// snapshotName is the template's name of the snapshot Update in the
// handler's ctx: the one asked for, or one of the session and the Update.
func snapshotName(ctx workflow.Context, in SessionSnapshot) string {
	if in.Name != "" {
		return in.Name
	}
	sum := sha256.Sum256([]byte(workflow.GetInfo(ctx).WorkflowExecution.ID + "\x00" + workflow.GetCurrentUpdateInfo(ctx).ID))
	return "snap-" + hex.EncodeToString(sum[:8])
}

// saveTemplate is the snapshot Update: it keeps the session's lease as a
// template (the SnapshotLease activity), between two commands, as the
// Updates of a session run one at a time. The lease is frozen for the
// copy and left as it was, running or paused; later leases whose Rootfs
// names the template start from its files, /workspace included. A
// session without a lease (no command ran yet, or its lease was just
// given up) has nothing to keep: a SandboxInvalidInput. A lease found
// gone fails the Update; the next command replaces it, as compensation
// has it.
func (s *session) saveTemplate(ctx workflow.Context, name string) (sandbox.Template, error) {
	r := s.r
	if r.lease == nil {
		return sandbox.Template{}, activities.Failure(&sandbox.InvalidInputError{Field: "snapshot",
			Reason: "the session has no lease: run a command first"})
	}
	opts := r.options.snapshotLease
	opts.Summary = fmt.Sprintf("snapshot lease %s as template %s", r.lease.ID, name)
	var template sandbox.Template
	err := executeActivity(ctx, opts, *r.lease, activities.NameSnapshotLease,
		activities.SnapshotLeaseInput{LeaseID: r.lease.ID, Name: name}, &template)
	return template, err
}
