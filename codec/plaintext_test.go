package codec

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
)

// input is a workflow input that refuses plain text, as workflows.Request
// does.
type input struct {
	Value   string `json:"value"`
	refused bool
}

func (i *input) RefusePlaintext() { i.refused = true }

// decode decodes p into an input through dc, alone and as one of several.
func decode(t *testing.T, dc converter.DataConverter, p *commonpb.Payload) []input {
	t.Helper()
	var one, many input
	require.NoError(t, dc.FromPayload(p, &one))
	require.NoError(t, dc.FromPayloads(&commonpb.Payloads{Payloads: payloads(p)}, &many))
	return []input{one, many}
}

func TestDataConverterRefusesPlaintextInput(t *testing.T) {
	keys := mustKeys(t, "k1")
	plain, err := converter.GetDefaultDataConverter().ToPayload(input{Value: "v"})
	require.NoError(t, err)
	encrypted, err := DataConverter(keys).ToPayload(input{Value: "v"})
	require.NoError(t, err)

	for _, got := range decode(t, DataConverter(keys), plain) {
		assert.Equal(t, "v", got.Value)
		assert.True(t, got.refused, "a plain-text input is refused")
	}
	for _, got := range decode(t, DataConverter(keys), encrypted) {
		assert.Equal(t, "v", got.Value)
		assert.False(t, got.refused, "an encrypted input is taken")
	}
	for _, got := range decode(t, DataConverterAllowingPlaintext(keys), plain) {
		assert.False(t, got.refused, "the operator allows plain text")
	}

	var s string
	require.NoError(t, DataConverter(keys).FromPayload(plainPayload("old history"), &s), "other values still decode from plain text")
	assert.Equal(t, "old history", s)
}
