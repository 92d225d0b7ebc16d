package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// MaxDockerfileBytes bounds a Dockerfile: the sandbox server's own bound
// (docs/CREATEOS-API.md §3.11), checked before anything is sent, and small
// enough that the Dockerfile can travel in workflow input.
const MaxDockerfileBytes = 64 << 10

// TemplateSpec is what a template is built from: a Dockerfile and, for a
// Dockerfile without FROM, the image or template it builds on (empty: the
// server's default).
type TemplateSpec struct {
	Dockerfile string `json:"dockerfile"`
	Base       string `json:"base,omitempty"`
}

// Validate checks the spec without sending anything: a *InvalidInputError
// naming the field at fault.
func (s TemplateSpec) Validate() error {
	switch {
	case s.Dockerfile == "":
		return &InvalidInputError{Field: "dockerfile", Reason: "is empty"}
	case len(s.Dockerfile) > MaxDockerfileBytes:
		return &InvalidInputError{Field: "dockerfile", Reason: fmt.Sprintf("is %d bytes, more than %d", len(s.Dockerfile), MaxDockerfileBytes)}
	case len(s.Base) > 200:
		return &InvalidInputError{Field: "base", Reason: "is more than 200 bytes"}
	}
	return nil
}

// Name is the template's name, derived from its content: the same
// Dockerfile on the same base is the same template, built once, whoever
// asks and however often ("sf-" and the first 16 hex digits of the
// SHA-256 of base, a NUL and the Dockerfile).
func (s TemplateSpec) Name() string {
	sum := sha256.Sum256([]byte(s.Base + "\x00" + s.Dockerfile))
	return "sf-" + hex.EncodeToString(sum[:8])
}

// Template is a ready template: what a LeaseSpec's Rootfs names.
type Template struct {
	ID   string `json:"templateId"`
	Name string `json:"name"`
	// Host is the sandbox host that keeps the template, on a fleet of
	// hosts (each keeps its own templates), as Lease.Host is a lease's;
	// empty otherwise.
	Host string `json:"host,omitempty"`
}

// TemplateBuilder is the optional part of a Provider that builds templates
// from Dockerfiles. It is separate from Provider so that a provider
// without templates (and the generated mock of Provider) stays one.
type TemplateBuilder interface {
	// EnsureTemplate returns the ready template of spec (by spec.Name()),
	// building it first if no template has that name: idempotent, so two
	// callers racing, or a retry after a worker's death, share one build.
	// While the build runs, each line of its log goes to onLog (which may
	// be nil). A build that fails, now or before, is a
	// *TemplateBuildError; a spec that is not valid a *InvalidInputError.
	EnsureTemplate(ctx context.Context, spec TemplateSpec, onLog func(line string)) (Template, error)
}

// TemplateBuildError means a template's build failed: the Dockerfile is
// at fault (a RUN that failed, an instruction not supported), so building
// it again fails the same way, and the error is not retryable. LogTail is
// the end of the build's log, which says why.
type TemplateBuildError struct {
	TemplateID string
	Name       string
	LogTail    string
}

func (e *TemplateBuildError) Error() string {
	msg := fmt.Sprintf("template %s (%s): the build failed", e.Name, e.TemplateID)
	if e.LogTail != "" {
		msg += "; the end of its log:\n" + e.LogTail
	}
	return msg
}

// LeaseSnapshotter is the optional part of a Provider that keeps a live
// lease as a template: later leases whose Rootfs names it start from its
// files. Separate from Provider and TemplateBuilder so that a provider
// without it (the hosted service, the generated mock) stays one.
type LeaseSnapshotter interface {
	// SnapshotLease keeps the lease leaseID (running or paused; it is
	// frozen for the copy and left as it was) as the ready template
	// name. Idempotent by name: a template of that name made from the
	// same lease is returned, not made again; one made otherwise is a
	// *InvalidInputError naming "name". A lease that is gone is a
	// *LeaseGoneError.
	SnapshotLease(ctx context.Context, leaseID, name string) (Template, error)
}

// CheckTemplateName checks a template's name: 1 to 63 characters of A-Z,
// a-z, 0-9, '_' or '-', first a letter or digit (a path segment and a
// rootfs, with no ':' so that no image's name is ever one), neither
// "host" (the host image's rootfs) nor starting with "tpl-" (the
// server's ids). sandboxd checks names with it too: one rule. It returns
// a *InvalidInputError naming field.
func CheckTemplateName(field, name string) error {
	if !templateNamePattern.MatchString(name) || strings.HasPrefix(name, "tpl-") || name == "host" {
		return &InvalidInputError{Field: field, Reason: "must be 1 to 63 characters of A-Z, a-z, 0-9, '_' or '-', starting with a letter or digit, neither \"host\" nor starting with \"tpl-\""}
	}
	return nil
}

var templateNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)
