package machine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Pause freezes the whole lease through its cgroup's freezer: every
// process of the lease (its init too) stops where it is, cannot be woken
// by any signal, and nothing of it can fork, until resume thaws the group.
// A process in an uninterruptible wait can keep a group "FREEZING" for a
// while, so a freeze waits a bounded time (freezeTimeout) and thaws the
// group again when it does not settle. (containerd/cgroups' own Freeze
// waits without bound, which is why this file writes the state itself.)

// freezeTimeout bounds how long a freeze may take to settle.
const freezeTimeout = 5 * time.Second

// errNoFreezer means the lease's cgroup has no freezer.
var errNoFreezer = errors.New("no cgroup freezer")

// freezeV1 sets a v1 freezer group (dir) FROZEN or THAWED and waits until
// the kernel says it is.
func freezeV1(dir string, frozen bool) error {
	if dir == "" {
		return errNoFreezer
	}
	want := "THAWED"
	if frozen {
		want = "FROZEN"
	}
	file := filepath.Join(dir, "freezer.state")
	return settle(func() error { return os.WriteFile(file, []byte(want), 0) }, func() (bool, error) {
		b, err := os.ReadFile(file)
		return strings.TrimSpace(string(b)) == want, err
	}, func() { os.WriteFile(file, []byte("THAWED"), 0) }, frozen)
}

// freezeV2 sets cgroup.freeze of a v2 group (dir) and waits until
// cgroup.events says the group is (or is not) frozen.
func freezeV2(dir string, frozen bool) error {
	want := "0"
	if frozen {
		want = "1"
	}
	file := filepath.Join(dir, "cgroup.freeze")
	return settle(func() error { return os.WriteFile(file, []byte(want), 0) }, func() (bool, error) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		return strings.Contains(string(b), "frozen "+want+"\n"), err
	}, func() { os.WriteFile(file, []byte("0"), 0) }, frozen)
}

// settle writes a state and polls until it holds, for at most
// freezeTimeout; a freeze that does not settle is undone.
func settle(write func() error, holds func() (bool, error), undo func(), frozen bool) error {
	deadline := time.Now().Add(freezeTimeout)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		if err := write(); err != nil {
			return fmt.Errorf("freezer: %w", err)
		}
		ok, err := holds()
		if err != nil {
			return fmt.Errorf("freezer: %w", err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if frozen {
				undo()
			}
			return errors.New("freezer: the lease did not settle")
		}
		time.Sleep(pause)
	}
}
