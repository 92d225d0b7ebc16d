// Package workflows runs commands in sandboxes as Temporal workflows.
//
// [RunCommand] is the workflow of one command; [Run] runs the same steps
// inline from your own workflow code. [SessionWorkflow] runs many commands
// on one lease (see Sessions below). RunCommand and Run read top to bottom
// as:
//
//	EnsureTemplate, when Request.Dockerfile is set (built once per content)
//	CreateLease (or use Request.LeaseID)
//	Execute
//	  └─ lease unusable? compensation (below): DestroyLease(old) →
//	     AcquireFreshLease → Execute again
//	DestroyLease + sweep of the run's orphans, always (unless KeepLease), even
//	when the run failed or was cancelled
//
// A run that is terminated, or times out, cannot release anything: the
// reaper ([Reaper], run by a Temporal Schedule that the worker creates,
// [EnsureReaperSchedule]) destroys its lease once the run has been closed
// for ReaperRequest.ClosedFor. Start RunCommand children with
// ParentClosePolicy REQUEST_CANCEL rather than the SDK's default
// TERMINATE, so that a closing parent's child releases its lease itself.
//
// # Compensation
//
// One policy, the same for RunCommand, Run and every command of a
// SessionWorkflow, written once (compensation.go):
//
//   - A lease is unusable after a SandboxCleanupError (it may hold an
//     orphan process), a SandboxLeaseGone or a SandboxHostLost (on a
//     fleet, below): sandbox.LeaseUnusable, read from the sandbox taxonomy
//     (sandbox.Kinds). It is destroyed at once — or, when its host is
//     lost, left to that host's sweep (LostLeases) — and never used again,
//     whatever the budget; in a session also when it is found gone on
//     resume or while idle.
//   - A fresh lease (AcquireFreshLease: any lease after the run's first)
//     then replaces it. Each command may take MaxFreshLeases of them (2 by
//     default; a negative value disables compensation); they are counted
//     as FreshLeases, in State, Result, SessionResult and SessionSummary.
//   - A command that needs one more fails with SandboxCompensationExhausted
//     (IsCompensationExhausted), non-retryable, with CompensationDetails
//     naming the fresh leases taken and the leases destroyed, and wrapping
//     the failure that cost the last lease.
//
// Which failures an activity retries is decided by the same taxonomy
// (sandbox.NonRetryableTypes): the retry policies below list exactly its
// non-retryable types.
//
// # Where each failure goes
//
// The one table of every failure, its type name, whether it is retried and
// what the workflow does with it is docs/RELIABILITY.md, "Where each
// failure goes" (held to sandbox.Kinds by a test of package sandbox). In
// short: a non-zero exit or a timeout is a Result; an unusable lease goes
// to compensation; SandboxUnavailable, SandboxAPIError 5xx/429 and
// OutputConnectionError are retried by the activity's retry policy, then
// fail with that type; a worker that dies mid-command is followed by a
// retry that re-attaches to the running process; every other failure ends
// the run at once, its process killed and its lease destroyed.
//
// Execute's attempts are not counted: its MaximumAttempts is a budget of
// failures of the sandbox service that the activity keeps
// (withFailureBudget, activities.ExecuteInput.MaxFailures), and worker
// deaths and detaches are free. Its attempts are bounded by its
// ScheduleToCloseTimeout, the command's timeout plus ExecuteHorizon;
// past it the run fails with SandboxUnattended and destroys the lease.
//
// The default activity options, written once in this package (options.go):
//
//	activity           start-to-close        heartbeat  retries
//	CreateLease        5 min                 30 s       5 attempts, 1 s → 30 s
//	Execute            timeout + 5 min,      20 s       4 failures, attempts unlimited, 1 s → 10 s
//	                   timeout + 1 h all
//	                   (24 h without one)
//	DestroyLease       5 min a try, 24 h all 30 s       unlimited within 24 h, 1 s → 1 min
//	AcquireFreshLease  10 min                30 s       5 attempts, 1 s → 30 s
//	PauseLease,        2 min                 30 s       5 attempts, 1 s → 30 s
//	  ResumeLease,
//	  SetEgress (sessions)
//	ForkLease,         10 min                30 s       5 attempts, 1 s → 30 s
//	  SnapshotLease (sessions)
//	EnsureTemplate     35 min                30 s       5 attempts, 1 s → 30 s
//
// On a fleet, every activity on a lease also waits at most
// DefaultHostStartTimeout (1 min) for its host to take it
// (ScheduleToStartTimeout), and a placement as long as it takes for a host
// with room.
//
// Every non-retryable type of the sandbox taxonomy is also listed in the
// retry policies' NonRetryableErrorTypes; activities mark each failure
// retryable or not themselves, from the same table, so the policies cannot
// get it wrong. Request.ActivityOptions overrides any of these.
//
// # Sessions
//
// A session owns one lease and runs commands on it one at a time, in the
// order its Updates were accepted, each through the same Execute activity
// and the same compensation as RunCommand:
//
//	Update      input           returns         what it does
//	execute     SessionCommand  SessionResult   runs the command; an unusable lease is replaced
//	                                            (compensation), the command runs again on the
//	                                            fresh one and WorkspaceReset is set
//	pause       —               SessionState    pauses the lease (the next command resumes it)
//	resume      —               SessionState    resumes it
//	set_egress  SessionEgress   SessionState    replaces the egress rules of the lease (resumed
//	                                            first if paused) and of every later lease: a
//	                                            fresh one, a fork's, after continue-as-new
//	fork        —               SessionFork     pauses the lease, forks it (ForkLease) and starts
//	                                            a new session on the fork; the lease stays paused
//	snapshot    SessionSnapshot sandbox.Template keeps the lease as a template (SnapshotLease)
//	close       —               SessionSummary  runs what is queued, destroys the lease, ends
//	query state                 SessionState
//
// The execute, set_egress and snapshot validators reject invalid input
// before it enters history; a closing session rejects every Update
// (SandboxSessionClosed). A session whose request has a Dockerfile (Image,
// as Request's) runs EnsureTemplate before it performs its first Update,
// which waits meanwhile, and makes every lease on the template.
//
// A forked session is a child with the parent-close policy ABANDON: it
// outlives the session it was forked from, and whoever asked for the fork
// closes it. Its lease is labelled with its own run key from the start,
// so its release sweeps a fork whose answer was lost; a fork that fails
// (SandboxCleanupError with reason fork_unconfirmed, when its answer was
// lost and it could not be found) is swept by the forking session at once,
// and leaves that session's lease as it was.
// An idle lease is paused after IdleTimeout (5 min). After CommandsPerRun
// commands (200), or when Temporal suggests it, the session continues as
// new, carrying its lease and the answers to its last execute Updates: the
// server deduplicates Update ids within one run only, so a repeat of an
// Update on the next run (an UpdateSession activity retried after its
// worker died) gets the recorded answer instead of running the command
// again. Cancelling it destroys the lease; from a
// workflow, OpenSession starts it as a child with the parent-close policy
// REQUEST_CANCEL, so a parent that ends without closing it still releases
// the lease. Any workflow can use a running session by its id
// (AttachSession): workflows send Updates through the UpdateSession
// activity. Go code uses sandboxclient.SessionClient (sandboxclient.StartSession, AttachSessionClient).
//
// # Fleets of sandbox hosts
//
// One sandbox service shared by every worker (the hosted service, or one
// sandboxd) needs nothing more. A fleet of hosts, each running its own
// sandboxd, does: a lease exists on one host only. Run a worker in host
// mode on each host (the worker binary's --host NAME: internal/workerapp),
// all on the same Temporal namespace and task queue — the fleet's shared
// queue, where the workflows run — and nothing changes for callers of
// RunCommand, Run and sessions. The routing policy, written once
// (fleet.go):
//
//	activity                            task queue
//	CreateLease, AcquireFreshLease,     PlacementTaskQueue(shared): any host with room,
//	  EnsureTemplate (placement)          whichever polls first
//	CreateLease, AcquireFreshLease      HostTaskQueue(shared, template's host): each host
//	  of a run on a Dockerfile            keeps its own templates
//	every activity on a lease           HostTaskQueue(shared, lease.Host): the lease's host,
//	  (Execute, DestroyLease, pause,      with a schedule-to-start timeout
//	  resume, fork, egress)               (DefaultHostStartTimeout)
//	UpdateSession                       the workflow's own queue
//
// The activities of a host-mode worker name their host on every lease they
// return (sandbox.Lease.Host), so the host travels with the lease: in a
// session's state across continue-as-new, into a forked session (the fork
// lives on its source's host), in Result.LeaseHost. A request naming an
// existing lease on a fleet names its host too (Request.LeaseHost);
// without it the run fails as SandboxInvalidInput. Off a fleet, a lease
// names no host and every activity runs where it always did.
//
// A run or session with a Dockerfile builds its template once, on the host
// that takes EnsureTemplate, which names itself on the template
// (sandbox.Template.Host); every lease of the run is then created on that
// host, the only one that has the template, and a session carries the
// host across continue-as-new and into its forks.
//
// Placement is Temporal's: a host polls the placement queue only while it
// holds fewer leases than its capacity, so a full host takes no create and
// a draining one none at all.
//
// A host that dies (or is cut off) takes no more work: an activity on its
// queue times out on schedule-to-start — a command it was running first
// misses its heartbeats, and its retry waits there — and fails as
// SandboxHostLost. Compensation gives the lease up without a DestroyLease
// that nobody would take (LostLeases), and runs the command again on a
// fresh lease from another host: a command whose host is lost may have
// run there, so it runs once more per host lost, like after an
// unconfirmed kill. A release whose host is lost ends the run (the lease
// goes to LostLeases; the state no longer names it) instead of waiting a
// day. Nothing sweeps a dead host, so nothing hangs on it: when the host
// comes back, its worker sweeps the leases no workflow holds (SweepHost),
// as it does every so often anyway — among them the orphans of creates
// whose answer was lost while the retry landed elsewhere.
//
// # In the Web UI
//
// Every activity carries a summary ("execute `make test` in lease sbx-1"),
// the workflow's current details show its phase, lease and fresh leases,
// and, where the namespace has them, the keyword search attributes
// SandboxLeaseID and SandboxPhase find runs by lease or phase.
//
// # Layout
//
// Three kinds of code live here, in files named for what they hold:
//
//	workflow code (deterministic)   runcommand.go, session.go, compensation.go,
//	                                session_answers.go, session_egress.go,
//	                                session_fork.go, session_handle.go (Session),
//	                                state.go, options.go, request.go, session_types.go,
//	                                fleet.go (where every activity runs),
//	                                execute_activity.go (the one gateway to them),
//	                                reaper.go, fleet_sweep.go (SweepHost)
//	the UpdateSession activity      activity_updatesession.go
//	Go client helpers               package sandboxclient (SessionClient, StartSession)
//
// # Changing the workflow
//
// The workflow code is deterministic. Histories of earlier versions are
// replayed in tests (testdata/*.json); any change to the sequence of
// commands must go behind workflow.GetVersion.
package workflows

//go:generate go run ../internal/schemagen -root ..
