package workflows_test

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// echoSandbox is the examples' stand-in for a sandbox service (createos.New,
// or sandboxd): it keeps leases in memory, and runs only echo, which prints
// its arguments.
type echoSandbox struct {
	mu     sync.Mutex
	next   int
	leases map[string]sandbox.Lease
}

func newEchoSandbox() *echoSandbox { return &echoSandbox{leases: map[string]sandbox.Lease{}} }

func (s *echoSandbox) CreateLease(_ context.Context, spec sandbox.LeaseSpec) (sandbox.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	l := sandbox.Lease{ID: fmt.Sprintf("sb-%d", s.next), Status: sandbox.StatusRunning, Labels: spec.Labels}
	s.leases[l.ID] = l
	return l, nil
}

func (s *echoSandbox) GetLease(_ context.Context, id string) (sandbox.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[id]
	if !ok {
		return sandbox.Lease{}, &sandbox.LeaseGoneError{LeaseID: id, Status: sandbox.StatusDestroyed}
	}
	return l, nil
}

func (s *echoSandbox) DestroyLease(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.leases, id)
	return nil
}

func (s *echoSandbox) ListLeases(context.Context, map[string]string) ([]sandbox.Lease, error) {
	return nil, nil // nothing to sweep: no create response is ever lost here
}

func (s *echoSandbox) Execute(_ context.Context, _ sandbox.Lease, cmd sandbox.Command, obs sandbox.Observer) (sandbox.Result, error) {
	proc := sandbox.Process{ID: "p-1"}
	if err := obs.Started(proc); err != nil {
		return sandbox.Result{}, err
	}
	if cmd.Argv[0] != "echo" {
		return sandbox.Result{ProcessID: proc.ID, ExitCode: 127, Stderr: cmd.Argv[0] + ": not found\n"}, nil
	}
	return sandbox.Result{ProcessID: proc.ID, Stdout: strings.Join(cmd.Argv[1:], " ") + "\n"}, nil
}

func (s *echoSandbox) Attach(ctx context.Context, l sandbox.Lease, _ sandbox.Process, _ sandbox.Observer) (sandbox.Result, error) {
	return sandbox.Result{}, &sandbox.LeaseGoneError{LeaseID: l.ID, Status: sandbox.StatusDestroyed}
}

func (s *echoSandbox) PauseLease(context.Context, string) error          { return nil }
func (s *echoSandbox) ResumeLease(context.Context, string) error         { return nil }
func (s *echoSandbox) SetEgress(context.Context, string, []string) error { return nil }
func (s *echoSandbox) ForkLease(ctx context.Context, id string, _ sandbox.ForkSpec) (sandbox.Lease, error) {
	return s.CreateLease(ctx, sandbox.LeaseSpec{})
}
