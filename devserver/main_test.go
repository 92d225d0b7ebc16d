package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplitArgsSeparatesDevserverAndStarterFlags(t *testing.T) {
	fs, _ := newFlagSet("run", "warn")
	fs.Bool("linger", false, "")
	ours, theirs := splitArgs([]string{
		"--port", "17233", "--json", "--db=x.db", "--linger", "--task-queue", "q", "--timeout", "5s",
		"--", "sh", "-c", "echo --port 1",
	}, fs)
	assert.Equal(t, []string{"--port", "17233", "--db=x.db", "--linger", "--task-queue", "q"}, ours)
	assert.Equal(t, []string{"--json", "--task-queue", "q", "--timeout", "5s", "--", "sh", "-c", "echo --port 1"}, theirs,
		"the starter gets its own flags, the task queue the worker polls, and the command untouched")
}
