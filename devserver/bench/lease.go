package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// BwrapArgv is the floor of the lease rows: Debian's bubblewrap starting
// `true` in new user, mount, PID, UTS, IPC, network and cgroup namespaces
// with the host's root read-only.
var BwrapArgv = []string{"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"}

// ErrNoBwrap is why the lease rows cannot be measured on a machine
// without bubblewrap.
var ErrNoBwrap = errors.New("bwrap is not installed; it is the floor of the P6 rows: " +
	"install Debian's bubblewrap as root (apt-get install -y bubblewrap; `make bench` does it), or leave p6 out with -only")

// CheckBwrap returns ErrNoBwrap when bwrap is not on PATH.
func CheckBwrap() error {
	if _, err := exec.LookPath(BwrapArgv[0]); err != nil {
		return ErrNoBwrap
	}
	return nil
}

// SandboxAPI reaches the sandbox server's HTTP API directly, for what the
// provider has no method for (fork).
type SandboxAPI struct {
	// URL is the server's origin (without /v1), Key its API key.
	URL, Key string
}

// forkBlobMiB is the size of the upper layer of the lease that P6 forks.
const forkBlobMiB = 100

// pollInterval is how often P6 asks whether a lease reached the state it
// waits for: the server signals nothing, so a wait ends up to this late.
const pollInterval = 5 * time.Millisecond

// LeaseMachine is P6, what a lease costs as a machine, through the
// provider (the createos client to the sandbox server over loopback):
//
//   - Execute of `true` on a lease that exists, beside bwrap starting
//     `true` in namespaces of its own (BwrapArgv), in the same process,
//     interleaved round by round; target ≤ 2× bwrap. Beside them, the
//     server's own POST /exec of `true` on the same lease (one request, no
//     script, no start gate): what of Execute is the sandbox server's.
//   - A lease created and destroyed, beside the same bwrap runs: the floor
//     is the kernel's cost of namespaces; the target is an absolute
//     ≤ 50 ms (issue 29), since a lease is more than namespaces (its own
//     ext4 disk on a loop device, cgroups, an init) and no ratio to bwrap
//     would say whether create is fast enough.
//   - forkRuns forks of a paused lease whose upper layer holds 100 MiB
//     (POST /v1/sandboxes/{id}/fork, until the fork is running), beside
//     `cp -a` of a host directory holding 100 MiB in the same run.
//
// Two rounds of warm-up of the first two are not counted.
func LeaseMachine(ctx context.Context, env *Env, api SandboxAPI, runs, forkRuns int) ([]Row, error) {
	if err := CheckBwrap(); err != nil {
		return nil, err
	}
	lease, err := env.Provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		return nil, fmt.Errorf("create lease: %w", err)
	}
	defer env.Provider.DestroyLease(context.WithoutCancel(ctx), lease.ID)

	const warmup = 2
	var execute, direct, bwrap, lifecycle []time.Duration
	for i := range warmup + runs {
		e, err := timed(func() error { return mustSucceed(env.Provider.Execute(ctx, lease, trueCommand, nil)) })
		if err != nil {
			return nil, fmt.Errorf("execute `true`: %w", err)
		}
		d, err := timed(func() error { return api.execTrue(ctx, lease.ID) })
		if err != nil {
			return nil, err
		}
		b, err := timed(func() error { return runBwrap(ctx) })
		if err != nil {
			return nil, err
		}
		c, err := timed(func() error { return createDestroy(ctx, env) })
		if err != nil {
			return nil, err
		}
		if i >= warmup {
			execute, direct, bwrap, lifecycle = append(execute, e), append(direct, d), append(bwrap, b), append(lifecycle, c)
		}
	}
	env.Logf("P6: execute median %v, POST /exec %v, create+destroy %v, bwrap %v",
		Quantile(execute, 0.5), Quantile(direct, 0.5), Quantile(lifecycle, 0.5), Quantile(bwrap, 0.5))

	fork, cp, err := forkRounds(ctx, env, api, forkRuns)
	if err != nil {
		return nil, err
	}
	env.Logf("P6: fork of %d MiB median %v, cp -a %v", forkBlobMiB, Quantile(fork, 0.5), Quantile(cp, 0.5))
	return leaseRows(leaseSamples{execute, direct, lifecycle, bwrap, fork, cp}), nil
}

// leaseSamples are P6's measurements.
type leaseSamples struct {
	// execute: Execute(`true`) through the provider; direct: POST /exec
	// of `true`; lifecycle: create + destroy; bwrap: BwrapArgv.
	execute, direct, lifecycle, bwrap []time.Duration
	// fork: a fork of the 100 MiB lease until it runs; cp: `cp -a` of
	// 100 MiB on the host.
	fork, cp []time.Duration
}

// leaseRows makes P6's rows of its samples.
func leaseRows(s leaseSamples) []Row {
	const bwrapName = "`bwrap --unshare-all … true`"
	bwrap := Millis(Quantile(s.bwrap, 0.5))
	return []Row{
		{
			Name:   "P6 latency, median: Execute(`true`) on an existing lease, direct provider",
			Figure: Millis(Quantile(s.execute, 0.5)), FloorName: bwrapName, Floor: bwrap,
			Target: Target{MaxRatio: 2},
		},
		{
			Name:   "P6 latency, median: POST /exec of `true` on an existing lease, sandbox server's API",
			Figure: Millis(Quantile(s.direct, 0.5)), FloorName: bwrapName, Floor: bwrap,
		},
		{
			Name:   "P6 latency, median: create + destroy of a lease, direct provider",
			Figure: Millis(Quantile(s.lifecycle, 0.5)), FloorName: bwrapName, Floor: bwrap,
			Target: Target{MaxFigure: 50},
		},
		{
			Name:   fmt.Sprintf("P6 latency, median: fork of a paused lease with %d MiB in its upper layer, until running", forkBlobMiB),
			Figure: Millis(Quantile(s.fork, 0.5)), FloorName: fmt.Sprintf("`cp -a` of %d MiB on the host", forkBlobMiB), Floor: Millis(Quantile(s.cp, 0.5)),
		},
	}
}

// mustSucceed is an error unless the command ran and exited 0.
func mustSucceed(res sandbox.Result, err error) error {
	if err == nil && !res.Succeeded() {
		err = fmt.Errorf("the command did not succeed (exit %d)", res.ExitCode)
	}
	return err
}

func runBwrap(ctx context.Context) error {
	if out, err := exec.CommandContext(ctx, BwrapArgv[0], BwrapArgv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("bwrap: %w: %.200s", err, out)
	}
	return nil
}

// createDestroy creates a lease through the provider and destroys it.
func createDestroy(ctx context.Context, env *Env) error {
	lease, err := env.Provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	if err := env.Provider.DestroyLease(ctx, lease.ID); err != nil {
		return fmt.Errorf("destroy lease: %w", err)
	}
	return nil
}

// forkRounds forks a paused lease holding forkBlobMiB in its upper layer
// runs times, and copies a host directory of the same size as many times,
// interleaved.
func forkRounds(ctx context.Context, env *Env, api SandboxAPI, runs int) (fork, cp []time.Duration, err error) {
	src, err := env.Provider.CreateLease(ctx, sandbox.LeaseSpec{})
	if err != nil {
		return nil, nil, fmt.Errorf("create the lease to fork: %w", err)
	}
	defer env.Provider.DestroyLease(context.WithoutCancel(ctx), src.ID)
	write := sandbox.Command{Argv: []string{"sh", "-c", fmt.Sprintf("head -c %dM /dev/urandom > /root/blob", forkBlobMiB)}}
	if err := mustSucceed(env.Provider.Execute(ctx, src, write, nil)); err != nil {
		return nil, nil, fmt.Errorf("write %d MiB in the lease: %w", forkBlobMiB, err)
	}
	if err := env.Provider.PauseLease(ctx, src.ID); err != nil {
		return nil, nil, fmt.Errorf("pause the lease: %w", err)
	}
	if err := awaitStatus(ctx, env, src.ID, sandbox.StatusPaused); err != nil {
		return nil, nil, err
	}

	host, err := os.MkdirTemp("", "sandboxflow-bench-cp-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(host)
	from := filepath.Join(host, "from")
	if err := os.Mkdir(from, 0o755); err != nil {
		return nil, nil, err
	}
	if out, err := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("head -c %dM /dev/urandom > %s/blob", forkBlobMiB, from)).CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("write %d MiB on the host: %w: %.200s", forkBlobMiB, err, out)
	}

	for i := range runs {
		f, err := timedFork(ctx, env, api, src.ID)
		if err != nil {
			return nil, nil, err
		}
		to := filepath.Join(host, fmt.Sprint("copy", i))
		c, err := timed(func() error {
			out, err := exec.CommandContext(ctx, "cp", "-a", from, to).CombinedOutput()
			if err != nil {
				return fmt.Errorf("cp -a: %w: %.200s", err, out)
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
		if err := os.RemoveAll(to); err != nil {
			return nil, nil, err
		}
		fork, cp = append(fork, f), append(cp, c)
	}
	return fork, cp, nil
}

// timedFork forks the paused lease src, times it until the fork runs,
// then destroys the fork.
func timedFork(ctx context.Context, env *Env, api SandboxAPI, src string) (time.Duration, error) {
	start := time.Now()
	id, err := api.fork(ctx, src)
	if err != nil {
		return 0, err
	}
	defer env.Provider.DestroyLease(context.WithoutCancel(ctx), id)
	if err := awaitStatus(ctx, env, id, sandbox.StatusRunning); err != nil {
		return 0, fmt.Errorf("fork %s: %w", id, err)
	}
	return time.Since(start), nil
}

// awaitStatus polls the lease until it is in want; a lease that settles
// in another state is an error.
func awaitStatus(ctx context.Context, env *Env, id string, want sandbox.LeaseStatus) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		lease, err := env.Provider.GetLease(ctx, id)
		if err != nil {
			return fmt.Errorf("wait for %s to be %s: %w", id, want, err)
		}
		if lease.Status == want {
			return nil
		}
		if !lease.Status.Transitional() {
			return fmt.Errorf("wait for %s to be %s: it is %s", id, want, lease.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s to be %s: %w", id, want, ctx.Err())
		case <-tick.C:
		}
	}
}

// fork asks the server to fork the paused lease src and returns the id of
// the fork (PROTOCOL [ext]: POST /v1/sandboxes/{id}/fork).
func (a SandboxAPI) fork(ctx context.Context, src string) (string, error) {
	var data struct {
		ID string `json:"id"`
	}
	if err := a.post(ctx, src, "fork", map[string]any{}, &data); err != nil {
		return "", err
	}
	if data.ID == "" {
		return "", fmt.Errorf("fork %s: an answer without an id", src)
	}
	return data.ID, nil
}

// execTrue runs `true` in the lease with POST /v1/sandboxes/{id}/exec,
// the server's own one-request command (no script, no start gate).
func (a SandboxAPI) execTrue(ctx context.Context, lease string) error {
	var data struct {
		Result *struct {
			ExitCode int `json:"exit_code"`
		} `json:"result"`
	}
	if err := a.post(ctx, lease, "exec", map[string]any{"cmd": "true"}, &data); err != nil {
		return err
	}
	if data.Result == nil || data.Result.ExitCode != 0 {
		return fmt.Errorf("exec %s: `true` did not exit 0", lease)
	}
	return nil
}

// post sends body to POST /v1/sandboxes/{lease}/{verb} and decodes the
// answer's data into out. Errors name the request, never the key.
func (a SandboxAPI) post(ctx context.Context, lease, verb string, body, out any) error {
	if err := sandbox.CheckID("lease id", lease); err != nil {
		return err
	}
	what := verb + " " + lease
	payload, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.URL+"/v1/sandboxes/"+lease+"/"+verb, bytes.NewReader(payload))
	if err != nil {
		return err
	}
	req.Header.Set("X-Api-Key", a.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: read the answer: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %.200s", what, resp.Status, answer)
	}
	envelope := struct {
		Data any `json:"data"`
	}{out}
	if err := json.Unmarshal(answer, &envelope); err != nil {
		return fmt.Errorf("%s: an answer that does not parse: %w", what, err)
	}
	return nil
}
