package main

import (
	"crypto/rand"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/codec"
)

func TestEncryptionFollowsTheEnvironmentOrTheFlag(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 15, 0, 0, time.UTC)
	none := func(string) string { return "" }

	keys, generated, err := loadCodec(false, none, now)
	require.NoError(t, err)
	assert.Nil(t, keys, "neither flag nor environment: no encryption")
	assert.False(t, generated)

	keys, generated, err = loadCodec(true, none, now)
	require.NoError(t, err)
	require.NotNil(t, keys)
	assert.True(t, generated)
	assert.Equal(t, "dev-20261129T101500Z", keys.Current())

	key := make([]byte, codec.KeySize)
	rand.Read(key)
	env := func(name string) string {
		if name == codec.EnvKeys {
			return "ops-1:" + base64.StdEncoding.EncodeToString(key)
		}
		return ""
	}
	for _, encrypt := range []bool{false, true} {
		keys, generated, err = loadCodec(encrypt, env, now)
		require.NoError(t, err)
		assert.Equal(t, "ops-1", keys.Current(), "the environment's ring, with or without --encrypt")
		assert.False(t, generated)
	}

	_, _, err = loadCodec(true, func(name string) string {
		if name == codec.EnvKeys {
			return "broken"
		}
		return ""
	}, now)
	assert.Error(t, err, "a broken ring is an error, not a silent fresh one")
}
