package workflows

import (
	"errors"

	"go.temporal.io/sdk/temporal"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// A session remembers the execute and fork Updates it answered, by Update
// id, and carries them across continue-as-new: the server deduplicates
// Update ids within one run only, so a repeat that lands on the next run
// (an UpdateSession activity retried after its worker died) would otherwise
// run its command again, or fork again. A repeat gets the recorded answer
// instead. (The other Updates can simply be performed again.)
//
// The memory is bounded: the last SessionRequest.RememberedUpdates
// answers (DefaultRememberedUpdates, 32), and at most maxRememberedOutput
// bytes of their output in all; the output of older answers is dropped
// first (their Result then has Truncated set). A repeat of an Update
// older than that, landing on a later run, is not recognised: its command
// runs again. Every remembered answer travels in the continue-as-new
// input, hence MaxRememberedUpdates.
const maxRememberedOutput = 256 << 10

// AnsweredUpdate is an execute or fork Update that a session answered.
type AnsweredUpdate struct {
	// ID is the Update id.
	ID     string        `json:"id"`
	Result SessionResult `json:"result"`
	// Fork is the answer of a fork.
	Fork *SessionFork `json:"fork,omitempty"`
	// Error is the failure it was answered with, if any.
	Error *AnsweredError `json:"error,omitempty"`
}

// AnsweredError is the failure an Update was answered with.
type AnsweredError struct {
	Type         string `json:"type,omitempty"`
	Message      string `json:"message"`
	NonRetryable bool   `json:"nonRetryable,omitempty"`
	// Details are the failure's details.
	Details *sandbox.FailureDetails `json:"details,omitempty"`
	// Compensation holds the details of a SandboxCompensationExhausted, as
	// runs before Details recorded them.
	Compensation *CompensationDetails `json:"compensation,omitempty"`
}

// answered returns the recorded answer to Update id, if there is one.
func (s *session) answered(id string) (AnsweredUpdate, bool) {
	for _, a := range s.answers {
		if a.ID == id {
			return a, true
		}
	}
	return AnsweredUpdate{}, false
}

// remember records a, the answer to Update id, and the failure it was
// answered with, if any.
func (s *session) remember(id string, a AnsweredUpdate, err error) {
	if id == "" {
		return
	}
	a.ID, a.Error = id, recordError(err)
	s.answers = append(s.answers, a)
	s.answers = s.answers[max(0, len(s.answers)-s.req.rememberedUpdates()):]
	total := 0
	for _, a := range s.answers {
		total += len(a.Result.Stdout) + len(a.Result.Stderr)
	}
	for i := 0; total > maxRememberedOutput && i < len(s.answers); i++ {
		r := &s.answers[i].Result
		total -= len(r.Stdout) + len(r.Stderr)
		r.Stdout, r.Stderr, r.Truncated = "", "", true
	}
}

func recordError(err error) *AnsweredError {
	if err == nil {
		return nil
	}
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) {
		return &AnsweredError{Message: err.Error(), NonRetryable: true}
	}
	rec := &AnsweredError{Type: appErr.Type(), Message: appErr.Message(), NonRetryable: appErr.NonRetryable()}
	var details sandbox.FailureDetails
	if appErr.HasDetails() && appErr.Details(&details) == nil {
		rec.Details = &details
	}
	return rec
}

// err is the recorded failure as the Update first returned it.
func (e *AnsweredError) err() error {
	if e == nil {
		return nil
	}
	opts := temporal.ApplicationErrorOptions{NonRetryable: e.NonRetryable}
	switch {
	case e.Details != nil:
		opts.Details = []any{*e.Details}
	case e.Compensation != nil:
		d := sandbox.NewFailureDetails(e.Type)
		d.FreshLeases, d.DestroyedLeases = e.Compensation.FreshLeases, e.Compensation.DestroyedLeases
		opts.Details = []any{d}
	}
	return temporal.NewApplicationErrorWithOptions(e.Message, e.Type, opts)
}
