package sandbox

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// named stands for a Temporal ApplicationError: an error that names its
// type and says whether it is retryable.
type named struct {
	typ          string
	nonRetryable bool
}

func (n *named) Error() string      { return n.typ }
func (n *named) Type() string       { return n.typ }
func (n *named) NonRetryable() bool { return n.nonRetryable }

func TestKindsDecideRetriesAndUnusableLeases(t *testing.T) {
	assert.ElementsMatch(t, []string{TypeCleanup, TypeOutputEvicted, TypeProtocol, TypeInvalidInput, TypeLeaseGone, TypeHostLost, TypePaymentRequired,
		TypeTemplateBuildFailed, TypeUnattended, TypeCompensationExhausted, TypeSessionClosed},
		NonRetryableTypes())
	var unusable []string
	for _, k := range Kinds() {
		if k.LeaseUnusable {
			unusable = append(unusable, k.Type)
		}
	}
	assert.Equal(t, []string{TypeCleanup, TypeLeaseGone, TypeHostLost}, unusable)
	assert.True(t, LeaseUnusable(fmt.Errorf("x: %w", &CleanupError{LeaseID: "sb"})))
	assert.True(t, LeaseUnusable(&LeaseGoneError{LeaseID: "sb"}))
	assert.True(t, LeaseUnusable(&HostLostError{Host: "h1", LeaseID: "sb"}))
	assert.False(t, LeaseUnusable(&ProtocolError{Kind: SequenceGap}))
	assert.False(t, LeaseUnusable(nil))
}

// The one table of failures (docs/RELIABILITY.md, "Where each failure
// goes") says what Kinds says: whether each type is retried, and that
// exactly the lease-unusable types go to compensation.
func TestDocumentationTableFollowsKinds(t *testing.T) {
	doc, err := os.ReadFile("../docs/RELIABILITY.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "\n## Where each failure goes\n")
	require.True(t, ok, "docs/RELIABILITY.md has no section \"Where each failure goes\"")
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string][]string{} // type name → cells: failure, type, retried, handled by, outcome
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) == 5 && strings.HasPrefix(cells[1], "`") {
			rows[strings.Trim(cells[1], "`")] = cells
		}
	}
	for _, k := range Kinds() {
		row, ok := rows[k.Type]
		if !assert.True(t, ok, "the table has no row of %s", k.Type) {
			continue
		}
		want := map[Retry]string{RetryNever: "no", RetryAlways: "yes", RetryByStatus: "5xx, 429"}[k.Retry]
		assert.Equal(t, want, row[2], "retried, in the row of %s", k.Type)
		assert.Equal(t, k.LeaseUnusable, strings.Contains(row[3], "compensation"),
			"handled by compensation, in the row of %s", k.Type)
	}
}

// Every kind of the table has its Is… helper, which sees the kind's typed
// error (if it has one) and an ApplicationError of its name.
func TestIsHelpersSeeTypedAndNamedErrors(t *testing.T) {
	covered := map[string]bool{}
	for _, tc := range []struct {
		is  func(error) bool
		err error
		typ string
	}{
		{IsCleanupError, &CleanupError{LeaseID: "sb"}, TypeCleanup},
		{IsConnectionExhaustedError, &ConnectionExhaustedError{}, TypeConnectionExhausted},
		{IsOutputEvictedError, &OutputEvictedError{}, TypeOutputEvicted},
		{IsProtocolError, &ProtocolError{Kind: InvalidFrame}, TypeProtocol},
		{IsInvalidInputError, &InvalidInputError{Field: "argv"}, TypeInvalidInput},
		{IsAPIError, &APIError{Status: 500}, TypeAPI},
		{IsLeaseGoneError, &LeaseGoneError{LeaseID: "sb"}, TypeLeaseGone},
		{IsHostLostError, &HostLostError{Host: "h1", LeaseID: "sb"}, TypeHostLost},
		{IsUnavailableError, &UnavailableError{Operation: "x"}, TypeUnavailable},
		{IsPaymentRequiredError, &PaymentRequiredError{Operation: "x"}, TypePaymentRequired},
		{IsTemplateBuildFailed, &TemplateBuildError{Name: "sf-0", TemplateID: "tpl-1"}, TypeTemplateBuildFailed},
		// Raised by the activities and the workflows: known by name only.
		{IsUnexpectedError, &named{typ: TypeUnexpected}, TypeUnexpected},
		{IsDetached, &named{typ: TypeDetached}, TypeDetached},
		{IsUnrecorded, &named{typ: TypeUnrecorded}, TypeUnrecorded},
		{IsUnattended, &named{typ: TypeUnattended, nonRetryable: true}, TypeUnattended},
		{IsCompensationExhausted, &named{typ: TypeCompensationExhausted, nonRetryable: true}, TypeCompensationExhausted},
		{IsSessionClosed, &named{typ: TypeSessionClosed, nonRetryable: true}, TypeSessionClosed},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			covered[tc.typ] = true
			assert.True(t, tc.is(tc.err))
			assert.True(t, tc.is(fmt.Errorf("wrapped: %w", tc.err)))
			assert.True(t, tc.is(fmt.Errorf("activity error: %w", &named{typ: tc.typ})), "by its type name")
			assert.False(t, tc.is(&named{typ: "SomethingElse"}))
			assert.False(t, tc.is(nil))
		})
	}
	for _, k := range Kinds() {
		assert.True(t, covered[k.Type], "no Is… helper tested for %s", k.Type)
	}
	// Only the first named error counts, as for Temporal's retries.
	outer := &named{typ: "SandboxCompensationExhausted", nonRetryable: true}
	assert.False(t, IsCleanupError(fmt.Errorf("%w: %w", outer, &named{typ: TypeCleanup})))
}

func TestRetryableTakesANamedErrorAtItsWord(t *testing.T) {
	assert.True(t, Retryable(&named{typ: TypeAPI}))
	assert.False(t, Retryable(&named{typ: TypeAPI, nonRetryable: true}))
	assert.False(t, Retryable(&named{typ: TypeCleanup, nonRetryable: true}))
	assert.Equal(t, TypePaymentRequired, ErrorType(&PaymentRequiredError{Operation: "create sandbox"}))
	assert.False(t, Retryable(&PaymentRequiredError{Operation: "create sandbox"}))
}

// The details of each typed error name what it concerns, and its kind's
// retryability; an error outside the taxonomy is SandboxUnexpectedError.
func TestDetailsOfNameWhatTheFailureConcerns(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want FailureDetails
	}{
		{fmt.Errorf("x: %w", &CleanupError{Reason: TerminationUnconfirmed, LeaseID: "sb", ProcessID: "p"}),
			FailureDetails{Kind: TypeCleanup, LeaseUnusable: true, LeaseID: "sb", ProcessID: "p", Reason: "termination_unconfirmed"}},
		{&ConnectionExhaustedError{LeaseID: "sb", ProcessID: "p", Attempts: 4},
			FailureDetails{Kind: TypeConnectionExhausted, Retryable: true, LeaseID: "sb", ProcessID: "p", Connects: 4}},
		{&OutputEvictedError{ProcessID: "p", After: 7}, FailureDetails{Kind: TypeOutputEvicted, ProcessID: "p", After: 7}},
		{&ProtocolError{Kind: SequenceGap}, FailureDetails{Kind: TypeProtocol, Reason: "sequence_gap"}},
		{&InvalidInputError{Field: "command.timeout", Reason: "r"}, FailureDetails{Kind: TypeInvalidInput, Field: "command.timeout", Reason: "r"}},
		{&LeaseGoneError{LeaseID: "sb", Status: "destroyed"}, FailureDetails{Kind: TypeLeaseGone, LeaseUnusable: true, LeaseID: "sb", Reason: "destroyed"}},
		{&HostLostError{Host: "h1", LeaseID: "sb"}, FailureDetails{Kind: TypeHostLost, LeaseUnusable: true, Host: "h1", LeaseID: "sb"}},
		{&PaymentRequiredError{Operation: "create sandbox", Code: "c", RequestID: "r"},
			FailureDetails{Kind: TypePaymentRequired, Operation: "create sandbox", Status: 402, Code: "c", RequestID: "r"}},
		{&APIError{Status: 503, Operation: "create process"}, FailureDetails{Kind: TypeAPI, Retryable: true, Status: 503, Operation: "create process"}},
		{&APIError{Status: 409, Operation: "create process", Code: "name_taken"},
			FailureDetails{Kind: TypeAPI, Status: 409, Operation: "create process", Code: "name_taken"}},
		{&UnavailableError{Operation: "get sandbox"}, FailureDetails{Kind: TypeUnavailable, Retryable: true, Operation: "get sandbox"}},
		{fmt.Errorf("x: %w", &TemplateBuildError{TemplateID: "tpl-1", Name: "sf-0", LogTail: "line 2: RUN false: exited with code 1\n"}),
			FailureDetails{Kind: TypeTemplateBuildFailed, Template: "sf-0", LogTail: "line 2: RUN false: exited with code 1\n"}},
		{fmt.Errorf("a provider bug"), FailureDetails{Kind: TypeUnexpected, Retryable: true}},
	} {
		t.Run(tc.want.Kind, func(t *testing.T) { assert.Equal(t, tc.want, DetailsOf(tc.err)) })
	}
	assert.Equal(t, FailureDetails{Kind: TypeCompensationExhausted}, NewFailureDetails(TypeCompensationExhausted))
	assert.Equal(t, FailureDetails{Kind: TypeDetached, Retryable: true}, NewFailureDetails(TypeDetached))
}

// The polyglot guide's failure table lists every kind with the table's
// retryability, and nothing else.
func TestPolyglotGuideListsEveryKind(t *testing.T) {
	doc, err := os.ReadFile("../docs/POLYGLOT.md")
	require.NoError(t, err)
	rows := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) > 3 && strings.HasPrefix(strings.TrimSpace(cells[1]), "`Sandbox") || len(cells) > 3 && strings.TrimSpace(cells[1]) == "`"+TypeConnectionExhausted+"`" {
			rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.TrimSpace(cells[2])
		}
	}
	for _, k := range Kinds() {
		want := map[Retry]string{RetryNever: "no", RetryAlways: "yes", RetryByStatus: "5xx, 429"}[k.Retry]
		assert.Equal(t, want, rows[k.Type], "docs/POLYGLOT.md's row of %s", k.Type)
		delete(rows, k.Type)
	}
	assert.Empty(t, rows, "rows of no kind")
}
