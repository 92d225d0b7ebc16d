//go:build linux

package localsandboxtest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/localsandbox"
	"github.com/sandboxflow/sandboxflow/sandbox"
)

func TestCheckNothingLeakedSeesALeaseAndItsProcesses(t *testing.T) {
	ls := StartLocalSandbox(t, localsandbox.Options{})
	provider, err := ls.Provider(createos.Config{})
	require.NoError(t, err)
	require.NoError(t, ls.CheckNothingLeaked())

	ctx, cancel := context.WithCancelCause(t.Context())
	lease, err := provider.CreateLease(ctx, sandbox.LeaseSpec{})
	require.NoError(t, err)
	assert.ErrorContains(t, ls.CheckNothingLeaked(), "1 leases", "a lease left is a leak")

	// Leave a command running: detach once it has started.
	_, err = provider.Execute(ctx, lease, sandbox.Command{Argv: []string{"sh", "-c", "echo up; exec sleep 600"}},
		observerFunc(func(sandbox.Chunk) { cancel(sandbox.ErrDetached) }))
	require.ErrorIs(t, err, sandbox.ErrDetached)
	assert.ErrorContains(t, ls.CheckNothingLeaked(), "processes")

	require.NoError(t, provider.DestroyLease(t.Context(), lease.ID))
	assert.NoError(t, ls.CheckNothingLeaked(), "destroying the lease kills its processes")
}

type observerFunc func(sandbox.Chunk)

func (observerFunc) Started(sandbox.Process) error { return nil }
func (f observerFunc) Output(c sandbox.Chunk)      { f(c) }
