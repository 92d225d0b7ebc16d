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
	assert.ElementsMatch(t, []string{TypeCleanup, TypeOutputEvicted, TypeProtocol, TypeInvalidInput, TypeLeaseGone, TypeHostLost, TypePaymentRequired},
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

func TestIsHelpersSeeTypedAndNamedErrors(t *testing.T) {
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
	} {
		t.Run(tc.typ, func(t *testing.T) {
			assert.True(t, tc.is(tc.err))
			assert.True(t, tc.is(fmt.Errorf("wrapped: %w", tc.err)))
			assert.True(t, tc.is(fmt.Errorf("activity error: %w", &named{typ: tc.typ})), "by its type name")
			assert.False(t, tc.is(&named{typ: "SomethingElse"}))
			assert.False(t, tc.is(nil))
		})
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
