package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/mocks"
	"go.uber.org/mock/gomock"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandbox/sandboxmock"
)

// answer is a query's answer.
type answer struct{ v any }

func (a answer) HasValue() bool { return true }
func (a answer) Get(out any) error {
	data, err := json.Marshal(a.v)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}

// runLease is a lease of a run of workflow wid.
func runLease(id, wid string) sandbox.Lease {
	return sandbox.Lease{ID: id, Status: sandbox.StatusRunning,
		Labels: map[string]string{activities.LabelRun: "run-" + wid, activities.LabelWorkflowID: wid}}
}

// described is a workflow with these activities pending; a name with a
// "~" prefix is only scheduled, not started.
func described(status enumspb.WorkflowExecutionStatus, pending ...string) *workflowservice.DescribeWorkflowExecutionResponse {
	d := &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: &workflowpb.WorkflowExecutionInfo{Status: status}}
	for _, name := range pending {
		state := enumspb.PENDING_ACTIVITY_STATE_STARTED
		if scheduled, ok := strings.CutPrefix(name, "~"); ok {
			name, state = scheduled, enumspb.PENDING_ACTIVITY_STATE_SCHEDULED
		}
		d.PendingActivities = append(d.PendingActivities, &workflowpb.PendingActivityInfo{ActivityType: &commonpb.ActivityType{Name: name}, State: state})
	}
	return d
}

func TestSweepHostDestroysWhatNoWorkflowHolds(t *testing.T) {
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	c := &mocks.Client{}
	running, closed := enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Nil()).Return([]sandbox.Lease{
		runLease("held", "w-held"),                     // its running workflow names it
		runLease("given-up", "w-moved"),                // its workflow moved to another lease
		runLease("kept", "w-kept"),                     // a closed run kept it
		runLease("released", "w-released"),             // a closed run left it to its lost host
		runLease("terminated", "w-terminated"),         // a run terminated mid-command never released it
		runLease("gone", "w-gone"),                     // its workflow is past retention
		runLease("creating", "w-creating"),             // its workflow is creating a lease
		runLease("waiting", "w-waiting"),               // its workflow waits for a host with room: an orphan
		runLease("inline", "w-inline"),                 // its workflow answers no StateQuery
		{ID: "foreign", Status: sandbox.StatusRunning}, // not a run's
		{ID: "dead", Status: sandbox.StatusDestroyed, Labels: runLease("", "w-gone").Labels},
	}, nil)
	for wid, d := range map[string]*workflowservice.DescribeWorkflowExecutionResponse{
		"w-held": described(running), "w-moved": described(running), "w-kept": described(closed),
		"w-released": described(closed), "w-terminated": described(enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED), "w-creating": described(running, activities.NameAcquireFreshLease),
		"w-waiting": described(running, "~"+activities.NameCreateLease),
		"w-inline":  described(running),
	} {
		c.On("DescribeWorkflowExecution", mock.Anything, wid, "").Return(d, nil)
	}
	c.On("DescribeWorkflowExecution", mock.Anything, "w-gone", "").Return(nil, serviceerror.NewNotFound("gone"))
	for wid, state := range map[string]State{
		"w-held": {LeaseID: "held"}, "w-moved": {LeaseID: "elsewhere", LeaseHost: "h2"},
		"w-kept": {LeaseID: "kept", KeepLease: true}, "w-terminated": {LeaseID: "terminated"}, "w-released": {LostLeases: []string{"released"}}, "w-waiting": {},
	} {
		c.On("QueryWorkflow", mock.Anything, wid, "", StateQuery).Return(answer{state}, nil)
	}
	c.On("QueryWorkflow", mock.Anything, "w-inline", "", StateQuery).Return(nil, serviceerror.NewQueryFailed("unknown queryType state"))
	for _, id := range []string{"given-up", "released", "terminated", "gone", "waiting"} {
		provider.EXPECT().DestroyLease(gomock.Any(), id).Return(nil)
	}

	sweep, err := SweepHost(t.Context(), c, provider, time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, 9, sweep.Leases)
	assert.ElementsMatch(t, []string{"given-up", "released", "terminated", "gone", "waiting"}, sweep.Destroyed)
	var kept []string
	for _, k := range sweep.Kept {
		kept = append(kept, k.ID)
	}
	assert.ElementsMatch(t, []string{"creating", "inline"}, kept)
	c.AssertNumberOfCalls(t, "DescribeWorkflowExecution", 9+5) // the unheld are asked twice
}

func TestSweepHostKeepsALeaseThatIsHeldAtTheSecondLook(t *testing.T) {
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	c := &mocks.Client{}
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Nil()).Return([]sandbox.Lease{runLease("sbx-fork", "s/fork-1")}, nil)
	// A forked session that does not exist yet at the first look.
	c.On("DescribeWorkflowExecution", mock.Anything, "s/fork-1", "").Return(nil, serviceerror.NewNotFound("not yet")).Once()
	c.On("DescribeWorkflowExecution", mock.Anything, "s/fork-1", "").Return(described(enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING), nil).Once()
	c.On("QueryWorkflow", mock.Anything, "s/fork-1", "", StateQuery).Return(answer{SessionState{State: State{LeaseID: "sbx-fork"}}}, nil)

	sweep, err := SweepHost(t.Context(), c, provider, time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, sweep.Destroyed)
}

func TestSweepHostSaysWhatItCouldNotDestroy(t *testing.T) {
	provider := sandboxmock.NewMockProvider(gomock.NewController(t))
	c := &mocks.Client{}
	provider.EXPECT().ListLeases(gomock.Any(), gomock.Nil()).Return([]sandbox.Lease{runLease("a", "w")}, nil)
	c.On("DescribeWorkflowExecution", mock.Anything, "w", "").Return(nil, serviceerror.NewNotFound("gone"))
	provider.EXPECT().DestroyLease(gomock.Any(), "a").Return(&sandbox.UnavailableError{Operation: "destroy"})
	_, err := SweepHost(t.Context(), c, provider, time.Millisecond)
	assert.True(t, sandbox.IsUnavailableError(err), "%v", err)

	provider.EXPECT().ListLeases(gomock.Any(), gomock.Nil()).Return(nil, errors.New("down"))
	_, err = SweepHost(context.Background(), c, provider, time.Millisecond)
	assert.Error(t, err)
}
