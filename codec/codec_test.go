package codec

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/proto"
)

func plainPayload(value string) *commonpb.Payload {
	p, err := converter.GetDefaultDataConverter().ToPayload(value)
	if err != nil {
		panic(err)
	}
	return p
}

func payloads(ps ...*commonpb.Payload) []*commonpb.Payload { return ps }

func mustKeys(t *testing.T, id string) *Keys {
	t.Helper()
	k, err := GenerateKeys(id)
	require.NoError(t, err)
	return k
}

func TestRoundTripHidesValueAndEncoding(t *testing.T) {
	c := NewPayloadCodec(mustKeys(t, "k1"))
	in := plainPayload("the secret marker")
	enc, err := c.Encode(payloads(in))
	require.NoError(t, err)
	require.Len(t, enc, 1)
	assert.Equal(t, map[string][]byte{converter.MetadataEncoding: []byte(Encoding), MetadataKeyID: []byte("k1")}, enc[0].GetMetadata(),
		"the metadata holds the marker and the key id only: not even json/plain")
	assert.False(t, bytes.Contains(enc[0].GetData(), []byte("secret marker")))
	assert.False(t, bytes.Contains(enc[0].GetData(), []byte("json/plain")))

	dec, err := c.Decode(enc)
	require.NoError(t, err)
	assert.True(t, proto.Equal(in, dec[0]))
	assert.Equal(t, "json/plain", string(in.GetMetadata()[converter.MetadataEncoding]), "Encode does not mutate its input")
}

func TestNoncesDiffer(t *testing.T) {
	c := NewPayloadCodec(mustKeys(t, "k1"))
	a, err := c.Encode(payloads(plainPayload("same")))
	require.NoError(t, err)
	b, err := c.Encode(payloads(plainPayload("same")))
	require.NoError(t, err)
	assert.NotEqual(t, a[0].GetData(), b[0].GetData(), "the same value encrypts differently each time")
	assert.NotEqual(t, a[0].GetData()[:12], b[0].GetData()[:12], "a fresh nonce each time")
}

func TestRotationKeepsOldPayloadsReadable(t *testing.T) {
	old := mustKeys(t, "2026-01")
	written, err := NewPayloadCodec(old).Encode(payloads(plainPayload("written under the old key")))
	require.NoError(t, err)

	rotated, err := old.Rotate("2026-02")
	require.NoError(t, err)
	assert.Equal(t, "2026-02", rotated.Current())
	assert.Equal(t, "2026-01", old.Current(), "Rotate leaves the old ring as it was")

	c := NewPayloadCodec(rotated)
	fresh, err := c.Encode(payloads(plainPayload("written under the new key")))
	require.NoError(t, err)
	assert.Equal(t, "2026-02", string(fresh[0].GetMetadata()[MetadataKeyID]), "new payloads use the new current key")

	dec, err := c.Decode(append(written, fresh...))
	require.NoError(t, err)
	var got []string
	for _, p := range dec {
		var s string
		require.NoError(t, converter.GetDefaultDataConverter().FromPayload(p, &s))
		got = append(got, s)
	}
	assert.Equal(t, []string{"written under the old key", "written under the new key"}, got)

	_, err = old.Rotate("2026-01")
	assert.ErrorContains(t, err, "already")
}

func TestUnknownKeyIDIsANamedError(t *testing.T) {
	enc, err := NewPayloadCodec(mustKeys(t, "retired")).Encode(payloads(plainPayload("x")))
	require.NoError(t, err)
	reader := mustKeys(t, "current")
	_, err = NewPayloadCodec(reader).Decode(enc)
	require.ErrorIs(t, err, ErrUnknownKey)
	assert.Contains(t, err.Error(), `"retired"`)
	assert.NotContains(t, err.Error(), "current", "the error names the payload's key id only")
}

func TestTamperedPayloadsFail(t *testing.T) {
	k := mustKeys(t, "k1")
	k2, err := k.Rotate("k2")
	require.NoError(t, err)
	c := NewPayloadCodec(k2)
	for _, tc := range []struct {
		name   string
		tamper func(p *commonpb.Payload)
		want   error
	}{
		{"flipped ciphertext bit", func(p *commonpb.Payload) { p.Data[len(p.Data)/2] ^= 1 }, ErrUndecryptable},
		{"flipped nonce bit", func(p *commonpb.Payload) { p.Data[0] ^= 1 }, ErrUndecryptable},
		{"truncated", func(p *commonpb.Payload) { p.Data = p.Data[:len(p.Data)-1] }, ErrUndecryptable},
		{"too short for a nonce", func(p *commonpb.Payload) { p.Data = p.Data[:5] }, ErrUndecryptable},
		{"key id swapped for another key in the ring", func(p *commonpb.Payload) { p.Metadata[MetadataKeyID] = []byte("k1") }, ErrUndecryptable},
		{"key id removed", func(p *commonpb.Payload) { delete(p.Metadata, MetadataKeyID) }, ErrUnknownKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := c.Encode(payloads(plainPayload("x")))
			require.NoError(t, err)
			tc.tamper(enc[0])
			_, err = c.Decode(enc)
			assert.ErrorIs(t, err, tc.want)
		})
	}
}

func TestPayloadsItDidNotEncryptPassThrough(t *testing.T) {
	c := NewPayloadCodec(mustKeys(t, "k1"))
	plain := plainPayload("from before encryption was turned on")
	dec, err := c.Decode(payloads(plain))
	require.NoError(t, err)
	assert.Same(t, plain, dec[0])

	enc, err := c.Encode(payloads(plain))
	require.NoError(t, err)
	again, err := c.Encode(enc)
	require.NoError(t, err)
	assert.Same(t, enc[0], again[0], "an encrypted payload is not encrypted twice")
}

func TestDataConverterRoundTripsValues(t *testing.T) {
	type value struct {
		Argv []string
		Env  map[string]string
	}
	in := value{Argv: []string{"deploy", "--to", "prod"}, Env: map[string]string{"REGION": "eu-1"}}
	dc := DataConverter(mustKeys(t, "k1"))
	p, err := dc.ToPayload(in)
	require.NoError(t, err)
	assert.NotContains(t, string(p.GetData()), "deploy")
	var out value
	require.NoError(t, dc.FromPayload(p, &out))
	assert.Equal(t, in, out)

	assert.Equal(t, converter.GetDefaultDataConverter(), DataConverter(nil), "no keys, no encryption")
}

func TestFailureConverterEncryptsMessagesButKeepsTypes(t *testing.T) {
	fc := FailureConverter(mustKeys(t, "k1"))
	err := temporal.NewApplicationError("deploying to prod failed", "SandboxAPIError")
	f := fc.ErrorToFailure(err)
	assert.NotContains(t, f.GetMessage(), "prod")
	assert.Equal(t, "SandboxAPIError", f.GetApplicationFailureInfo().GetType(), "types stay readable for retry policies")
	assert.NotContains(t, string(f.GetEncodedAttributes().GetData()), "prod")

	var back *temporal.ApplicationError
	require.ErrorAs(t, fc.FailureToError(f), &back)
	assert.Equal(t, "deploying to prod failed", back.Message())
	assert.Equal(t, "SandboxAPIError", back.Type())
}
