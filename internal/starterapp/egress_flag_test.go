package starterapp

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEgressFlagSetsTheLeasesRules(t *testing.T) {
	o, err := parseArgs([]string{"--egress", "*", "--egress", "pypi.org:443", "--", "true"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"*", "pypi.org:443"}, o.request.Lease.Egress)

	o, err = parseArgs([]string{"--", "true"}, nil)
	require.NoError(t, err)
	assert.Nil(t, o.request.Lease.Egress, "no flag asks for nothing in particular")
}

func TestBadEgressRuleFailsBeforeAnythingIsSent(t *testing.T) {
	for name, rule := range map[string]string{"empty": "", "space": "a b:443", "control": "a\tb"} {
		t.Run(name, func(t *testing.T) {
			_, err := parseArgs([]string{"--egress", rule, "--", "true"}, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "egress[0]")
		})
	}
}
