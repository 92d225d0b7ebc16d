package createos

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCreateNames(t *testing.T) {
	dns := regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	labels := map[string]string{"run": "r-1", "generation": "0", "workflow": "wf", "team": "a", "x": "y"}

	name := createName("abcdefghijklmnop", labels, "key-1")
	assert.Regexp(t, dns, name, "five labels and the longest prefix still make a DNS label")
	assert.True(t, strings.HasPrefix(name, "abcdefghijklmnop--"))
	assert.Equal(t, name, createName("abcdefghijklmnop", labels, "key-1"), "deterministic")
	assert.NotEqual(t, name, createName("abcdefghijklmnop", labels, "key-2"), "another key, another name")
	assert.True(t, strings.HasPrefix(createName("", nil, "k"), defaultNamePrefix+"--"))
	assert.NotEqual(t, createName("", nil, ""), createName("", nil, ""), "nothing to derive it from: random")

	assert.True(t, nameCarries(name, map[string]string{"run": "r-1"}))
	assert.True(t, nameCarries(name, map[string]string{"run": "r-1", "generation": "0"}))
	assert.True(t, nameCarries(name, nil))
	assert.False(t, nameCarries(name, map[string]string{"run": "r-2"}))
	assert.False(t, nameCarries(name, map[string]string{"ru": "nr-1"}), "the pair is hashed, not the concatenation")
	assert.False(t, nameCarries(createName("", nil, "key-1"), map[string]string{"run": "r-1"}), "the create segment is no label")
	assert.False(t, nameCarries("brave-otter", map[string]string{"run": "r-1"}))
	assert.False(t, nameCarries("", nil))
}
