package localsandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/proctree"
	"golang.org/x/sys/unix"
)

// Server is a local CreateOS-compatible sandbox server. Create one with
// New, serve it with Serve (or mount Handler), and stop it with Shutdown,
// which kills every process it started and removes every workspace.
type Server struct {
	opts      Options
	log       *slog.Logger
	isolation Isolation
	// images is the catalog of images (images.go); nil for a server of
	// process-group isolation.
	images    *images
	hostUID   int
	hostGID   int
	ids       *machine.IDSlots // the leases' host id ranges (a root server)
	lock      *os.File
	init      *initProgram     // what lease inits and supervisors run
	spawner   *machine.Spawner // starts the lease inits (namespace mode)
	handler   http.Handler
	history   *history
	limiter   *machine.Limiter    // the leases' cgroups; set after the isolation probe
	diskErr   error               // why leases' disks are not bounded (nil: they are)
	resizeErr error               // why they cannot grow (nil: they can; api_resize.go)
	disks     *machine.DiskBudget // Options.DiskBudgetMiB and what the leases' disks hold

	started atomic.Int64
	// workers counts the goroutines that watch processes.
	workers sync.WaitGroup
	// done is closed when Shutdown begins: new requests get 503.
	done chan struct{}

	mu          sync.Mutex
	leases      map[string]*lease
	creating    int // leases being created, not yet in leases
	idempotency map[string]*idempotentCreate
	idemOrder   []string
	names       map[string]bool // the names of the live leases, and of those being created
	destroyed   destroyedLeases // what GET still answers of destroyed leases
	servers     map[*http.Server]struct{}
	shutdown    bool

	ingress ingressState // preview URLs: their port, the requests in flight (ingress.go)

	unknownFields unknownFields // request fields ignored, each logged once (http.go)
}

// Files and directories under Options.Root.
const (
	leasesDir  = "leases"    // <id>: a lease directory, on its disk
	disksDir   = "disks"     // <id>.img: the image of a lease's disk
	rootMarker = ".sandboxd" // marks a directory as a sandboxd root
	lockFile   = ".lock"
)

// New prepares a server: it takes the root directory (refusing one that
// another live server holds or that is not a sandboxd root), sweeps what a
// crashed predecessor left there, and decides the isolation mode.
func New(opts Options) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := closeInheritedOnExec(); err != nil {
		return nil, err
	}
	s := &Server{
		opts:          opts,
		log:           opts.Logger,
		history:       &history{max: opts.HistorySize},
		done:          make(chan struct{}),
		leases:        make(map[string]*lease),
		idempotency:   make(map[string]*idempotentCreate),
		names:         make(map[string]bool),
		servers:       make(map[*http.Server]struct{}),
		unknownFields: unknownFields{log: opts.Logger},
		ids:           machine.NewIDSlots(2 * opts.MaxLeases),
		disks:         machine.NewDiskBudget(int64(opts.DiskBudgetMiB) * mib),
	}
	if uint64(opts.HostIDBase)+uint64(2*opts.MaxLeases)*machine.IDsPerLease >= 1<<32-1 {
		return nil, fmt.Errorf("localsandbox: HostIDBase %d leaves no room for the id ranges of %d sandboxes", opts.HostIDBase, 2*opts.MaxLeases)
	}
	if os.Geteuid() == 0 {
		s.hostUID, s.hostGID = opts.HostUID, opts.HostGID
	} else {
		s.hostUID, s.hostGID = os.Geteuid(), os.Getegid()
	}
	if err := s.takeRoot(); err != nil {
		return nil, err
	}
	if err := s.sweep(); err != nil {
		s.lock.Close()
		return nil, err
	}
	if s.init, err = openInitProgram(opts); err != nil {
		s.lock.Close()
		return nil, err
	}
	s.log.Info("lease inits and supervisors run the init program", "init_program", s.init.name)
	s.spawner = machine.NewSpawner(s.init.path)
	// The probe of chooseIsolation runs a lease, on the default image.
	if err := s.setUpImages(context.Background()); err != nil {
		s.init.Close()
		s.lock.Close()
		return nil, err
	}
	if err := s.chooseIsolation(); err != nil {
		s.spawner.Close()
		s.init.Close()
		s.lock.Close()
		return nil, err
	}
	if err := s.setUpLimits(); err != nil {
		s.spawner.Close()
		s.init.Close()
		s.lock.Close()
		return nil, err
	}
	s.handler = s.routes()
	return s, nil
}

// setUpLimits settles which limits of a shape the kernel enforces, says so,
// and refuses to go on without all of them under RequireLimits.
func (s *Server) setUpLimits() error {
	s.limiter = machine.NewLimiter(s.opts.Root, s.isolation == IsolationNamespaces)
	if s.diskErr = machine.DiskSupport(); s.isolation != IsolationNamespaces {
		s.diskErr = errors.New("no namespaces")
	} else if os.Getenv(machine.NoCgroupsEnv) != "" {
		s.diskErr = errors.New("disabled for a test")
	}
	if s.resizeErr = s.diskErr; s.resizeErr == nil {
		s.resizeErr = machine.ResizeSupport()
	}
	s.limiter.Sweep()
	enforced := s.enforcedLimits()
	var missing []string
	for _, c := range []struct {
		name string
		ok   bool
	}{{"memory", enforced.Memory}, {"processes", enforced.Processes}, {"cpu", enforced.CPU}, {"freezer", enforced.Freezer}, {"disk", enforced.Disk}} {
		if !c.ok {
			missing = append(missing, c.name)
		}
	}
	if len(missing) == 0 {
		s.log.Info("sandbox shapes are enforced by the kernel", "cgroup", s.limiter.Version())
		return nil
	}
	if s.opts.RequireLimits {
		return fmt.Errorf("%w: not enforced: %s (cgroup %q; the server must be root, in namespace mode, with those cgroup controllers)",
			errLimitsNotEnforced, strings.Join(missing, ", "), s.limiter.Version())
	}
	s.log.Warn("some limits of a sandbox's shape are NOT enforced: they are reported, not applied", "not_enforced", strings.Join(missing, ","), "cgroup", s.limiter.Version())
	return nil
}

// errLimitsNotEnforced is what RequireLimits refuses to start with.
var errLimitsNotEnforced = errors.New("localsandbox: RequireLimits: this host cannot enforce every limit of a shape")

// enforcedLimits says which limits of a shape the kernel enforces.
type enforcedLimits struct {
	Memory, Processes, CPU, Freezer, Disk bool
}

// enforcedLimits says which limits the server's leases get.
func (s *Server) enforcedLimits() enforcedLimits {
	return enforcedLimits{
		Memory:    s.limiter.Enforces("memory"),
		Processes: s.limiter.Enforces("pids"),
		CPU:       s.limiter.Enforces("cpu"),
		Freezer:   s.limiter.Enforces("freezer"),
		Disk:      s.diskErr == nil,
	}
}

// takeRoot creates or checks the root directory and locks it.
func (s *Server) takeRoot() error {
	root := s.opts.Root
	if err := os.MkdirAll(root, 0o711); err != nil {
		return fmt.Errorf("localsandbox: root: %w", err)
	}
	marker := filepath.Join(root, rootMarker)
	if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
		entries, err := os.ReadDir(root)
		if err != nil {
			return fmt.Errorf("localsandbox: root: %w", err)
		}
		if len(entries) > 0 {
			return fmt.Errorf("localsandbox: root %s is not empty and not a sandboxd root; refusing to manage it", root)
		}
		if err := os.WriteFile(marker, []byte("sandboxd root: workspaces of local sandboxes, removed on restart\n"), 0o644); err != nil {
			return fmt.Errorf("localsandbox: root: %w", err)
		}
	}
	if err := os.Chmod(root, 0o711); err != nil {
		return fmt.Errorf("localsandbox: root: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(root, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("localsandbox: root: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("localsandbox: root %s is in use by another server", root)
	}
	s.lock = f
	return nil
}

// chooseIsolation settles the isolation mode, probing namespaces unless
// process groups are forced.
func (s *Server) chooseIsolation() error {
	// The probes are not part of the server's record.
	defer func() {
		s.history = &history{max: s.opts.HistorySize}
		s.started.Store(0)
	}()
	if s.opts.Isolation != IsolationProcessGroup {
		s.isolation = IsolationNamespaces
		err := s.probe()
		if err == nil {
			s.log.Info("sandboxes run in their own namespaces", "isolation", s.isolation, "host_uid", s.hostUID, "host_gid", s.hostGID)
			return nil
		}
		if s.opts.Isolation == IsolationNamespaces {
			return fmt.Errorf("localsandbox: namespaces are not available: %w", err)
		}
		s.log.Warn("namespaces are not available; falling back to process groups", "err", err)
	}
	s.isolation = IsolationProcessGroup
	s.log.Warn("PROCESS-GROUP ISOLATION: sandboxed commands run on the host, see each other and the host, and have network access; use only where namespaces are unavailable",
		"isolation", s.isolation, "uid", s.hostUID)
	if err := s.checkReachable(); err != nil {
		return err
	}
	if err := s.probe(); err != nil {
		return fmt.Errorf("localsandbox: process-group isolation does not work either: %w", err)
	}
	return nil
}

// checkReachable checks, in process-group mode, that the commands (which
// run as HostUID when the server is root) can reach the root by path.
func (s *Server) checkReachable() error {
	if os.Geteuid() == 0 {
		// Commands run as HostUID and must reach their workspace by path.
		for dir := s.opts.Root; ; dir = filepath.Dir(dir) {
			fi, err := os.Stat(dir)
			if err != nil {
				return fmt.Errorf("localsandbox: root: %w", err)
			}
			if fi.Mode().Perm()&0o001 == 0 {
				return fmt.Errorf("localsandbox: process-group isolation runs commands as uid %d, which cannot reach %s (%s is not searchable by others)", s.hostUID, s.opts.Root, dir)
			}
			if dir == "/" {
				break
			}
		}
	}
	return nil
}

// probe runs a trivial command in the chosen isolation.
func (s *Server) probe() error {
	sh, _ := lookupShape("")
	l, err := s.newLease(newID("probe-"), leaseSpec{shape: sh})
	if err != nil {
		return err
	}
	defer l.destroy()
	p, err := l.start([]string{"true"}, "", nil, true, nil)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(leaseinit.StartTimeout):
		return errors.New("the probe did not finish")
	}
	if st, _ := p.exitStatus(); st != (journal.ExitStatus{}) {
		return fmt.Errorf("the probe ended with %+v", st)
	}
	return nil
}

// Isolation returns the isolation mode in effect.
func (s *Server) Isolation() Isolation { return s.isolation }

// Root returns the server's root directory (Options.Root, made absolute).
func (s *Server) Root() string { return s.opts.Root }

// Handler returns the server's HTTP handler (paths start with /v1). Serve
// uses it; embed it elsewhere only behind a loopback or authenticated
// listener.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve answers requests on l until Shutdown. It refuses a listener off
// loopback when the server has no API key. It holds at most
// Options.MaxConnections connections (MaxConnectionsPerAddress from one
// client), gives a request's header 10 s and its body
// Options.BodyReadTimeout to arrive, and closes a connection that has
// waited a minute for its next request.
func (s *Server) Serve(l net.Listener) error {
	if s.opts.InsecureNoAuth && !isLoopback(l.Addr()) {
		return fmt.Errorf("localsandbox: refusing to serve %s without an API key: only loopback addresses may go without one", l.Addr())
	}
	lim := newConnLimiter(l, s.opts.MaxConnections, s.opts.MaxConnectionsPerAddress, s.log)
	srv := &http.Server{
		Handler:           s.withBodyDeadline(s.handler),
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    64 << 10,
		ConnState:         lim.connState,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.servers[srv] = struct{}{}
	s.mu.Unlock()
	s.notePreviewAddr(l.Addr())
	s.log.Info("serving", "addr", l.Addr().String(), "root", s.opts.Root, "isolation", s.isolation,
		"max_connections", s.opts.MaxConnections, "max_connections_per_address", s.opts.MaxConnectionsPerAddress)
	return srv.Serve(lim)
}

func isLoopback(addr net.Addr) bool {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	return false
}

// Shutdown stops the server: it stops accepting requests, ends the open
// streams, kills every process it started, removes every workspace and
// releases the root. Serve returns http.ErrServerClosed.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		return nil
	}
	s.shutdown = true
	close(s.done)
	servers := make([]*http.Server, 0, len(s.servers))
	for srv := range s.servers {
		servers = append(servers, srv)
	}
	leases := make([]*lease, 0, len(s.leases))
	for _, l := range s.leases {
		leases = append(leases, l)
	}
	s.mu.Unlock()

	errs := make(chan error, len(servers)+len(leases)+1)
	var wg sync.WaitGroup
	for _, srv := range servers {
		wg.Go(func() {
			if err := srv.Shutdown(ctx); err != nil {
				srv.Close()
				errs <- err
			}
		})
	}
	for _, l := range leases {
		wg.Go(func() {
			if err := l.destroy(); err != nil {
				errs <- err
			}
			s.mu.Lock()
			delete(s.leases, l.id)
			s.mu.Unlock()
		})
	}
	wg.Wait()
	workersDone := make(chan struct{})
	go func() {
		s.workers.Wait()
		close(workersDone)
	}()
	select {
	case <-workersDone:
	case <-ctx.Done():
		errs <- fmt.Errorf("localsandbox: shutdown: process watchers still running: %w", ctx.Err())
	}
	s.limiter.Close()
	s.spawner.Close()
	s.init.Close()
	s.lock.Close()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// Stats is a snapshot of what a server is running.
type Stats struct {
	// Leases is the number of live leases.
	Leases int
	// Processes is the number of OS processes running in live leases,
	// counted from the host's process table: every process of a lease but
	// its lease init (in process-group mode: every supervisor and its tree).
	Processes int
	// ProcessesStarted is how many commands the server has started.
	ProcessesStarted int64
}

// Stats reports what the server is running.
func (s *Server) Stats() (Stats, error) {
	s.mu.Lock()
	leases := make([]*lease, 0, len(s.leases))
	for _, l := range s.leases {
		leases = append(leases, l)
	}
	s.mu.Unlock()
	t, err := proctree.Read()
	if err != nil {
		return Stats{}, err
	}
	n := 0
	for _, l := range leases {
		if m, _ := l.parts(); m != nil {
			n += t.Count(t.Children(m.Pid()))
		} else {
			n += t.Count(treeRoots(l.liveProcesses()))
		}
	}
	return Stats{Leases: len(leases), Processes: n, ProcessesStarted: s.started.Load()}, nil
}

// History returns a record of every process the server ran, oldest first,
// including those of destroyed leases (the newest Options.HistorySize).
// Tests count from it how many times a command really ran.
func (s *Server) History() []ProcessRecord { return s.history.snapshot() }

// newID returns prefix followed by 16 random hex digits.
func newID(prefix string) string {
	var b [8]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// sigCont resumes a frozen process.
const sigCont = syscall.SIGCONT
