package workflows

import (
	"fmt"
	"strings"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// StateQuery is the query that RunCommand answers with its State.
const StateQuery = "state"

// UpdateResult is the Update that RunCommand answers with the command's
// Result as soon as the command has ended, before the lease is released
// (see sandboxclient.CommandResult). It takes no argument; sent before the command has
// ended, it waits for it. A run that fails before the command ends
// answers it with its failure.
const UpdateResult = "result"

// ResultUpdateID is the Update id to send UpdateResult with, from any
// client in any language: the server keeps one Update per id and run, so
// asking again adds nothing to the run's history and gets the same answer.
const ResultUpdateID = "sandboxflow-result"

// Keyword search attributes that RunCommand keeps current when the
// namespace has them registered (see RunCommand).
const (
	SearchAttributeLeaseID = "SandboxLeaseID"
	SearchAttributePhase   = "SandboxPhase"
)

// Phase is where a run is.
type Phase string

const (
	// PhaseBuildingTemplate: the request's Dockerfile is built into the
	// template its leases run on (Request.Dockerfile).
	PhaseBuildingTemplate Phase = "building-template"
	PhaseCreatingLease    Phase = "creating-lease"
	PhaseExecuting        Phase = "executing"
	PhaseCompensating     Phase = "compensating"
	PhaseCleaningUp       Phase = "cleaning-up"
	PhaseCompleted        Phase = "completed"
	PhaseFailed           Phase = "failed"
	PhaseCanceled         Phase = "canceled"

	// The phases of a session between and around its commands.
	PhaseIdle     Phase = "idle"
	PhasePausing  Phase = "pausing"
	PhasePaused   Phase = "paused"
	PhaseResuming Phase = "resuming"
	PhaseClosed   Phase = "closed"
)

// State is what a run has done so far: the answer to StateQuery, and what
// the Web UI shows as the workflow's current details.
type State struct {
	Phase Phase `json:"phase"`
	// LeaseID is the lease in use, and LeaseHost the host it lives on, on
	// a fleet of sandbox hosts. A fleet host's sweep keeps the lease a
	// workflow's state names here (SweepHost).
	LeaseID   string `json:"leaseId,omitempty"`
	LeaseHost string `json:"leaseHost,omitempty"`
	// KeepLease is the request's KeepLease: the lease LeaseID names is
	// the caller's, even once the run has closed, however it closed. The
	// reaper (Reaper) and a fleet host's sweep leave it alone.
	KeepLease bool `json:"keepLease,omitempty"`
	// FreshLeases counts the fresh leases taken so far (compensation);
	// each command may take MaxFreshLeases.
	FreshLeases    int `json:"freshLeases"`
	MaxFreshLeases int `json:"maxFreshLeases"`
	// DestroyedLeases lists the leases destroyed so far.
	DestroyedLeases []string `json:"destroyedLeases,omitempty"`
	// LostLeases lists the leases given up with their lost host, not
	// destroyed: their host sweeps them when it returns.
	LostLeases []string `json:"lostLeases,omitempty"`
	// LastError is the failure that made the latest lease unusable.
	LastError string `json:"lastError,omitempty"`
}

// publisher shows a run's State outside the workflow: as current details
// in the Web UI and as search attributes. A run embedded in someone else's
// workflow publishes nothing: the workflow is not ours to describe.
type publisher struct {
	enabled          bool
	searchAttributes bool
	command          string
	// describe, if set, renders the current details instead of details
	// (a session describes more than its current command).
	describe func(State) string
	// executingIsIdle keeps the phase search attribute at idle while a
	// command executes (a steady session's: its commands show in its
	// current details, and do not each write its visibility record twice).
	executingIsIdle bool
	// what the search attributes hold now
	phase   Phase
	leaseID string
}

func (p *publisher) publish(ctx workflow.Context, s State) {
	if !p.enabled {
		return
	}
	if p.describe != nil {
		workflow.SetCurrentDetails(ctx, p.describe(s))
	} else {
		workflow.SetCurrentDetails(ctx, p.details(s))
	}
	if !p.searchAttributes {
		return
	}
	phase := s.Phase
	if p.executingIsIdle && phase == PhaseExecuting {
		phase = PhaseIdle
	}
	var updates []temporal.SearchAttributeUpdate
	if phase != p.phase {
		updates = append(updates, temporal.NewSearchAttributeKeyKeyword(SearchAttributePhase).ValueSet(string(phase)))
	}
	if s.LeaseID != p.leaseID && s.LeaseID != "" {
		updates = append(updates, temporal.NewSearchAttributeKeyKeyword(SearchAttributeLeaseID).ValueSet(s.LeaseID))
	}
	if len(updates) > 0 {
		if err := workflow.UpsertTypedSearchAttributes(ctx, updates...); err != nil {
			workflow.GetLogger(ctx).Warn("could not upsert search attributes", "error", err)
		}
	}
	p.phase, p.leaseID = phase, s.LeaseID
}

// details renders s in Temporal markdown for the Web UI.
func (p *publisher) details(s State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "**%s** `%s`", s.Phase, p.command)
	if s.LeaseID != "" {
		fmt.Fprintf(&b, " on lease `%s`", s.LeaseID)
	}
	fmt.Fprintf(&b, " · fresh leases %d/%d", s.FreshLeases, s.MaxFreshLeases)
	if len(s.DestroyedLeases) > 0 {
		fmt.Fprintf(&b, " · destroyed %s", strings.Join(s.DestroyedLeases, ", "))
	}
	if s.LastError != "" {
		fmt.Fprintf(&b, " · last failure: %s", s.LastError)
	}
	return b.String()
}
