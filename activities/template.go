package activities

import (
	"context"
	"sync"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// NameEnsureTemplate is the activity that builds a request's Dockerfile
// into a template (RunCommand's step before CreateLease).
const NameEnsureTemplate = "sandboxflow.EnsureTemplate"

// TemplateProgress is what EnsureTemplate heartbeats while a build runs:
// the template's name and the end of its build log, for whoever shows it
// live (the starter, the Web UI's pending activity). Lines end in "\n".
type TemplateProgress struct {
	Name string     `json:"name"`
	Log  OutputTail `json:"log,omitzero"`
}

// EnsureTemplate returns the ready template of spec, building it first
// unless a template of the same content exists (sandbox.TemplateBuilder):
// a retry after a worker's death finds the build by its name and follows
// it, never starting a second. It heartbeats TemplateProgress as the log
// grows. A failed build is a non-retryable SandboxTemplateBuildFailed
// whose details carry the end of the log; a provider that builds no
// templates is SandboxInvalidInput.
func (a *Activities) EnsureTemplate(ctx context.Context, spec sandbox.TemplateSpec) (sandbox.Template, error) {
	builder, ok := a.Provider.(sandbox.TemplateBuilder)
	if !ok {
		return sandbox.Template{}, classify(&sandbox.InvalidInputError{Field: "dockerfile",
			Reason: "this worker's sandbox provider builds no templates; name an image in lease.rootfs instead"})
	}
	if err := spec.Validate(); err != nil {
		return sandbox.Template{}, classify(err)
	}
	var mu sync.Mutex
	progress := TemplateProgress{Name: spec.Name()}
	stop, nudge, _ := a.keepBeating(ctx, func() any {
		mu.Lock()
		defer mu.Unlock()
		return progress
	})
	defer stop()
	template, err := builder.EnsureTemplate(ctx, spec, func(line string) {
		mu.Lock()
		progress.Log.append(line + "\n")
		mu.Unlock()
		nudge()
	})
	if err != nil {
		return sandbox.Template{}, fail(ctx, err)
	}
	template.Host = a.Host // on a fleet, only this host has it
	return template, nil
}

// NameSnapshotLease is the activity that keeps a session's lease as a
// template (the session's snapshot Update).
const NameSnapshotLease = "sandboxflow.SnapshotLease"

// SnapshotLeaseInput asks for a template of a live lease.
type SnapshotLeaseInput struct {
	LeaseID string `json:"leaseId"`
	// Name is the template's name; the same name for the same lease
	// returns the template made before (a retry whose answer was lost).
	Name string `json:"name"`
}

// SnapshotLease keeps the lease as the ready template in.Name
// (sandbox.LeaseSnapshotter); the lease is left running or paused as it
// was. A provider that keeps no leases as templates is a non-retryable
// SandboxInvalidInput, a lease that is gone a SandboxLeaseGone.
func (a *Activities) SnapshotLease(ctx context.Context, in SnapshotLeaseInput) (sandbox.Template, error) {
	snapshotter, ok := a.Provider.(sandbox.LeaseSnapshotter)
	if !ok {
		return sandbox.Template{}, classify(&sandbox.InvalidInputError{Field: "snapshot",
			Reason: "this worker's sandbox provider keeps no leases as templates"})
	}
	if err := sandbox.CheckID("leaseId", in.LeaseID); err != nil {
		return sandbox.Template{}, classify(err)
	}
	if err := sandbox.CheckTemplateName("name", in.Name); err != nil {
		return sandbox.Template{}, classify(err)
	}
	stop := a.keepHeartbeating(ctx, nil)
	defer stop()
	template, err := snapshotter.SnapshotLease(ctx, in.LeaseID, in.Name)
	if err != nil {
		return sandbox.Template{}, fail(ctx, err)
	}
	template.Host = a.Host // the lease's, which keeps it
	return template, nil
}
