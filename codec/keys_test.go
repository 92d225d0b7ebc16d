package codec

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomKey is a fresh base64 AES-256 key.
func randomKey(t *testing.T) string {
	t.Helper()
	key := make([]byte, KeySize)
	rand.Read(key)
	return base64.StdEncoding.EncodeToString(key)
}

func TestParseKeysTakesTheFirstAsCurrent(t *testing.T) {
	k, err := ParseKeys(" k2:" + randomKey(t) + ",\n k1:" + strings.TrimRight(randomKey(t), "=") + "\n")
	require.NoError(t, err)
	assert.Equal(t, "k2", k.Current())
	assert.Equal(t, []string{"k2", "k1"}, k.IDs())
}

func TestParseKeysRejectsMalformedSpecsWithoutRepeatingThem(t *testing.T) {
	good := randomKey(t)
	short := base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	for _, tc := range []struct {
		name, spec, want string
	}{
		{"empty", "  ", "empty"},
		{"empty entry", "k1:" + good + ",,", "entry 2 is empty"},
		{"no colon", good, "entry 1 is not ID:BASE64KEY"},
		{"bad id", "k 1:" + good, "entry 1: the key id must be"},
		{"empty id", ":" + good, "entry 1: the key id must be"},
		{"long id", strings.Repeat("x", 65) + ":" + good, "the key id must be"},
		{"duplicate id", "k1:" + good + ",k1:" + randomKey(t), `"k1" appears twice`},
		{"not base64", "k1:" + good[:10] + "!!" + good[12:], `key "k1": the key is not valid standard base64`},
		{"AES-128 key", "k1:" + short, `key "k1": the key is 16 bytes; AES-256 needs 32`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseKeys(tc.spec)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), good[:10], "an error never repeats key material")
		})
	}
}

func TestLoadKeysFromEnvOrFile(t *testing.T) {
	spec := "prod-2:" + randomKey(t) + ",prod-1:" + randomKey(t)
	file := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(file, []byte(spec+"\n"), 0o600))
	env := func(vars map[string]string) func(string) string {
		return func(name string) string { return vars[name] }
	}

	k, err := LoadKeys(env(nil))
	require.NoError(t, err)
	assert.Nil(t, k, "neither variable: encryption off")

	k, err = LoadKeys(env(map[string]string{EnvKeys: spec}))
	require.NoError(t, err)
	assert.Equal(t, []string{"prod-2", "prod-1"}, k.IDs())

	k, err = LoadKeys(env(map[string]string{EnvKeysFile: file}))
	require.NoError(t, err)
	assert.Equal(t, []string{"prod-2", "prod-1"}, k.IDs())

	_, err = LoadKeys(env(map[string]string{EnvKeys: spec, EnvKeysFile: file}))
	assert.ErrorContains(t, err, "both")

	_, err = LoadKeys(env(map[string]string{EnvKeysFile: filepath.Join(t.TempDir(), "missing")}))
	assert.ErrorIs(t, err, os.ErrNotExist)

	_, err = LoadKeys(env(map[string]string{EnvKeys: "prod-1"}))
	assert.ErrorContains(t, err, EnvKeys, "the error says where the bad spec came from")
}

func TestKeysNeverPrintTheirKeys(t *testing.T) {
	encoded := randomKey(t)
	key, err := base64.StdEncoding.DecodeString(encoded)
	require.NoError(t, err)
	k, err := ParseKeys("k1:" + encoded)
	require.NoError(t, err)
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		for _, arg := range []any{k, *k} {
			out := fmt.Sprintf(verb, arg)
			assert.NotContains(t, out, encoded, verb)
			assert.NotContains(t, out, fmt.Sprintf("%x", key), verb)
		}
	}
	assert.Equal(t, "codec.Keys(current k1; ids k1)", fmt.Sprint(k))
}

func TestGenerateKeysMakesDistinctKeys(t *testing.T) {
	a, err := GenerateKeys("dev")
	require.NoError(t, err)
	b, err := GenerateKeys("dev")
	require.NoError(t, err)
	payload := plainPayload("hello")
	encrypted, err := NewPayloadCodec(a).Encode(payloads(payload))
	require.NoError(t, err)
	_, err = NewPayloadCodec(b).Decode(encrypted)
	assert.ErrorIs(t, err, ErrUndecryptable, "same id, another key")

	_, err = GenerateKeys("not valid")
	assert.Error(t, err)
}
