package localsandbox

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/template"
)

// Lease states, as the protocol names them.
const (
	stateRunning   = "running"
	statePausing   = "pausing"
	statePaused    = "paused"
	stateResuming  = "resuming"
	stateError     = "error"
	stateDestroyed = "destroyed"
	// stateForking: a fork whose root is being copied, not running yet.
	stateForking = "forking"
	// stateBeingForked is not a state: a paused lease being copied cannot
	// resume, and says so.
	stateBeingForked = "being forked"
)

// sandboxPath is the search path of commands.
const sandboxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// lease is one sandbox: a workspace and a tmp directory on the host, and the
// managed processes running against them.
type lease struct {
	server    *Server
	deleting  sync.Mutex // one destroySandbox at a time: the API's and the lease's own
	id        string
	shape     shape
	labels    map[string]string
	created   time.Time
	isolation Isolation
	// uid and gid are the host ids of the lease's root. A root server in
	// namespace mode gives every lease a range of machine.IDsPerLease host
	// ids of its own (idSlot, see machine/ids.go), so that leases share no
	// uid with each other or with the host's users; otherwise (idSlot -1)
	// they are the server's HostUID/HostGID.
	uid, gid int
	idSlot   int

	rootfs  string           // the image's name (images.go); "" = the default (the server's probe)
	machine *machine.Machine // the lease init (namespace mode)
	cgroup  machine.Cgroup   // nil when the server enforces no limits
	disk    *machine.Disk    // nil when the server does not bound disks
	diskMax int64            // the lease's disk_mib in bytes (guarded by mu: a resize grows it)
	net     *network.Net     // the network namespace the server made (network.go), or nil
	netSpec netSpec          // the egress and ingress it was created with

	// name is unique among the live leases; envs are set in every
	// command's environment (their values are never shown).
	name       string
	envs       map[string]string
	forkedFrom string // the source of a fork
	// defaults are what the Dockerfile of the lease's template left set
	// (its ENV beneath envs, its WORKDIR), fixed at create: env and
	// resolveCwd.
	defaults template.Config

	sshPubkeys []string // stored and shown (api_sshkeys.go); guarded by mu

	dir           string // <root>/leases/<id> on the host
	workspaceHost string
	tmpHost       string
	workspace     string // the workspace as the lease's processes see it
	tmp           string // the tmp dir as the lease's processes see it

	// spawning counts process starts in flight; they began while the lease
	// was running, and a pause or destroy waits for them.
	spawning sync.WaitGroup

	// ingressInFlight counts the lease's preview requests being proxied;
	// guarded by Server.ingress.mu (ingress.go).
	ingressInFlight int

	mu     sync.Mutex
	idle   idleClock
	forks  int // forks copying this lease now: it may not resume
	state  string
	procs  map[string]*process
	exited []*process // exited processes still answered for, oldest first

	// When the lease first ran, last paused and last resumed (zero: never),
	// and how long it took to start running; guarded by mu.
	runningAt, pausedAt, resumedAt time.Time
	spawnTime                      time.Duration
}

// leaseSpec is what a create asks for.
type leaseSpec struct {
	shape  shape
	labels map[string]string
	rootfs string // the image's canonical name (resolveImage)
	disk   int64  // bytes of the lease's disk
	// autoPause pauses the lease once idle that long (0: never).
	autoPause time.Duration
	net       netSpec

	name       string            // reserved by reserveName
	envs       map[string]string // checked by checkEnv
	sshPubkeys []string          // checked by checkSSHPubkey
	forkedFrom string            // the source of a fork
	defaults   template.Config   // the template's (templateStore.config)
}

// newLease creates the lease's directories and, in namespace mode, starts
// its machine.
func (s *Server) newLease(id string, spec leaseSpec) (*lease, error) {
	l, err := s.newLeaseDirs(id, spec, stateRunning)
	if err != nil {
		return nil, err
	}
	if err := s.seedWorkspace(l); err != nil { // a snapshot's (templates.go)
		l.removeDirs()
		return nil, err
	}
	if err := s.startLease(l); err != nil {
		return nil, err
	}
	l.runningAt = time.Now()
	l.startIdleClock(spec.autoPause)
	return l, nil
}

// newLeaseDirs makes the lease's directories (on a disk of its own where
// disks are bounded), in the given state.
func (s *Server) newLeaseDirs(id string, spec leaseSpec, state string) (*lease, error) {
	l := &lease{
		server:    s,
		id:        id,
		shape:     spec.shape,
		labels:    spec.labels,
		rootfs:    spec.rootfs,
		diskMax:   spec.disk,
		netSpec:   spec.net,
		created:   time.Now(),
		isolation: s.isolation,
		dir:       filepath.Join(s.opts.Root, leasesDir, id),
		state:     state,
		procs:     make(map[string]*process),

		name:       spec.name,
		envs:       spec.envs,
		sshPubkeys: spec.sshPubkeys,
		forkedFrom: spec.forkedFrom,
		defaults:   spec.defaults,
	}
	l.workspaceHost = filepath.Join(l.dir, leaseinit.WorkspaceDir)
	l.tmpHost = filepath.Join(l.dir, leaseinit.TmpDir)
	if l.isolation == IsolationNamespaces {
		l.workspace, l.tmp = leaseinit.Workspace, leaseinit.Tmp
	} else {
		l.workspace, l.tmp = l.workspaceHost, l.tmpHost
	}
	// Made its server's alone; guardDir opens it to the lease's ids.
	if err := os.Mkdir(l.dir, 0o700); err != nil {
		return nil, err
	}
	l.uid, l.gid, l.idSlot = s.hostUID, s.hostGID, -1
	if l.isolation == IsolationNamespaces && os.Geteuid() == 0 {
		slot, err := s.ids.Take()
		if err != nil {
			os.Remove(l.dir)
			return nil, noCapacity(err)
		}
		l.idSlot = slot
		l.uid = s.opts.HostIDBase + slot*machine.IDsPerLease
		l.gid = l.uid
	}
	if l.isolation == IsolationNamespaces && s.diskErr == nil && spec.disk > 0 {
		d, err := s.newLeaseDisk(id, spec.disk, l.dir)
		if err != nil {
			l.removeDirs()
			return nil, noCapacity(err)
		}
		l.disk = d
	}
	if err := l.guardDir(); err != nil {
		l.removeDirs()
		return nil, err
	}
	if err := l.makeFileDirs(); err != nil {
		l.removeDirs()
		return nil, err
	}
	return l, nil
}

// guardDir makes the lease directory (or the root of its disk, mounted
// there) traversable by the lease's own ids and nobody else's: root's,
// mode 0710, of the lease's group, which its init (the lease's root) and,
// in process-group mode, its commands have; run unprivileged, the
// server's and the lease's uid are one, the owner. So the lease's /tmp,
// 1777 as every Debian machine's, is no host user's to reach.
func (l *lease) guardDir() error {
	if os.Geteuid() != 0 {
		return os.Chmod(l.dir, 0o700)
	}
	if err := os.Chown(l.dir, 0, l.gid); err != nil {
		return err
	}
	return os.Chmod(l.dir, 0o710)
}

// makeFileDirs makes the lease's workspace, its root's, and its tmp,
// 1777 (every user of the lease makes files there: apt's _apt does), through
// package hostfs as every file operation below a lease directory.
func (l *lease) makeFileDirs() error {
	dir, err := hostfs.Open(l.dir)
	if err != nil {
		return err
	}
	defer dir.Close()
	for name, mode := range map[string]os.FileMode{
		leaseinit.WorkspaceDir: 0o700,
		leaseinit.TmpDir:       0o777 | os.ModeSticky,
	} {
		if _, err := dir.Mkdir(name, mode, l.owner().Host()); err != nil {
			return err
		}
	}
	return nil
}

// newLeaseDisk makes the disk of lease id, of size bytes, mounted at dir,
// if the host's file system has room for it beyond what is promised to the
// other leases' disks (machine/disk.go).
func (s *Server) newLeaseDisk(id string, size int64, dir string) (*machine.Disk, error) {
	if err := s.checkDiskRoom(); err != nil {
		return nil, err
	}
	return machine.NewDisk(filepath.Join(s.opts.Root, disksDir), id, size, dir, s.disks)
}

// checkDiskRoom refuses a new or grown disk (a *machine.CapacityError)
// unless the host's file system holds what is promised to the leases'
// disks and the reserve (machine.CheckRoom).
func (s *Server) checkDiskRoom() error {
	s.mu.Lock()
	leases := make([]*lease, 0, len(s.leases))
	for _, l := range s.leases {
		leases = append(leases, l)
	}
	s.mu.Unlock()
	var promised int64
	for _, l := range leases {
		if l.disk == nil {
			continue
		}
		l.mu.Lock()
		copies := l.forks
		l.mu.Unlock()
		promised += l.disk.Promised(copies)
	}
	return machine.CheckRoom(s.opts.Root, promised)
}

// noCapacity answers a refusal for lack of room (a host id range, disk)
// 503, as the hosted service says it.
func noCapacity(err error) error {
	if ce := (*machine.CapacityError)(nil); errors.As(err, &ce) {
		return &apiError{http.StatusServiceUnavailable, ce.Msg}
	}
	return err
}

// owner is the host uid and gid of the lease's root.
func (l *lease) owner() machine.Owner { return machine.Owner{UID: l.uid, GID: l.gid} }

// machineSpec is what the machine of l is made of.
func (s *Server) machineSpec(l *lease) *machine.Spec {
	sp := &machine.Spec{Hostname: l.id, Dir: l.dir, ReadOnlyPaths: s.opts.ReadOnlyPaths, Owner: l.owner(), IDRange: l.idSlot >= 0,
		ServerRoot: s.opts.Root, MaxProcs: s.opts.MaxProcesses, MaxOpenFiles: s.opts.MaxOpenFiles}
	sp.Rootfs, sp.Above = s.imageLayers(l.rootfs)
	return sp
}

// startLease starts the machine of a lease whose directories exist (in
// namespace mode); on failure it removes them.
func (s *Server) startLease(l *lease) error {
	if l.isolation != IsolationNamespaces {
		return nil
	}
	spec := s.machineSpec(l)
	var cg machine.Cgroup
	var err error
	if spec.Rootfs == "" {
		// The host image: what is not world-readable on the host stays
		// unread (images.go).
		spec.Masks, err = hostMasks(spec.ReadOnlyPaths)
	}
	if err == nil {
		err = spec.MakeRoot()
	}
	if err == nil && s.limiter != nil {
		cg, err = s.limiter.Create(l.id, machine.Limits{
			MemoryBytes: l.shape.MemoryBytes, MaxTasks: int64(s.opts.MaxProcesses), VCPUs: l.shape.VCPUs})
	}
	var net *network.Net
	if err == nil {
		net, err = s.newLeaseNet(l, l.netSpec, cg)
		// Under the lock, as machine below: a fork is viewed while it
		// starts. machine.Start starts the init in this network.
		l.mu.Lock()
		l.net = net
		l.mu.Unlock()
	}
	var m *machine.Machine
	if err == nil {
		m, err = machine.Start(spec, cg, s.spawner, net.Namespace())
	}
	if err != nil {
		net.Close()
		if cg != nil {
			cg.Delete()
		}
		l.removeDirs()
		return err
	}
	// Under the lock: a fork is registered (and viewed) before it starts.
	l.mu.Lock()
	l.machine, l.cgroup = m, cg
	l.mu.Unlock()
	return nil
}

// parts returns the lease's machine and cgroup (nil until it has started,
// or where there are none), for readers that do not otherwise synchronize
// with its start (views, stats).
func (l *lease) parts() (*machine.Machine, machine.Cgroup) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.machine, l.cgroup
}

// hostRoots are the host pids whose trees hold every process of the lease
// (but its init): the init's children in namespace mode, where orphans come
// to the init; the supervisors in process-group mode.
func (l *lease) hostRoots() []int {
	m, _ := l.parts()
	if m == nil {
		return treeRoots(l.liveProcesses())
	}
	t, err := proctree.Read()
	if err != nil {
		return nil
	}
	return t.Children(m.Pid())
}

// standardEnv are the variables every command of the lease has, beneath
// all others; a template's ENV may name them ($PATH).
func (l *lease) standardEnv() map[string]string {
	return map[string]string{"PATH": sandboxPath, "HOME": l.workspace, "LANG": "C.UTF-8", "TMPDIR": l.tmp}
}

// env is the environment a command starts with: the lease's standard
// variables, overridden by its template's ENV, by its envs, by the
// command's own (extra). Nothing of the server's own environment (which
// may hold its API key) reaches them, and nothing overrides the root
// marker of process-group mode, by which a later server finds what this
// one left.
func (l *lease) env(extra map[string]string) []string {
	vars := l.standardEnv()
	maps.Copy(vars, l.defaults.Env)
	maps.Copy(vars, l.envs)
	maps.Copy(vars, extra)
	delete(vars, rootMarkerEnv)
	env := make([]string, 0, len(vars)+1)
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		env = append(env, k+"="+vars[k])
	}
	if l.isolation != IsolationNamespaces {
		env = append(env, rootMarkerEnv+"="+l.server.opts.Root)
	}
	return env
}

// resolveCwd returns the working directory for cwd as the lease's processes
// see the file system: none is its template's WORKDIR, else the
// workspace; relative paths start at the workspace.
func (l *lease) resolveCwd(cwd string) string {
	if cwd == "" && l.defaults.WorkDir != "" {
		return l.defaults.WorkDir
	}
	if cwd == "" {
		return l.workspace
	}
	if path.IsAbs(cwd) {
		return path.Clean(cwd)
	}
	return path.Join(l.workspace, cwd)
}

func (l *lease) status() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// errLeaseNotRunning means the lease cannot start a process now.
var errLeaseNotRunning = errors.New("the sandbox is not running")

// errLeaseGone means the lease was destroyed meanwhile.
var errLeaseGone = errors.New("the sandbox is gone")

// errTooManyProcesses means the lease runs its maximum of processes.
var errTooManyProcesses = errors.New("too many running processes in this sandbox")

// beginSpawn reserves the right to start a process. endSpawn must follow.
func (l *lease) beginSpawn() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case stateRunning:
	case stateDestroyed:
		return errLeaseGone
	default:
		return errLeaseNotRunning
	}
	live := 0
	for _, p := range l.procs {
		select {
		case <-p.done:
		default:
			live++
		}
	}
	if live >= l.server.opts.MaxLiveProcesses {
		return errTooManyProcesses
	}
	l.spawning.Add(1)
	return nil
}

// endSpawn registers p (nil when the start failed).
func (l *lease) endSpawn(p *process) {
	if p != nil {
		l.mu.Lock()
		l.procs[p.id] = p
		select {
		case <-p.done: // it finished before it was registered
			l.retireLocked(p)
		default:
		}
		l.mu.Unlock()
	}
	l.spawning.Done()
}

// start runs argv in the lease, with the variables env added to its
// environment; on a terminal of that size when terminal is not nil.
func (l *lease) start(argv []string, cwd string, env map[string]string, oneShot bool, terminal *leaseinit.WinSize) (*process, error) {
	if err := l.beginSpawn(); err != nil {
		return nil, err
	}
	p, err := l.server.spawn(l, argv, cwd, l.env(env), oneShot, terminal)
	l.endSpawn(p)
	return p, err
}

// process returns the process with the given id.
func (l *lease) process(id string) (*process, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.procs[id]
	if !ok || p.oneShot {
		return nil, false
	}
	return p, true
}

// forget drops a process from the lease.
func (l *lease) forget(p *process) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.procs, p.id)
}

// processDone is called once a process's tree is gone.
func (l *lease) processDone(p *process) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retireLocked(p)
}

// retireLocked files a registered process whose tree is gone, once: a
// one-shot exec is forgotten, others are kept for KeepExited more exits.
func (l *lease) retireLocked(p *process) {
	if _, ok := l.procs[p.id]; !ok || p.retired {
		return
	}
	p.retired = true
	if p.oneShot {
		delete(l.procs, p.id)
		return
	}
	l.exited = append(l.exited, p)
	for len(l.exited) > l.server.opts.KeepExited {
		delete(l.procs, l.exited[0].id)
		l.exited[0] = nil
		l.exited = l.exited[1:]
	}
}

// liveProcesses returns the processes whose trees still run.
func (l *lease) liveProcesses() []*process {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*process
	for _, p := range l.procs {
		select {
		case <-p.done:
		default:
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// transition moves the lease from one of the states in from to via, or
// reports the state it is in.
func (l *lease) transition(from []string, via string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if via == stateResuming && l.forks > 0 {
		return stateBeingForked, false
	}
	for _, f := range from {
		if l.state == f {
			l.state = via
			return via, true
		}
	}
	return l.state, false
}

// setState moves the lease to state unless it was destroyed meanwhile,
// and notes when it first ran, paused or resumed.
func (l *lease) setState(state string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == stateDestroyed {
		return
	}
	now := time.Now()
	switch {
	case state == statePaused:
		l.pausedAt = now
	case state == stateRunning && l.state == stateResuming:
		l.resumedAt = now
	case state == stateRunning && l.runningAt.IsZero():
		l.runningAt = now
	}
	l.state = state
}

// pause freezes every process of the lease; it runs after the lease moved
// to pausing.
func (l *lease) pause() {
	l.spawning.Wait()
	var err error
	switch {
	case l.freezer():
		err = l.cgroup.Freeze()
	case l.machine != nil:
		err = proctree.Freeze([]int{l.machine.Pid()}, 5*time.Second, l.machine.Pid())
	default:
		err = proctree.Freeze(treeRoots(l.liveProcesses()), 5*time.Second)
	}
	if err != nil {
		l.server.log.Warn("pausing a sandbox failed", "sandbox", l.id, "err", err)
		l.setState(stateError)
		return
	}
	l.setState(statePaused)
}

// freezer reports whether the lease pauses through its cgroup's freezer.
func (l *lease) freezer() bool {
	return l.cgroup != nil && l.server.limiter.Enforces("freezer")
}

// resume thaws every process of the lease; it runs after the lease moved
// to resuming.
func (l *lease) resume() {
	var err error
	if l.freezer() {
		err = l.cgroup.Thaw()
	} else {
		err = proctree.Signal(l.hostRoots(), sigCont)
	}
	if err != nil {
		l.server.log.Warn("resuming a sandbox failed", "sandbox", l.id, "err", err)
		l.setState(stateError)
		return
	}
	l.setState(stateRunning)
}

// destroy kills every process of the lease and removes its directories.
// It reports an error when a tree could not be confirmed gone.
func (l *lease) destroy() error {
	l.stopIdleClock()
	l.mu.Lock()
	l.state = stateDestroyed
	l.mu.Unlock()
	l.spawning.Wait()

	if l.machine != nil && !l.machine.Stop() {
		return fmt.Errorf("the init of sandbox %s did not exit after SIGKILL", l.id)
	}
	l.net.Close() // before the cgroup, which holds slirp4netns
	l.server.releasePreviewAddr(l)
	if l.cgroup != nil {
		if err := l.cgroup.Delete(); err != nil {
			l.server.log.Warn("removing a sandbox's cgroup failed", "sandbox", l.id, "err", err)
		}
	}
	procs := l.liveProcesses()
	var wg sync.WaitGroup
	failed := make(chan string, len(procs))
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !p.terminate(0) {
				failed <- p.id
			}
		}()
	}
	wg.Wait()
	close(failed)
	if id, ok := <-failed; ok {
		return fmt.Errorf("process %s of sandbox %s did not exit after SIGKILL", id, l.id)
	}
	if err := l.removeDirs(); err != nil {
		return fmt.Errorf("removing the workspace of sandbox %s: %w", l.id, err)
	}
	return nil
}

// removeDirs removes the lease's directory, and its disk first.
func (l *lease) removeDirs() error {
	if l.disk != nil {
		if err := l.disk.Remove(); err != nil {
			return err
		}
	}
	if err := machine.RemoveDir(l.dir); err != nil {
		return err // files of the lease's ids remain: keep its range
	}
	if l.idSlot >= 0 {
		l.server.ids.Release(l.idSlot)
		l.idSlot = -1
	}
	return nil
}

// setErrorAfterFailedDestroy leaves a lease whose destroy could not be
// confirmed in the error state; another DELETE tries again.
func (l *lease) setErrorAfterFailedDestroy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state = stateError
}
