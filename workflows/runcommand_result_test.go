package workflows

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// resultAnswerOf is the outcome of one UpdateResult sent to the run under
// test.
type resultAnswerOf struct {
	completed bool
	result    Result
	err       error
}

// askResult sends UpdateResult (with Update id id) after delay.
func (h *harness) askResult(t *testing.T, id string, delay time.Duration) *resultAnswerOf {
	a := &resultAnswerOf{}
	h.env.RegisterDelayedCallback(func() {
		h.env.UpdateWorkflow(UpdateResult, id, &testsuite.TestUpdateCallback{
			OnAccept: func() {},
			OnReject: func(err error) { t.Errorf("UpdateResult %s rejected: %v", id, err) },
			OnComplete: func(v any, err error) {
				a.completed, a.err = true, err
				if err == nil {
					a.result = v.(Result)
				}
			},
		})
	}, delay)
	return a
}

func TestResultIsAnsweredBeforeTheLeaseIsReleased(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	early := h.askResult(t, "early", 0) // before the command ends: it waits
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		Return(sandbox.Result{ProcessID: "p1", ExitCode: 3, Stdout: "out\n"}, nil)
	// The release fails twice (retried 1 s, then 2 s later): the Result is
	// known all that time, and asked for again in between.
	var late *resultAnswerOf
	gomock.InOrder(
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").
			DoAndReturn(func(context.Context, string) error {
				assert.True(t, early.completed, "the Result is answered before the lease is released")
				late = h.askResult(t, "late", 1500*time.Millisecond)
				return &sandbox.UnavailableError{Operation: "destroy sandbox"}
			}),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").Return(&sandbox.UnavailableError{Operation: "destroy sandbox"}),
		h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").
			DoAndReturn(func(context.Context, string) error {
				assert.True(t, late.completed, "asked while the lease is being released, the Result is answered at once")
				return nil
			}),
	)

	res, err := h.run(request("sh", "-c", "echo out; exit 3"))
	require.NoError(t, err)
	require.True(t, early.completed)
	require.NoError(t, early.err)
	want := Result{Result: sandbox.Result{ProcessID: "p1", ExitCode: 3, Stdout: "out\n"}, LeaseID: "sbx-1"}
	assert.Equal(t, want, early.result, "the Result before the release: no lease destroyed yet")
	require.NotNil(t, late)
	assert.Equal(t, want, late.result)
	want.DestroyedLeases = []string{"sbx-1"}
	assert.Equal(t, want, res, "the run's own result, after the release")
}

func TestResultOfARunThatFailsBeforeItsCommandIsItsFailure(t *testing.T) {
	h := newHarness(t)
	h.expectNoOrphans()
	answer := h.askResult(t, "early", 0)
	h.provider.EXPECT().CreateLease(gomock.Any(), gomock.Any()).
		Return(sandbox.Lease{}, &sandbox.APIError{Status: 400, Operation: "create sandbox"})
	h.provider.EXPECT().DestroyLease(gomock.Any(), gomock.Any()).Times(0)

	_, err := h.run(request("true"))
	assert.Equal(t, sandbox.TypeAPI, applicationErrorType(err))
	require.True(t, answer.completed, "the Update is answered before the run ends")
	assert.Equal(t, sandbox.TypeAPI, applicationErrorType(answer.err))
}

func TestResultOfACancelledRunIsItsCancellation(t *testing.T) {
	h := newHarness(t)
	h.expectCreate(1)
	h.expectNoOrphans()
	answer := h.askResult(t, "early", 0)
	h.provider.EXPECT().Execute(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(ctx context.Context, _ sandbox.Lease, _ sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
			obs.Started(sandbox.Process{ID: "p1"})
			h.env.CancelWorkflow()
			<-ctx.Done()
			return sandbox.Result{}, ctx.Err()
		})
	h.provider.EXPECT().DestroyLease(gomock.Any(), "sbx-1").
		DoAndReturn(func(context.Context, string) error {
			assert.False(t, answer.completed, "a cancelled run answers once it has released its lease")
			return nil
		})

	_, err := h.run(request("sleep", "1000"))
	assert.True(t, temporal.IsCanceledError(err), "workflow error %v", err)
	require.True(t, answer.completed)
	assert.True(t, temporal.IsCanceledError(answer.err), "update error %v", answer.err)
}
