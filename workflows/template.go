package workflows

import (
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// templateVersion is the workflow.GetVersion change that added the
// template step. Only a request with a Dockerfile reaches it, and no
// history before it has one; the version marks the step all the same, so
// that a later change to it can branch on it.
const templateVersion = "ensure-template"

// ensureTemplate builds the request's Dockerfile into a template, if it
// has one, and points the run's lease spec at it, so that the first lease
// and every fresh one are created on it. It runs before any lease: a
// build that fails leaves nothing to release. A fleet refuses it.
func (r *run) ensureTemplate(ctx workflow.Context) error {
	if r.req.Dockerfile == "" {
		return nil
	}
	if onFleet(ctx) {
		// Each host keeps its own templates: one built on the placement
		// queue's host would be unknown to the host of the lease.
		return activities.Failure(&sandbox.InvalidInputError{Field: "dockerfile",
			Reason: "a fleet of sandbox hosts builds no templates: each host keeps its own; name an image in lease.rootfs"})
	}
	workflow.GetVersion(ctx, templateVersion, workflow.DefaultVersion, 1)
	r.setPhase(ctx, PhaseBuildingTemplate)
	spec := sandbox.TemplateSpec{Dockerfile: r.req.Dockerfile}
	opts := r.options.ensureTemplate
	opts.Summary = "ensure template " + spec.Name()
	var template sandbox.Template
	if err := executeActivity(ctx, opts, sandbox.Lease{}, activities.NameEnsureTemplate, spec, &template); err != nil {
		return err
	}
	r.req.Lease.Rootfs = template.ID
	return nil
}

// templateOptions are the defaults of EnsureTemplate: those of a lease
// activity, for as long as sandboxd lets a build run (30 minutes); the
// attempt heartbeats its log meanwhile, so a dead worker is noticed and its
// retry follows the same build.
func templateOptions() workflow.ActivityOptions { return leaseOptions(35 * time.Minute) }
