package activities

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

func TestOutputTailKeepsTheBoundedEndAndItsOffset(t *testing.T) {
	var tail OutputTail
	tail.append("héllo ")
	assert.Equal(t, OutputTail{Text: "héllo ", End: 7}, tail)

	big := strings.Repeat("é", LiveTailBytes) // 2 bytes a character
	tail.append(big)
	assert.Equal(t, int64(7+len(big)), tail.End, "End counts every byte")
	assert.LessOrEqual(t, len(tail.Text), LiveTailBytes)
	assert.True(t, utf8.ValidString(tail.Text), "the cut falls on a character boundary")
	assert.True(t, strings.HasSuffix(big, tail.Text))

	tail.append("x")
	assert.Equal(t, int64(8+len(big)), tail.End)
	assert.True(t, strings.HasSuffix(tail.Text, "éx"))
	assert.LessOrEqual(t, len(tail.Text), LiveTailBytes)
	assert.Equal(t, tail.End-int64(len(tail.Text)), tail.Start())
}

// The tail's cut falls in the middle of a character at every byte
// position of characters of 2, 3 and 4 bytes, whether the stream comes in
// one piece or a character at a time: the tail then starts at the next
// character, so it is valid UTF-8, a suffix of the stream, within
// LiveTailBytes and short of it by less than one character.
func TestOutputTailCutsMidCharacterAtTheNextCharacter(t *testing.T) {
	for _, char := range []string{"é", "€", "😀"} {
		for pad := range len(char) { // shifts the cut through each byte of the character
			for _, perAppend := range []int{1, 3, LiveTailBytes} { // characters per append
				name := fmt.Sprintf("%s/pad=%d/per=%d", char, pad, perAppend)
				var tail OutputTail
				stream := strings.Repeat("a", pad)
				tail.append(stream)
				for len(stream) < 3*LiveTailBytes {
					chunk := strings.Repeat(char, perAppend)
					stream += chunk
					tail.append(chunk)
					if !assert.True(t, utf8.ValidString(tail.Text), "%s: the tail starts inside a character: % x…", name, tail.Text[:min(4, len(tail.Text))]) {
						break
					}
					assert.True(t, strings.HasSuffix(stream, tail.Text), "%s: the tail is the stream's end", name)
					assert.Equal(t, int64(len(stream)), tail.End, name)
					if len(stream) > LiveTailBytes {
						assert.LessOrEqual(t, len(tail.Text), LiveTailBytes, name)
						assert.Greater(t, len(tail.Text), LiveTailBytes-len(char), "%s: cut at the next character, not later", name)
					}
				}
			}
		}
	}
}

func TestReattachContinuesTheOutputTailsOfTheEarlierAttempt(t *testing.T) {
	env, provider := newEnv(t, nil)
	var (
		mu   sync.Mutex
		last ExecuteProgress
	)
	env.SetOnActivityHeartbeatListener(func(_ *activity.Info, details converter.EncodedValues) {
		var p ExecuteProgress
		assert.NoError(t, details.Get(&p))
		mu.Lock()
		last = p
		mu.Unlock()
	})
	proc := sandbox.Process{ID: "proc-7"}
	env.SetHeartbeatDetails(ExecuteProgress{Process: proc, Cursor: 2,
		Stdout: OutputTail{Text: "line 1\n", End: 7}, Stderr: OutputTail{Text: "warn\n", End: 5}})
	provider.EXPECT().Attach(gomock.Any(), lease, proc, gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Process, obs sandbox.Observer) (sandbox.Result, error) {
			// Attach replays the output from its start.
			obs.Output(sandbox.Chunk{Seq: 1, Stream: sandbox.Stdout, Text: "line 1\n", Bytes: 7})
			obs.Output(sandbox.Chunk{Seq: 2, Stream: sandbox.Stderr, Text: "warn\n", Bytes: 5})
			obs.Output(sandbox.Chunk{Seq: 3, Stream: sandbox.Stdout, Text: "line 2\n", Bytes: 7})
			// It fails, so that its last heartbeat (which says so) is
			// recorded rather than dropped by the completion.
			return sandbox.Result{}, &sandbox.ConnectionExhaustedError{LeaseID: lease.ID, ProcessID: "proc-7", Attempts: 4}
		})

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, OutputTail{Text: "line 1\nline 2\n", End: 14}, last.Stdout, "replayed frames are not added twice")
	assert.Equal(t, OutputTail{Text: "warn\n", End: 5}, last.Stderr)
	assert.Equal(t, int64(3), last.Cursor)
}

func TestOutputIsHeartbeatedWithoutWaitingForTheInterval(t *testing.T) {
	env, provider := newEnv(t, nil) // a heartbeat interval of an hour
	carried := make(chan struct{})
	var once sync.Once
	env.SetOnActivityHeartbeatListener(func(_ *activity.Info, details converter.EncodedValues) {
		var p ExecuteProgress
		assert.NoError(t, details.Get(&p))
		if p.Stdout.Text == "line 1\n" {
			once.Do(func() { close(carried) })
		}
	})
	provider.EXPECT().Execute(gomock.Any(), lease, gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			// No Started, whose heartbeat would open the SDK's throttle
			// window (30 s in the test environment).
			obs.Output(sandbox.Chunk{Seq: 1, Stream: sandbox.Stdout, Text: "line 1\n", Bytes: 7})
			// The command goes on only once a heartbeat has shown line 1.
			select {
			case <-carried:
				return sandbox.Result{ProcessID: "proc-1", Stdout: "line 1\n"}, nil
			case <-time.After(time.Minute): // a hang guard, not a deadline
				return sandbox.Result{}, &sandbox.ConnectionExhaustedError{LeaseID: lease.ID, ProcessID: "proc-1", Attempts: 1}
			}
		})

	_, err := env.ExecuteActivity(NameExecute, ExecuteInput{Lease: lease, Command: sandbox.Command{Argv: []string{"make"}}})
	require.NoError(t, err, "no heartbeat carried the output before the interval")
}
