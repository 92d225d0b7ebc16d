package sandbox

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLeaseStatesOfTheOfficialLifecycle(t *testing.T) {
	for _, tc := range []struct {
		status                 LeaseStatus
		terminal, transitional bool
	}{
		{StatusCreating, false, true},
		{StatusRunning, false, false},
		{StatusPausing, false, true},
		{StatusPaused, false, false},
		{StatusResuming, false, true},
		{StatusForking, false, true},
		{StatusError, false, false},
		{StatusFailed, true, false},
		{StatusDestroying, true, true},
		{StatusDestroyed, true, false},
	} {
		assert.True(t, tc.status.Known(), tc.status)
		assert.Equal(t, tc.terminal, tc.status.Terminal(), "terminal: %s", tc.status)
		assert.Equal(t, tc.transitional, tc.status.Transitional(), "transitional: %s", tc.status)
	}
	assert.False(t, LeaseStatus("sleeping").Known())
	assert.False(t, LeaseStatus("").Known())
}

func TestLeaseSpecValidate(t *testing.T) {
	valid := LeaseSpec{
		Shape: "s-1vcpu-1gb", Rootfs: "devbox:1", DiskMiB: 4096,
		Egress:         []string{"api.openai.com:443", "example.com"},
		Env:            map[string]string{"MODE": "ci"},
		SecretEnv:      map[string]string{"TOKEN": "deploy-token"},
		AutoPauseAfter: 10 * time.Minute,
		NamePrefix:     "team-a1",
	}
	assert.NoError(t, valid.Validate())
	assert.NoError(t, LeaseSpec{}.Validate())
	for name, tc := range map[string]struct {
		mutate func(*LeaseSpec)
		field  string
	}{
		"control in shape":      {func(s *LeaseSpec) { s.Shape = "s\n1" }, "shape"},
		"control in key":        {func(s *LeaseSpec) { s.IdempotencyKey = "k\r\nX: 1" }, "idempotencyKey"},
		"negative disk":         {func(s *LeaseSpec) { s.DiskMiB = -1 }, "diskMiB"},
		"egress with a space":   {func(s *LeaseSpec) { s.Egress = []string{"a b"} }, "egress[0]"},
		"empty egress":          {func(s *LeaseSpec) { s.Egress = []string{"x", ""} }, "egress[1]"},
		"env name":              {func(s *LeaseSpec) { s.Env = map[string]string{"BAD;KEY": "env-secret-value"} }, "env"},
		"NUL in env value":      {func(s *LeaseSpec) { s.Env = map[string]string{"A": "env-secret-value\x00"} }, "env"},
		"secret env name":       {func(s *LeaseSpec) { s.SecretEnv = map[string]string{"1X": "s"} }, "secretEnv"},
		"secret names nothing":  {func(s *LeaseSpec) { s.SecretEnv = map[string]string{"X": ""} }, "secretEnv"},
		"secret clashes":        {func(s *LeaseSpec) { s.SecretEnv = map[string]string{"MODE": "s"} }, "secretEnv"},
		"auto pause too short":  {func(s *LeaseSpec) { s.AutoPauseAfter = 59 * time.Second }, "autoPauseAfter"},
		"auto pause too long":   {func(s *LeaseSpec) { s.AutoPauseAfter = 25 * time.Hour }, "autoPauseAfter"},
		"auto pause fractional": {func(s *LeaseSpec) { s.AutoPauseAfter = 90*time.Second + time.Millisecond }, "autoPauseAfter"},
		"prefix upper case":     {func(s *LeaseSpec) { s.NamePrefix = "Team" }, "namePrefix"},
		"prefix double hyphen":  {func(s *LeaseSpec) { s.NamePrefix = "a--b" }, "namePrefix"},
		"prefix trailing '-'":   {func(s *LeaseSpec) { s.NamePrefix = "a-" }, "namePrefix"},
		"prefix too long":       {func(s *LeaseSpec) { s.NamePrefix = "abcdefghijklmnopq" }, "namePrefix"},
	} {
		spec := valid
		tc.mutate(&spec)
		err := spec.Validate()
		var invalid *InvalidInputError
		if assert.ErrorAs(t, err, &invalid, name) {
			assert.Equal(t, tc.field, invalid.Field, name)
			assert.NotContains(t, err.Error(), "env-secret-value", name)
		}
	}
}

func TestForkSpecValidate(t *testing.T) {
	assert.NoError(t, ForkSpec{}.Validate())
	assert.NoError(t, ForkSpec{Egress: []string{"*"}, Labels: map[string]string{"run": "r1"}}.Validate())
	err := ForkSpec{Egress: []string{"pypi.org:443", "a\tb"}}.Validate()
	var invalid *InvalidInputError
	if assert.ErrorAs(t, err, &invalid) {
		assert.Equal(t, "egress[1]", invalid.Field)
	}
}

func TestForkUnconfirmedNamesTheSourceAndIsNotRetried(t *testing.T) {
	err := &CleanupError{Reason: ForkUnconfirmed, LeaseID: "sb-1"}
	assert.Equal(t, "sandbox sb-1: the fork could not be confirmed; a sandbox forked from it may exist: find it by its labels", err.Error())
	assert.False(t, Retryable(err))
	assert.True(t, IsCleanupError(err))
}

func TestCheckHostName(t *testing.T) {
	for _, ok := range []string{"h1", "host-a.example.com", "A_1", strings.Repeat("x", MaxHostName)} {
		assert.NoError(t, CheckHostName("host", ok), ok)
	}
	for _, bad := range []string{"", "-h", ".h", "h/1", "h 1", "h\n", strings.Repeat("x", MaxHostName+1)} {
		var invalid *InvalidInputError
		assert.ErrorAs(t, CheckHostName("host", bad), &invalid, "%q", bad)
	}
}
