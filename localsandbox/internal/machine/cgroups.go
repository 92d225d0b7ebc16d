package machine

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A lease's shape, enforced by the kernel.
//
// Each lease of a root server in namespace mode gets a control group, and
// its init is put in it before it forks anything, so every process of the
// lease is in it and cannot leave (the group's files are the host root's):
//
//	memory   the shape's memory; past it the kernel's OOM killer kills a
//	         process of the lease (never the server), counted in the view
//	pids     MaxProcesses tasks (processes and threads) for the whole lease
//	cpu      a CFS quota of the shape's vCPUs (vcpus × 100 ms per 100 ms)
//	freezer  pause and resume freeze and thaw the whole lease
//
// through github.com/containerd/cgroups/v3: cgroup v2 where the host's
// unified hierarchy delegates memory, pids and cpu to its root, v1 where
// the host mounts those controllers (this is the case on hybrid hosts whose
// v2 mount lacks them). What cannot be enforced is said at start, in every
// sandbox's view, and refused by Options.RequireLimits.

// cgroupVersion names the cgroup hierarchy a server uses.
type cgroupVersion string

const (
	cgroupNone cgroupVersion = ""
	cgroupV1   cgroupVersion = "v1"
	cgroupV2   cgroupVersion = "v2"
)

// cgroupHost is what a host offers: its cgroup mode, the controllers its
// v2 root delegates (cgroup.subtree_control, or cgroup.controllers where
// the server may enable them), and the v1 controllers it mounts writable.
type cgroupHost struct {
	mode          cgroups.CGMode
	v2Controllers []string
	v1Controllers []string
}

// leaseControllers are the controllers a lease needs.
var leaseControllers = []string{"memory", "pids", "cpu", "freezer"}

// chooseCgroups picks the hierarchy: v2 when the unified hierarchy has
// every controller (v2 has the freezer built in), else v1 when it has them,
// else none. missing lists what the chosen one lacks (none: everything).
func chooseCgroups(h cgroupHost) (v cgroupVersion, missing []string) {
	lacks := func(have []string, need []string) []string {
		var out []string
		for _, c := range need {
			found := false
			for _, h := range have {
				if h == c {
					found = true
				}
			}
			if !found {
				out = append(out, c)
			}
		}
		return out
	}
	if h.mode == cgroups.Unified || h.mode == cgroups.Hybrid {
		if m := lacks(h.v2Controllers, leaseControllers[:3]); len(m) == 0 {
			return cgroupV2, nil
		}
	}
	if h.mode == cgroups.Legacy || h.mode == cgroups.Hybrid {
		m := lacks(h.v1Controllers, leaseControllers)
		if len(m) < len(leaseControllers) {
			return cgroupV1, m
		}
	}
	return cgroupNone, leaseControllers
}

// cgroupRoot is where the host's cgroup file systems are.
const cgroupRoot = "/sys/fs/cgroup"

// probeCgroupHost reads what this host offers.
func probeCgroupHost() cgroupHost {
	h := cgroupHost{mode: cgroups.Mode()}
	unified := cgroupRoot
	if h.mode == cgroups.Hybrid {
		unified = filepath.Join(cgroupRoot, "unified")
	}
	if h.mode == cgroups.Unified || h.mode == cgroups.Hybrid {
		if b, err := os.ReadFile(filepath.Join(unified, "cgroup.controllers")); err == nil {
			h.v2Controllers = strings.Fields(string(b))
		}
	}
	if h.mode == cgroups.Legacy || h.mode == cgroups.Hybrid {
		for _, c := range leaseControllers {
			if writable(filepath.Join(cgroupRoot, c)) {
				h.v1Controllers = append(h.v1Controllers, c)
			}
		}
	}
	return h
}

func writable(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
	return err == nil && st.Mode().IsRegular() && unix.Access(dir, unix.W_OK) == nil
}

// Limiter makes the control groups of a server's leases.
type Limiter struct {
	version cgroupVersion
	missing []string // controllers the server cannot use
	parent  string   // the server's group, below the hierarchy's root
	v1      []string // the v1 controllers in use
}

// NewLimiter settles what the server on root can enforce. A server that is
// not root, or not in namespace mode, enforces nothing.
func NewLimiter(root string, namespaces bool) *Limiter {
	if os.Getenv(NoCgroupsEnv) != "" {
		namespaces = false
	}
	sum := sha256.Sum256([]byte(root))
	l := &Limiter{parent: "/sandboxd-" + hex.EncodeToString(sum[:6])}
	if !namespaces || os.Geteuid() != 0 {
		l.missing = leaseControllers
		return l
	}
	h := probeCgroupHost()
	l.version, l.missing = chooseCgroups(h)
	if l.version == cgroupV1 {
		l.v1 = h.v1Controllers
	}
	return l
}

// Version names the hierarchy in use: "v1", "v2", or "" (none).
func (lm *Limiter) Version() string { return string(lm.version) }

// Enforces reports whether controller c ("memory", "pids", "cpu",
// "freezer") is in use.
func (lm *Limiter) Enforces(c string) bool {
	if lm.version == cgroupNone {
		return false
	}
	for _, m := range lm.missing {
		if m == c {
			return false
		}
	}
	return true
}

// Cgroup is the control group of one lease.
type Cgroup interface {
	// AddProc moves a process into the group (the lease init, before it
	// forks anything; slirp4netns).
	AddProc(pid int) error
	// Freeze and Thaw pause and resume every process of the group
	// (freezer.go).
	Freeze() error
	Thaw() error
	// Stats reads the lease's counters; zero where unknown.
	Stats() CgroupStats
	Delete() error
}

// CgroupStats are a lease's kernel counters.
type CgroupStats struct {
	OOMKills          uint64
	MemoryBytes       uint64
	Tasks             uint64
	CPUThrottled      uint64 // periods
	CPUThrottledNanos uint64
}

// Limits are what the cgroup of a lease enforces: the shape's memory and
// vCPUs, and the server's MaxProcesses tasks.
type Limits struct {
	MemoryBytes int64
	MaxTasks    int64
	VCPUs       float64
}

// cpuPeriod is the CFS period, in µs.
const cpuPeriod = 100000

func (li Limits) cpuQuota() int64 { return int64(li.VCPUs * cpuPeriod) }

// Create makes the control group of a lease, or returns nil when the
// server enforces nothing. This is where a shape's limits are applied:
// memory.max (v2) or memory.limit_in_bytes (v1), pids.max, and the CFS
// quota (v1Resources, v2Resources).
func (lm *Limiter) Create(leaseID string, li Limits) (Cgroup, error) {
	group := lm.parent + "/" + leaseID
	switch lm.version {
	case cgroupV2:
		m, err := cgroup2.NewManager(cgroupRoot, group, v2Resources(li))
		if err != nil {
			return nil, fmt.Errorf("creating the lease's cgroup: %w", err)
		}
		return &v2Group{m: m, dir: filepath.Join(cgroupRoot, group)}, nil
	case cgroupV1:
		cg, err := cgroup1.New(cgroup1.StaticPath(group), v1Resources(li), cgroup1.WithHierarchy(lm.v1Hierarchy))
		if err != nil {
			return nil, fmt.Errorf("creating the lease's cgroup: %w", err)
		}
		g := &v1Group{cg: cg}
		if lm.Enforces("freezer") {
			g.freezerDir = filepath.Join(cgroupRoot, "freezer", group)
		}
		return g, nil
	}
	return nil, nil
}

// Sweep removes the groups of leases a previous server left (their
// processes are dead by then).
func (lm *Limiter) Sweep() {
	for _, d := range lm.parentDirs() {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.IsDir() {
				removeGroup(filepath.Join(d, e.Name()))
			}
		}
	}
}

// removeGroup removes an empty cgroup directory, waiting a little for
// processes that are still exiting to leave it.
func removeGroup(dir string) {
	for pause := time.Millisecond; ; pause *= 2 {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) || pause > time.Second {
			return
		}
		time.Sleep(pause)
	}
}

// Close removes the server's group, once its leases are gone.
func (lm *Limiter) Close() {
	for _, d := range lm.parentDirs() {
		os.Remove(d)
	}
}

// Dirs are the directories of the group of lease leaseID, one in each
// hierarchy in use.
func (lm *Limiter) Dirs(leaseID string) []string {
	var dirs []string
	for _, d := range lm.parentDirs() {
		dirs = append(dirs, filepath.Join(d, leaseID))
	}
	return dirs
}

// parentDirs are the directories of the server's group.
func (lm *Limiter) parentDirs() []string {
	var dirs []string
	switch lm.version {
	case cgroupV2:
		dirs = []string{filepath.Join(cgroupRoot, lm.parent)}
	case cgroupV1:
		for _, c := range lm.v1 {
			dirs = append(dirs, filepath.Join(cgroupRoot, c, lm.parent))
		}
	}
	return dirs
}

func (lm *Limiter) v1Hierarchy() ([]cgroup1.Subsystem, error) {
	var out []cgroup1.Subsystem
	for _, c := range lm.v1 {
		switch c {
		case "memory":
			out = append(out, cgroup1.NewMemory(cgroupRoot))
		case "pids":
			out = append(out, cgroup1.NewPids(cgroupRoot))
		case "cpu":
			out = append(out, cgroup1.NewCpu(cgroupRoot))
		case "freezer":
			out = append(out, cgroup1.NewFreezer(cgroupRoot))
		}
	}
	return out, nil
}

// v1Resources are the OCI resources of a lease (cgroup v1).
func v1Resources(li Limits) *specs.LinuxResources {
	period := uint64(cpuPeriod)
	quota := li.cpuQuota()
	mem, tasks := li.MemoryBytes, li.MaxTasks
	r := &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &mem},
		Pids:   &specs.LinuxPids{Limit: &tasks},
		CPU:    &specs.LinuxCPU{Period: &period, Quota: &quota},
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes")); err == nil {
		r.Memory.Swap = &mem // no swap beyond the memory
	}
	return r
}

// v2Resources are the resources of a lease (cgroup v2).
func v2Resources(li Limits) *cgroup2.Resources {
	period := uint64(cpuPeriod)
	quota := li.cpuQuota()
	mem, noSwap := li.MemoryBytes, int64(0)
	return &cgroup2.Resources{
		Memory: &cgroup2.Memory{Max: &mem, Swap: &noSwap},
		Pids:   &cgroup2.Pids{Max: li.MaxTasks},
		CPU:    &cgroup2.CPU{Max: cgroup2.NewCPUMax(&quota, &period)},
	}
}

type v1Group struct {
	cg         cgroup1.Cgroup
	freezerDir string // "" without a freezer
}

func (g *v1Group) AddProc(pid int) error { return g.cg.AddProc(uint64(pid)) }
func (g *v1Group) Freeze() error         { return freezeV1(g.freezerDir, true) }
func (g *v1Group) Thaw() error           { return freezeV1(g.freezerDir, false) }
func (g *v1Group) Delete() error         { return g.cg.Delete() }

func (g *v1Group) Stats() CgroupStats {
	var st CgroupStats
	m, err := g.cg.Stat(cgroup1.IgnoreNotExist)
	if err != nil || m == nil {
		return st
	}
	if m.MemoryOomControl != nil {
		st.OOMKills = m.MemoryOomControl.OomKill
	}
	if m.Memory != nil && m.Memory.Usage != nil {
		st.MemoryBytes = m.Memory.Usage.Usage
	}
	if m.Pids != nil {
		st.Tasks = m.Pids.Current
	}
	if m.CPU != nil && m.CPU.Throttling != nil {
		st.CPUThrottled = m.CPU.Throttling.ThrottledPeriods
		st.CPUThrottledNanos = m.CPU.Throttling.ThrottledTime
	}
	return st
}

type v2Group struct {
	m   *cgroup2.Manager
	dir string
}

func (g *v2Group) AddProc(pid int) error { return g.m.AddProc(uint64(pid)) }
func (g *v2Group) Freeze() error         { return freezeV2(g.dir, true) }
func (g *v2Group) Thaw() error           { return freezeV2(g.dir, false) }
func (g *v2Group) Delete() error         { return g.m.Delete() }

func (g *v2Group) Stats() CgroupStats {
	var st CgroupStats
	m, err := g.m.Stat()
	if err != nil || m == nil {
		return st
	}
	if m.MemoryEvents != nil {
		st.OOMKills = m.MemoryEvents.OomKill
	}
	if m.Memory != nil {
		st.MemoryBytes = m.Memory.Usage
	}
	if m.Pids != nil {
		st.Tasks = m.Pids.Current
	}
	if m.CPU != nil {
		st.CPUThrottled = m.CPU.NrThrottled
		st.CPUThrottledNanos = m.CPU.ThrottledUsec * 1000
	}
	return st
}

// NoCgroupsEnv, when set, makes a server act as on a host without cgroups
// (tests of the honest view and of RequireLimits).
const NoCgroupsEnv = "SANDBOXD_TEST_NO_CGROUPS"
