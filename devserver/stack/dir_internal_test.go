package stack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStackDirIsTheStacksOwn(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())

	d, err := openStackDir("127.0.0.1", 17233)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(stacksBase(), "stack-127.0.0.1-17233"), d.path, "derived from the stack's address")

	busy, err := openStackDir("127.0.0.1", 17233)
	require.NoError(t, err, "another stack on the same address fails on its port, not here")
	assert.Contains(t, filepath.Base(busy.path), dirTmpPrefix, "a held directory is not shared")
	free, err := openStackDir("127.0.0.1", 0)
	require.NoError(t, err)
	assert.Contains(t, filepath.Base(free.path), dirTmpPrefix)
	assert.NotEqual(t, busy.path, free.path)

	require.NoError(t, d.release())
	again, err := openStackDir("::1", 17233)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(stacksBase(), "stack-__1-17233"), again.path)
	require.NoError(t, again.release())
	require.NoError(t, busy.release())

	// The next stack sweeps the directories nobody holds (d's, busy's, again's),
	// not those held (free's) nor what is not a stack's.
	other := filepath.Join(stacksBase(), "not-a-stack")
	require.NoError(t, os.Mkdir(other, 0o700))
	next, err := openStackDir("127.0.0.1", 0)
	require.NoError(t, err)
	entries, err := os.ReadDir(stacksBase())
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{filepath.Base(free.path), filepath.Base(next.path), "not-a-stack"}, names)
	require.NoError(t, free.release())
	require.NoError(t, next.release())
}

func TestStackDirRefusesABaseThatIsNotOurs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	require.NoError(t, os.Symlink(t.TempDir(), stacksBase()))
	_, err := openStackDir("127.0.0.1", 0)
	require.ErrorContains(t, err, "is not a directory owned by uid")
}
