//go:build !race

// This test runs without the race detector, in `make test`
// (test-devserver, after the race-tested packages) and in
// `make fleet-test`. Measured on 2 shared cores (AMD EPYC, 2026-12-04,
// load about 4): 65 s without the detector; with it (the build constraint
// removed) it passed, no race reported, in 361 s: the detector slows an
// embedded Temporal server, three host workers and three sandbox servers
// in one process five and a half times, past the 5 minutes the fleet test
// may add to CI. The fleet's logic is race-tested where it lives (the
// routing in workflows, the capacity gate and the ledger in
// internal/workerapp, the sweep in workflows).

package reliability

import (
	"context"
	"crypto/rand"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
	"github.com/sandboxflow/sandboxflow/internal/runresult"
	"github.com/sandboxflow/sandboxflow/internal/workerapp"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/localsandbox/localsandboxtest"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"github.com/sandboxflow/sandboxflow/sandboxclient"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// The fleet's shape: three hosts of fleetCapacity leases each. While a
// host is lost on purpose, a host counts as lost when it takes no work on
// a lease for fleetHostStart, a worker as dead when a command misses its
// heartbeats for fleetHeartbeat; otherwise the timeouts are a minute. The
// whole fleet runs in one process, on a machine that is busy with more:
// a short timeout may also fire on a live host, which costs a fresh lease,
// so the test counts what every fresh lease allows.
const (
	fleetCapacity  = 3
	fleetHostStart = 20 * time.Second
	fleetHeartbeat = 10 * time.Second
)

// fleet is a fleet of three simulated sandbox hosts on one embedded
// Temporal server: each host a local sandbox server of its own and a
// worker in host mode (stack.Host).
type fleet struct {
	t     *testing.T
	stack *stack.Stack
	hosts []*stack.Host
	logs  *logSink
}

func startFleet(t *testing.T) *fleet {
	f := &fleet{t: t, logs: &logSink{}}
	logger := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := stack.Start(t.Context(), stack.Options{
		Temporal:  temporalserver.Options{UIPort: temporalserver.NoUI, Logger: logger, LogLevel: slog.LevelError},
		NoSandbox: true,
		NoWorker:  true,
		Logger:    logger,
	})
	require.NoError(t, err)
	f.stack = s
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Logf("stop the fleet: %v", err)
		}
		if t.Failed() {
			t.Logf("logs of the fleet:\n%s", f.logs.String())
		}
		f.logs.close()
	})
	for _, name := range []string{"a", "b", "c"} {
		h, err := s.AddHost(t.Context(), stack.HostOptions{
			Name:    name,
			Sandbox: localsandbox.Options{Root: t.TempDir()},
			Worker: workerapp.Config{
				HostCapacity:      fleetCapacity,
				HeartbeatInterval: 500 * time.Millisecond,
				// A create that timed out may leave its sandbox on a host
				// other than the run's lease's: the host's sweep takes it.
				SweepInterval: 10 * time.Second,
				SweepSettle:   time.Second,
				Sandbox:       createos.Config{OperationTimeout: 30 * time.Second},
			},
		})
		require.NoError(t, err)
		f.hosts = append(f.hosts, h)
	}
	return f
}

// fleetActivities are the matrix's short backoffs with timeouts of a
// minute; with hostLoss, a command's heartbeat timeout and the wait for a
// host on every activity on a lease are short, so that a lost host is
// found out soon.
func fleetActivities(hostLoss bool) *workflows.ActivityOverrides {
	hostStart, heartbeat := time.Minute, time.Minute
	if hostLoss {
		hostStart, heartbeat = fleetHostStart, fleetHeartbeat
	}
	onHost := func(o workflows.ActivityOptions) *workflows.ActivityOptions {
		o.ScheduleToStartTimeout = hostStart
		return &o
	}
	lease := workflows.ActivityOptions{StartToCloseTimeout: 2 * time.Minute, HeartbeatTimeout: time.Minute, RetryPolicy: fastRetry(5)}
	return &workflows.ActivityOverrides{
		CreateLease:       &lease,
		AcquireFreshLease: &lease,
		Execute:           onHost(workflows.ActivityOptions{StartToCloseTimeout: 2 * time.Minute, HeartbeatTimeout: heartbeat, RetryPolicy: fastRetry(4)}),
		DestroyLease:      onHost(workflows.ActivityOptions{StartToCloseTimeout: time.Minute, HeartbeatTimeout: time.Minute, RetryPolicy: fastRetry(0)}),
		PauseLease:        onHost(lease),
		ResumeLease:       onHost(lease),
		ForkLease:         onHost(lease),
		SetEgress:         onHost(lease),
	}
}

// fleetRun is one RunCommand on the fleet and what became of it.
type fleetRun struct {
	marker string
	run    client.WorkflowRun
	res    workflows.Result
	err    error
}

// start starts RunCommand of `echo MARKER; script`.
func (f *fleet) start(script string, hostLoss bool) *fleetRun {
	f.t.Helper()
	r := &fleetRun{marker: newMarker()}
	var err error
	r.run, err = f.stack.Client.ExecuteWorkflow(f.t.Context(), client.StartWorkflowOptions{
		ID:        "fleet-" + r.marker,
		TaskQueue: workflows.DefaultTaskQueue,
	}, workflows.WorkflowName, workflows.Request{Command: command(r.marker, script), ActivityOptions: fleetActivities(hostLoss)})
	require.NoError(f.t, err)
	return r
}

// wait waits for the run's outcome.
func (f *fleet) wait(r *fleetRun) {
	ctx, cancel := context.WithTimeout(f.t.Context(), waitLong)
	defer cancel()
	_, r.err = runresult.Get(ctx, f.stack.Client, r.run, &r.res)
	if ctx.Err() != nil {
		f.describe(r)
	}
	require.NoError(f.t, ctx.Err(), "run %s did not end in time", r.marker)
}

// describe logs where a run that did not end waits, and what the hosts hold.
func (f *fleet) describe(r *fleetRun) {
	d, err := f.stack.Client.DescribeWorkflowExecution(context.Background(), r.run.GetID(), "")
	if err != nil {
		f.t.Logf("run %s: %v", r.marker, err)
		return
	}
	for _, a := range d.GetPendingActivities() {
		f.t.Logf("run %s waits for %s: %s, attempt %d, last failure %v", r.marker, a.GetActivityType().GetName(), a.GetState(), a.GetAttempt(), a.GetLastFailure().GetMessage())
	}
	for _, h := range f.hosts {
		if w := h.Worker(); w != nil {
			f.t.Logf("host %s holds %d leases", h.Name, w.Leases())
		}
	}
}

// runAll runs n commands of script, at most concurrency at a time.
func (f *fleet) runAll(n, concurrency int, script string) []*fleetRun {
	runs := make([]*fleetRun, n)
	slots := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i := range runs {
		slots <- struct{}{}
		runs[i] = f.start(script, false)
		wg.Go(func() {
			defer func() { <-slots }()
			f.wait(runs[i])
		})
	}
	wg.Wait()
	return runs
}

// ran counts, over every host, the processes that really ran the command
// printing marker.
func (f *fleet) ran(marker string) int {
	n := 0
	for _, h := range f.hosts {
		n += ran(processes(h.Sandbox, marker), marker)
	}
	return n
}

// leasesRan returns the leases, over every host, on which the command
// printing marker really ran.
func (f *fleet) leasesRan(marker string) map[string]bool {
	out := map[string]bool{}
	for _, h := range f.hosts {
		for _, rec := range processes(h.Sandbox, marker) {
			if ran([]localsandbox.ProcessRecord{rec}, marker) == 1 {
				out[rec.LeaseID] = true
			}
		}
	}
	return out
}

// assertRanOncePerLease checks that r's command ran, on no more leases
// than the run held: its first, and one per fresh lease. (On one lease, a
// busy machine may make it run twice as the package documents: an Execute
// retry after its output connection was exhausted, or after its
// heartbeats, which would have named the process, never reached the
// server.)
func (f *fleet) assertRanOncePerLease(r *fleetRun) {
	f.t.Helper()
	n := len(f.leasesRan(r.marker))
	assert.GreaterOrEqual(f.t, n, 1, "run %s never ran", r.marker)
	assert.LessOrEqual(f.t, n, 1+r.res.FreshLeases, "run %s ran on %d leases, held %d", r.marker, n, 1+r.res.FreshLeases)
}

// host returns the host named name.
func (f *fleet) host(name string) *stack.Host {
	for _, h := range f.hosts {
		if h.Name == name {
			return h
		}
	}
	f.t.Fatalf("no host %q", name)
	return nil
}

// assertNothingLeaked checks hosts: no lease, no process.
func (f *fleet) assertNothingLeaked(hosts ...*stack.Host) {
	f.t.Helper()
	for _, h := range hosts {
		assert.EventuallyWithT(f.t, func(c *assert.CollectT) {
			assert.NoError(c, localsandboxtest.CheckNothingLeaked(h.Sandbox), "host %s", h.Name)
		}, waitShort, poll)
	}
}

// release lets the held commands of runs finish (heldScript) wherever
// they run, except on the dead host, until the function it returns is
// called.
func (f *fleet) release(runs []*fleetRun, dead *stack.Host) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for _, h := range f.hosts {
				if h == dead {
					continue
				}
				direct, err := h.Provider(createos.Config{})
				require.NoError(f.t, err)
				for _, r := range runs {
					for _, rec := range processes(h.Sandbox, r.marker) {
						if rec.End.IsZero() {
							f.touchReleased(direct, rec.LeaseID)
						}
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// touchReleased creates the file that a held command waits for in lease.
// The lease may be gone by now: that is no failure.
func (f *fleet) touchReleased(direct *createos.Client, leaseID string) {
	ctx, cancel := context.WithTimeout(f.t.Context(), waitShort)
	defer cancel()
	if lease, err := direct.GetLease(ctx, leaseID); err == nil {
		direct.Execute(ctx, lease, sandbox.Command{Argv: []string{"touch", "released"}}, nil)
	}
}

// peakLeases samples, on each host, the leases that run a run's command
// at once until stop is called, and returns the most each had: a floor of
// the leases the runs held there. (The orphans of creates that a busy
// machine timed out run no command, and do not count.)
func (f *fleet) peakLeases() (stop func() map[string]int) {
	peaks := map[string]int{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for _, h := range f.hosts {
				running := map[string]bool{}
				for _, r := range h.Sandbox.History() {
					if !r.Exec && r.End.IsZero() && markerPattern.MatchString(strings.Join(r.Argv, " ")) {
						running[r.LeaseID] = true
					}
				}
				peaks[h.Name] = max(peaks[h.Name], len(running))
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	return func() map[string]int {
		close(done)
		wg.Wait()
		return peaks
	}
}

// markerPattern finds a marker's command among a server's processes.
var markerPattern = regexp.MustCompile(`echo RAN-[A-Z2-7]{16};`)

// Three hosts, each a sandbox server and a host-mode worker, on one
// Temporal server:
//
//  1. 60 runs, 6 at a time, spread over the hosts by Temporal (whichever
//     host with room polls first), no host holding more leases than its
//     capacity;
//  2. a session and 8 runs fill the fleet; the session's host is killed
//     mid-run (cut off, its sandbox server keeping what it holds): every
//     run completes, those on the dead host after a fresh lease on another
//     (SandboxHostLost), the dead host's lease among their LostLeases; no
//     command runs more than once per lease; the session's next command
//     takes a fresh lease (WorkspaceReset); nothing is left on the other
//     hosts, and the dead host, back, sweeps the leases nobody holds;
//  3. a draining host takes no new lease.
func TestAFleetSpreadsRunsAndSurvivesTheLossOfAHost(t *testing.T) {
	f := startFleet(t)

	// 1. Placement.
	stopSampling := f.peakLeases()
	runs := f.runAll(60, 2*fleetCapacity, "sleep 0.2") // no host can take them all
	peaks := stopSampling()
	perHost := map[string]int{}
	for _, r := range runs {
		require.NoError(t, r.err, "run %s", r.marker)
		f.assertRanOncePerLease(r)
		perHost[r.res.LeaseHost]++
	}
	t.Logf("60 runs per host: %v; most leases running a command at once: %v", perHost, peaks)
	for _, h := range f.hosts {
		assert.NotZero(t, perHost[h.Name], "host %s took no run", h.Name)
		assert.NotZero(t, peaks[h.Name], "the sampling saw no command on host %s", h.Name)
		assert.LessOrEqual(t, peaks[h.Name], fleetCapacity, "host %s held more leases than its capacity", h.Name)
	}
	f.assertNothingLeaked(f.hosts...)

	// 2. A host lost mid-run. The session's host is the one to die.
	t.Log("2. a host lost mid-run")
	sess, err := sandboxclient.StartSession(t.Context(), f.stack.Client,
		client.StartWorkflowOptions{ID: "fleet-session-" + rand.Text()[:8], TaskQueue: workflows.DefaultTaskQueue},
		workflows.SessionRequest{IdleTimeout: -1, ActivityOptions: fleetActivities(true)})
	require.NoError(t, err)
	first, err := sess.Execute(t.Context(), workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"sh", "-c", "echo kept > f"}}})
	require.NoError(t, err)
	require.True(t, first.Succeeded())
	state, err := sess.State(t.Context())
	require.NoError(t, err)
	victim := f.host(state.LeaseHost)

	held := make([]*fleetRun, 3*fleetCapacity-1) // the fleet is full
	for i := range held {
		held[i] = f.start(heldScript, true)
	}
	onVictim := map[string]string{} // marker → its lease on the dead host
	for _, r := range held {
		assert.EventuallyWithT(t, func(c *assert.CollectT) { assert.NotZero(c, f.ran(r.marker)) }, waitLong, poll, "run %s never ran", r.marker)
		for _, rec := range processes(victim.Sandbox, r.marker) {
			onVictim[r.marker] = rec.LeaseID
		}
	}
	t.Logf("host %s killed while it runs %d commands and holds the session's lease", victim.Name, len(onVictim))
	victim.Kill()
	stopReleasing := f.release(held, victim)
	defer stopReleasing()

	after, err := sess.Execute(t.Context(), workflows.SessionCommand{Command: sandbox.Command{Argv: []string{"cat", "f"}}})
	require.NoError(t, err)
	assert.True(t, after.WorkspaceReset, "the session's next command runs on a fresh lease")
	assert.NotZero(t, after.FreshLeases)
	assert.NotEqual(t, 0, after.ExitCode, "its workspace is new: %+v", after.Result)
	_, err = sess.Close(t.Context())
	require.NoError(t, err)

	for _, r := range held {
		f.wait(r)
		require.NoError(t, r.err, "run %s", r.marker)
		assert.NotEqual(t, victim.Name, r.res.LeaseHost, "run %s ended on the dead host", r.marker)
		f.assertRanOncePerLease(r)
		if lease, ok := onVictim[r.marker]; ok {
			assert.Contains(t, r.res.LostLeases, lease, "run %s gave its lease up with the host", r.marker)
			assert.GreaterOrEqual(t, len(f.leasesRan(r.marker)), 2, "run %s ran again elsewhere", r.marker)
		}
	}
	var survivors []*stack.Host
	for _, h := range f.hosts {
		if h != victim {
			survivors = append(survivors, h)
		}
	}
	f.assertNothingLeaked(survivors...)
	stopReleasing()
	stats, err := victim.Sandbox.Stats()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, stats.Leases, len(onVictim)+1, "the dead host still holds its runs' leases and the session's")

	require.NoError(t, victim.Return(t.Context()))
	f.assertNothingLeaked(victim) // its sweep found that nobody holds them

	// 3. A draining host takes no new lease.
	t.Log("3. a draining host")
	drained := survivors[0]
	drained.Worker().Drain()
	select {
	case <-drained.Worker().Drained():
	case <-time.After(waitShort):
		t.Fatalf("host %s holds %d leases after the drain", drained.Name, drained.Worker().Leases())
	}
	for _, r := range f.runAll(6, 6, "true") {
		require.NoError(t, r.err)
		assert.NotEqual(t, drained.Name, r.res.LeaseHost, "a draining host took a lease")
	}
	f.assertNothingLeaked(f.hosts...)
}
