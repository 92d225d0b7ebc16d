package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

// templateVersion is the workflow.GetVersion change that added the
// template step. Only a request with a Dockerfile reaches it, and no
// history before it has one; the version marks the step all the same, so
// that a later change to it can branch on it.
const templateVersion = "ensure-template"

// Image is where the leases of a run or a session get their root
// filesystem, besides an image named in Lease.Rootfs: Request and
// SessionRequest embed it, so that both take the same fields, checked and
// built the same way.
type Image struct {
	// Dockerfile, when set, is built into a template before the first
	// lease (activities.NameEnsureTemplate), once per content: every
	// lease is created on it (its Lease.Rootfs is the template's id), so
	// Lease.Rootfs must be empty. At most sandbox.MaxDockerfileBytes; its
	// FROM names the image it builds on. On a fleet of sandbox hosts the
	// template is built on one host, and every lease is created on that
	// host.
	Dockerfile string `json:"dockerfile,omitempty"`
}

// check checks the Dockerfile, when set, with lease, whose image it
// names, before any activity.
func (i Image) check(lease sandbox.LeaseSpec) error {
	if i.Dockerfile == "" {
		return nil
	}
	if lease.Rootfs != "" {
		return &sandbox.InvalidInputError{Field: "dockerfile", Reason: "names the image of the lease, as lease.rootfs does: set one of them"}
	}
	return sandbox.TemplateSpec{Dockerfile: i.Dockerfile}.Validate()
}

// ensureTemplate builds the request's Dockerfile into a template, if it
// has one, and points the run's lease spec at it, so that the first lease
// and every fresh one are created on it — on a fleet, on the host that
// keeps it (run.templateHost). It runs before any lease is created: a
// build that fails fails the run, releasing only a lease it was given
// (LeaseID), as any failed run does.
func (r *run) ensureTemplate(ctx workflow.Context) (sandbox.Template, error) {
	if r.req.Dockerfile == "" {
		return sandbox.Template{}, nil
	}
	workflow.GetVersion(ctx, templateVersion, workflow.DefaultVersion, 1)
	r.setPhase(ctx, PhaseBuildingTemplate)
	spec := sandbox.TemplateSpec{Dockerfile: r.req.Dockerfile}
	opts := r.options.ensureTemplate
	opts.Summary = "ensure template " + spec.Name()
	var template sandbox.Template
	if err := executeActivity(ctx, opts, sandbox.Lease{}, activities.NameEnsureTemplate, spec, &template); err != nil {
		if r.lease != nil {
			if cleanupErr := r.release(ctx); cleanupErr != nil {
				workflow.GetLogger(ctx).Warn("releasing the given lease failed", "lease", r.lease.ID, "error", cleanupErr)
			}
		}
		if temporal.IsCanceledError(err) {
			r.setPhase(ctx, PhaseCanceled)
		} else {
			r.setPhase(ctx, PhaseFailed)
		}
		return sandbox.Template{}, err
	}
	r.req.Lease.Rootfs, r.req.Dockerfile = template.ID, ""
	r.templateHost = template.Host
	return template, nil
}

// templateOptions are the defaults of EnsureTemplate: those of a lease
// activity, for as long as sandboxd lets a build run (30 minutes); the
// attempt heartbeats its log meanwhile, so a dead worker is noticed and its
// retry follows the same build.
func templateOptions() workflow.ActivityOptions { return leaseOptions(35 * time.Minute) }
