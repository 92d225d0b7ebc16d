package createos

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTailKeepsTheEnd(t *testing.T) {
	tl := newTail(4)
	tl.write("ab")
	assert.Equal(t, "ab", tl.String())
	assert.False(t, tl.truncated())
	tl.write("cd")
	assert.Equal(t, "abcd", tl.String())
	assert.False(t, tl.truncated(), "exactly max bytes is whole")
	tl.write("e")
	assert.Equal(t, "bcde", tl.String())
	assert.True(t, tl.truncated())
	assert.Equal(t, int64(1), tl.start(), "the kept text starts after the a")
}

func TestTailCutsAtACharacterBoundary(t *testing.T) {
	tl := newTail(4)
	tl.write("xé✓") // 1 + 2 + 3 bytes: the last 4 begin inside é
	assert.Equal(t, "✓", tl.String())
	assert.True(t, tl.truncated())
	assert.Equal(t, int64(3), tl.start(), "the kept text starts after x and é")
}

func TestTailMemoryIsBounded(t *testing.T) {
	tl := newTail(1000)
	piece := strings.Repeat("é", 50)
	for range 100_000 { // 10 MB in all
		tl.write(piece)
	}
	assert.LessOrEqual(t, cap(tl.buf), 4*1000, "memory stays near twice the tail")
	assert.Equal(t, strings.Repeat("é", 500), tl.String())
	assert.Equal(t, int64(10_000_000-1000), tl.start())
}
