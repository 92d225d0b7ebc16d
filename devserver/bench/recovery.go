package bench

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sandboxflow/sandboxflow/faultproxy"
	"github.com/sandboxflow/sandboxflow/workflows"
)

// loseProcessCreate makes the proxy forward one process create and reset
// the connection instead of answering: the process exists, its id never
// reaches the worker, and the lease must be given up.
var loseProcessCreate = faultproxy.Rule{
	Name:   "lose the process create response",
	Method: http.MethodPost,
	Path:   "/sandboxes/*/processes",
	Times:  1,
	Fault:  faultproxy.DropResponse(),
}

// Recovery is P4: the time of RunCommand(`true`) whose process create
// response is lost, which recovers by compensation (destroy the lease,
// acquire a fresh one, run again), beside a clean run. Both go through
// proxy to the worker polling queue; runs alternate, and the row gives the
// medians. Every faulted run must have taken exactly one fresh lease, and
// every clean one none.
func Recovery(ctx context.Context, env *Env, queue string, proxy *faultproxy.Proxy, runs int) ([]Row, error) {
	var clean, faulted []time.Duration
	for range runs {
		proxy.ClearRules()
		d, err := timedRecovery(ctx, env, queue, 0)
		if err != nil {
			return nil, fmt.Errorf("clean run: %w", err)
		}
		clean = append(clean, d)

		proxy.AddRule(loseProcessCreate)
		fired := len(proxy.Log())
		d, err = timedRecovery(ctx, env, queue, 1)
		proxy.ClearRules()
		if err != nil {
			return nil, fmt.Errorf("run with a lost create response: %w", err)
		}
		if len(proxy.Log()) != fired+1 {
			return nil, fmt.Errorf("run with a lost create response: the proxy injected %d faults, want 1", len(proxy.Log())-fired)
		}
		faulted = append(faulted, d)
	}
	env.Logf("P4: lost create response %v, clean %v", Quantile(faulted, 0.5), Quantile(clean, 0.5))
	return []Row{{
		Name:      "P4 recovery: RunCommand(`true`) with a lost process-create response",
		Figure:    Millis(Quantile(faulted, 0.5)),
		FloorName: "clean run",
		Floor:     Millis(Quantile(clean, 0.5)),
		Target:    Target{MaxRatio: 3},
	}}, nil
}

func timedRecovery(ctx context.Context, env *Env, queue string, wantFresh int) (time.Duration, error) {
	var res workflows.Result
	d, err := timed(func() error {
		var err error
		res, err = env.runCommand(ctx, queue, "p4", workflows.Request{Command: trueCommand})
		return err
	})
	if err == nil && res.FreshLeases != wantFresh {
		err = fmt.Errorf("took %d fresh leases, want %d", res.FreshLeases, wantFresh)
	}
	return d, err
}
