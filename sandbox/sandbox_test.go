package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCommandValidate(t *testing.T) {
	valid := Command{Argv: []string{"make", "test"}, Cwd: "src", Env: map[string]string{"GOFLAGS": "-v", "_X1": ""}, Timeout: time.Minute}
	require.NoError(t, valid.Validate())

	for name, tc := range map[string]struct {
		cmd   Command
		field string
	}{
		"no argv":          {Command{}, "argv"},
		"empty program":    {Command{Argv: []string{""}}, "argv"},
		"NUL in argument":  {Command{Argv: []string{"echo", "a\x00b"}}, "argv[1]"},
		"NUL in cwd":       {Command{Argv: []string{"true"}, Cwd: "a\x00"}, "cwd"},
		"bad env name":     {Command{Argv: []string{"true"}, Env: map[string]string{"BAD;KEY": "v"}}, "env"},
		"env name digit":   {Command{Argv: []string{"true"}, Env: map[string]string{"1X": "v"}}, "env"},
		"NUL in env value": {Command{Argv: []string{"true"}, Env: map[string]string{"K": "secret\x00"}}, "env"},
		"negative timeout": {Command{Argv: []string{"true"}, Timeout: -time.Second}, "timeout"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cmd.Validate()
			var invalid *InvalidInputError
			require.ErrorAs(t, err, &invalid)
			assert.Equal(t, tc.field, invalid.Field)
			assert.Equal(t, TypeInvalidInput, ErrorType(err))
			assert.NotContains(t, err.Error(), "secret", "error text never holds an env value")
		})
	}
}

func TestCommandStringQuotesOnlyWhatNeedsIt(t *testing.T) {
	cmd := Command{Argv: []string{"sh", "-c", "echo it's $HOME", "--flag=a,b"}, Env: map[string]string{"TOKEN": "hunter2"}}
	assert.Equal(t, `sh -c 'echo it'\''s $HOME' --flag=a,b`, cmd.String())
	assert.NotContains(t, cmd.String(), "hunter2")
	assert.Equal(t, "''", Command{Argv: []string{""}}.String())
}

func TestCheckID(t *testing.T) {
	for _, ok := range []string{"sb-1", "A_b-9", strings.Repeat("x", 200)} {
		assert.NoError(t, CheckID("lease id", ok), ok)
	}
	for _, bad := range []string{"", "a/b", "../x", "a b", "é", strings.Repeat("x", 201)} {
		assert.Error(t, CheckID("lease id", bad), bad)
	}
}

func TestShellExitCode(t *testing.T) {
	assert.Equal(t, 0, Result{}.ShellExitCode())
	assert.Equal(t, 3, Result{ExitCode: 3}.ShellExitCode())
	assert.Equal(t, 124, Result{TimedOut: true, Signal: "SIGKILL"}.ShellExitCode(), "a timeout wins over the signal that ended it")
	assert.Equal(t, 137, Result{Signal: "SIGKILL"}.ShellExitCode())
	assert.Equal(t, 143, Result{Signal: "SIGTERM"}.ShellExitCode())
	assert.Equal(t, 128, Result{Signal: "SIGNOSUCH"}.ShellExitCode())
	assert.True(t, Result{}.Succeeded())
	assert.False(t, Result{Signal: "SIGKILL"}.Succeeded())
}

func TestLeaseStatus(t *testing.T) {
	assert.True(t, StatusDestroyed.Terminal())
	assert.True(t, StatusFailed.Terminal())
	assert.False(t, StatusError.Terminal(), "a lease in error may be resumed")
	assert.True(t, StatusResuming.Transitional())
	assert.False(t, StatusRunning.Transitional())
}

// TestTaxonomy pins the classification of every error kind: the workflows
// route on these answers, so a change here changes where a failure goes.
func TestTaxonomy(t *testing.T) {
	cause := errors.New("connection reset")
	for _, tc := range []struct {
		err       error
		typ       string
		retryable bool
	}{
		{&CleanupError{Reason: CreationUnconfirmed, LeaseID: "sb-1", Err: &APIError{Status: 502, Operation: "create process"}}, TypeCleanup, false},
		{&CleanupError{Reason: TerminationUnconfirmed, LeaseID: "sb-1", ProcessID: "p", Err: &ConnectionExhaustedError{Attempts: 4}}, TypeCleanup, false},
		{&ConnectionExhaustedError{Attempts: 4, Err: cause}, TypeConnectionExhausted, true},
		{&OutputEvictedError{ProcessID: "p", After: 7}, TypeOutputEvicted, false},
		{&ProtocolError{Kind: SequenceGap}, TypeProtocol, false},
		{&InvalidInputError{Field: "argv", Reason: "empty"}, TypeInvalidInput, false},
		{&APIError{Status: 400, Operation: "x"}, TypeAPI, false},
		{&APIError{Status: 401, Operation: "x"}, TypeAPI, false},
		{&APIError{Status: 429, Operation: "x"}, TypeAPI, true},
		{&APIError{Status: 500, Operation: "x"}, TypeAPI, true},
		{&APIError{Status: 503, Operation: "x"}, TypeAPI, true},
		{&LeaseGoneError{LeaseID: "sb-1"}, TypeLeaseGone, false},
		{&UnavailableError{Operation: "x", Err: context.DeadlineExceeded}, TypeUnavailable, true},
		{fmt.Errorf("wrapped: %w", &ProtocolError{Kind: BadBase64}), TypeProtocol, false},
		{context.Canceled, "", false},
		{fmt.Errorf("command cancelled: %w", context.Canceled), "", false},
		{cause, "", true},
	} {
		t.Run(fmt.Sprintf("%T %v", tc.err, tc.err), func(t *testing.T) {
			assert.Equal(t, tc.typ, ErrorType(tc.err))
			assert.Equal(t, tc.retryable, Retryable(tc.err))
		})
	}
}

func TestCleanupErrorText(t *testing.T) {
	creation := &CleanupError{Reason: CreationUnconfirmed, LeaseID: "sb-1", Err: &APIError{Status: 502, Operation: "create process"}}
	assert.Equal(t, "sandbox sb-1: process creation could not be confirmed; destroy the lease before reusing it: create process: HTTP 502", creation.Error())
	termination := &CleanupError{Reason: TerminationUnconfirmed, LeaseID: "sb-1", ProcessID: "p-1"}
	assert.Equal(t, "sandbox sb-1: command cleanup failed; process termination is unconfirmed", termination.Error())
	lease := &CleanupError{Reason: TerminationUnconfirmed, LeaseID: "sb-1"}
	assert.Contains(t, lease.Error(), "cleanup is unconfirmed")
	var api *APIError
	assert.ErrorAs(t, creation, &api, "the cause stays reachable")
}

// Each size limit fails by its own name, with the limit and the size
// found, at the edge: the limit passes, one byte more fails.
func TestCommandValidateSizes(t *testing.T) {
	arg := strings.Repeat("a", MaxArgBytes)
	require.NoError(t, Command{Argv: []string{"echo", arg}}.Validate())
	require.NoError(t, Command{Argv: []string{"cat"}, Stdin: make([]byte, MaxStdinBytes)}.Validate())
	require.NoError(t, Command{Argv: []string{"env"}, Env: map[string]string{"V": strings.Repeat("v", MaxArgBytes-2)}}.Validate())

	// Argv of exactly MaxArgvEnvBytes, as the kernel counts it.
	const perString = 100_000
	n := MaxArgvEnvBytes / (perString + 1 + 8)
	argv := make([]string, n+1)
	for i := range n {
		argv[i] = strings.Repeat("b", perString)
	}
	argv[n] = strings.Repeat("c", MaxArgvEnvBytes-n*(perString+1+8)-1-8)
	require.NoError(t, Command{Argv: argv}.Validate())
	argv[n] += "c"

	for name, tc := range map[string]struct {
		cmd   Command
		field string
		says  string
	}{
		"one argument": {Command{Argv: []string{"echo", arg + "a"}}, "argv[1]", "131072 bytes, more than the limit of 131071 bytes for one argument"},
		"one variable": {Command{Argv: []string{"env"}, Env: map[string]string{"V": "secret" + strings.Repeat("v", MaxArgBytes-7)}}, "env", "more than the limit of 131071 bytes for one variable (V=value)"},
		"argv and env": {Command{Argv: argv}, "argv", fmt.Sprintf("%d bytes, more than the limit of %d bytes for argv and env together", MaxArgvEnvBytes+1, MaxArgvEnvBytes)},
		"stdin":        {Command{Argv: []string{"cat"}, Stdin: make([]byte, MaxStdinBytes+1)}, "stdin", fmt.Sprintf("%d bytes, more than its limit of %d bytes (sandbox.MaxStdinBytes)", MaxStdinBytes+1, MaxStdinBytes)},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cmd.Validate()
			var invalid *InvalidInputError
			require.ErrorAs(t, err, &invalid)
			assert.Equal(t, tc.field, invalid.Field)
			assert.Contains(t, err.Error(), tc.says)
			assert.NotContains(t, err.Error(), "secret")
		})
	}
}

func TestCheckPayloadSize(t *testing.T) {
	require.NoError(t, CheckPayloadSize("request", Command{Argv: []string{"echo", strings.Repeat("a", 100_000)}}))
	// '<' is 6 bytes in JSON: 300 000 of them fit argv, not a payload.
	argv := []string{"echo"}
	for range 3 {
		argv = append(argv, strings.Repeat("<", 100_000))
	}
	cmd := Command{Argv: argv}
	require.NoError(t, cmd.Validate())
	err := CheckPayloadSize("request", cmd)
	var invalid *InvalidInputError
	require.ErrorAs(t, err, &invalid)
	assert.Equal(t, "request", invalid.Field)
	assert.Contains(t, err.Error(), fmt.Sprintf("more than the limit of %d bytes for a Temporal payload", MaxPayloadBytes))
}
