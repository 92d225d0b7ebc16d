package localsandbox

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/image"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// Isolation is how a server separates leases from the host and from each
// other.
type Isolation string

const (
	// IsolationAuto uses namespaces when the kernel allows them (checked at
	// New by starting a probe) and process groups otherwise, with a warning.
	IsolationAuto Isolation = ""
	// IsolationNamespaces requires namespaces; New fails without them.
	IsolationNamespaces Isolation = "namespaces"
	// IsolationProcessGroup runs commands on the host, each tree under a
	// subreaper in its own process group. It isolates nothing: use it only
	// where namespaces are unavailable.
	IsolationProcessGroup Isolation = "process-group"
)

// Options configure a Server. The zero value is usable except for the
// authentication choice: set APIKey or InsecureNoAuth.
type Options struct {
	// APIKey is the key every request must carry in X-Api-Key.
	APIKey string
	// InsecureNoAuth accepts requests without a key. Serve then refuses any
	// listener that is not on a loopback address.
	InsecureNoAuth bool

	// Root is the directory that holds the leases' workspaces. A server
	// owns it: on start it kills what a crashed predecessor on the same root
	// left running and removes its leases. Default: $TMPDIR/sandboxd-<uid>.
	Root string

	// Isolation chooses namespaces or process groups; default IsolationAuto.
	Isolation Isolation
	// HostUID and HostGID are the host ids commands run as in
	// process-group mode. Zero means 65534 (nobody); host root cannot be
	// chosen. A server that is not root always uses its own ids.
	HostUID, HostGID int
	// HostIDBase places the sandboxes' ids on the host when the server is
	// root, in namespace mode: each sandbox gets a range of 65536 host ids
	// of its own, HostIDBase + n×65536 …, for its ids 0..65535 (ids.go), so
	// that no two sandboxes, and no sandbox and host user, share an id.
	// Default 1<<20; the ranges of 2×MaxLeases sandboxes must fit below
	// 2^32.
	HostIDBase int
	// ImageCache is where the default image — Debian of the release the
	// host runs, built from Debian's packages by mmdebstrap — is built,
	// once per recipe, and kept (images.go, package image). New builds it
	// when it is missing, which takes a minute or two and needs root and
	// mmdebstrap. Default: $SANDBOXFLOW_IMAGE_CACHE, else
	// /var/cache/sandboxflow/images.
	ImageCache string
	// ImageBuildOutput receives mmdebstrap's progress, each line prefixed
	// "image: ", when New builds the default image. Default os.Stderr.
	ImageBuildOutput io.Writer
	// HostImage offers the image "host": the host's ReadOnlyPaths as the
	// lower layer of a sandbox's root file system, each at its place,
	// with every file and directory that is not world-readable on the host
	// masked. Off (the default), no sandbox sees the host's files.
	HostImage bool
	// DefaultImage is the image of a create without rootfs: "" for the
	// Debian image, or "host" (with HostImage; the Debian image is then
	// offered only if the cache has it).
	DefaultImage string
	// ReadOnlyPaths are the host directories of the host image, at the
	// same place (symlinks such as a merged-/usr /bin are recreated as
	// symlinks; missing ones are skipped). The sandbox may write over
	// them: its writes land in its own upper layer. Default: /usr /bin
	// /sbin /lib /lib32 /lib64 /libx32 /etc.
	ReadOnlyPaths []string
	// RootfsDir is a directory of images: a create with "rootfs":
	// "<name>" uses RootfsDir/<name> as the lower layer of the sandbox's
	// /. Empty: none.
	RootfsDir string
	// InitProgram is the program each lease's init and each managed
	// process's supervisor run: a build of cmd/sandboxflow-init from the
	// same source as the server (New refuses one that speaks another
	// protocol). Empty: $SANDBOXD_INIT_PROGRAM if set, else
	// sandboxflow-init beside the running program if there is one, else
	// the running program itself, re-executed — which works the same but
	// costs each command the start of the whole server binary.
	InitProgram string

	// MaxProcesses bounds the processes of a lease: its cgroup's pids
	// limit (tasks: processes and threads, the init's included) where
	// cgroups are used, and RLIMIT_NPROC (per lease in namespace mode, per
	// host uid in process-group mode). Default 512.
	MaxProcesses int
	// DefaultDiskMiB is the disk of a sandbox created without disk_mib.
	// Default 4096.
	DefaultDiskMiB int
	// DiskBudgetMiB bounds the disks of all live sandboxes together (their
	// disk_mib): past it a create or fork is refused with 503. Default 0:
	// no budget; disks are sparse, and only the room the host's file system
	// has is checked (disk.go).
	DiskBudgetMiB int
	// RequireLimits makes New fail unless the kernel enforces every limit
	// of a shape (memory, processes, CPU, pause by freezing, disk) for each
	// lease. Without it a server that cannot says so in its log and in
	// every sandbox's view.
	RequireLimits bool
	// MaxOpenFiles is RLIMIT_NOFILE for every command. Default 4096.
	MaxOpenFiles int

	// JournalBytes is how much output the server keeps per process.
	// Default 1 MiB.
	JournalBytes int
	// HeartbeatInterval is how often an idle output stream carries a
	// heartbeat frame. Default 5s.
	HeartbeatInterval time.Duration
	// StallTimeout is how long an attached output reader may make no
	// progress before the journal evicts output it has not read (the reader
	// then gets output_offset_expired). Until then the process waits for
	// it. Default 10s.
	StallTimeout time.Duration
	// MaxFileBytes caps a file upload. Default 64 MiB.
	MaxFileBytes int64
	// MaxLeases caps the number of live leases. Default 256.
	MaxLeases int
	// MaxLiveProcesses caps the number of running managed processes of one
	// lease. Default 64.
	MaxLiveProcesses int
	// KeepExited is how many exited processes a lease keeps answering for
	// (connect, wait), beyond which the oldest are forgotten. Default 16.
	KeepExited int
	// HistorySize is how many process records History keeps. Default 10000.
	HistorySize int

	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger

	// MaxConnections caps the connections Serve holds open at once, and
	// MaxConnectionsPerAddress those from one client IP address. A
	// connection over a cap displaces the oldest idle one (that has no
	// request in flight; of the same address when that cap is the one
	// reached), or is closed at once when none is idle. Defaults: 1024, but
	// at most a quarter of the server's RLIMIT_NOFILE; per address half of
	// MaxConnections.
	MaxConnections           int
	MaxConnectionsPerAddress int
	// BodyReadTimeout is how long a request body may take to arrive, from
	// the moment its handler starts; it does not bound responses, streams
	// or long polls. Default 2 minutes.
	BodyReadTimeout time.Duration
	// autoPauseUnit is what one auto_pause_after_seconds is (tests make it
	// short). Default a second.
	autoPauseUnit time.Duration
	// Network of the leases (network.go, egress.go, ingress.go).
	//
	// Egress caps the leases' outward network: EgressOff (default: loopback
	// only), EgressAllowlist or EgressAny. Other than off it needs root and
	// slirp4netns (Slirp4netns, default: found in PATH).
	Egress      EgressPolicy
	Slirp4netns string
	// EgressHostLoopback lets leases with egress reach the host's
	// 127.0.0.1 at 10.0.2.2 (this server's API too): for tests only.
	EgressHostLoopback bool
	// EgressAllow, under EgressAllowlist, are the operator's rules: a
	// lease's rule must be within one of them (the same name, an address
	// or CIDR inside theirs; their port or every port), and a lease asking
	// for everything gets them. Empty: a lease may name any destination,
	// and asking for everything gets nothing.
	EgressAllow []string
	// DNSUpstream is where the leases' resolver (the server's filter)
	// forwards the queries of a lease whose egress is "*": IP addresses,
	// with or without a port. Default: the host's /etc/resolv.conf
	// nameservers. A lease with rules is answered from them alone.
	DNSUpstream []string
	// IngressDomain makes preview URLs host names,
	// http://<port>-<id>.<IngressDomain>:<server port>. Empty (the
	// default): they are the lease's preview address,
	// http://127.x.y.z:<port>, which needs no name resolution; host names
	// under "localhost" are served as well.
	IngressDomain string
	// previewByHost: IngressDomain was given (networkDefaults).
	previewByHost bool
	// IngressPublic serves preview URLs (which carry no key) on listeners
	// off loopback too.
	IngressPublic bool
	// MaxIngressRequests caps the preview requests proxied at once (an
	// open WebSocket counts until it closes), MaxIngressRequestsPerLease
	// those to one lease; past a cap a preview request is answered 503
	// with Retry-After. Defaults: half of MaxConnectionsPerAddress, so that
	// preview traffic, which comes from loopback as API clients do, leaves
	// them room; per lease 64, at most MaxIngressRequests.
	MaxIngressRequests         int
	MaxIngressRequestsPerLease int
	// MaxEgressConnections caps the outward flows (TCP connections, UDP
	// flows) a lease with egress holds at once; past it a new one is
	// refused, by the kernel. Default 1024.
	MaxEgressConnections int
}

// Defaults of Options.
const (
	DefaultJournalBytes      = 1 << 20
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultStallTimeout      = 10 * time.Second
	DefaultMaxFileBytes      = 64 << 20
	DefaultMaxProcesses      = 512
	DefaultMaxOpenFiles      = 4096
	DefaultMaxLeases         = 256
	DefaultMaxLiveProcesses  = 64
	DefaultKeepExited        = 16
	DefaultHistorySize       = 10000
	DefaultHostIDBase        = 1 << 20
	DefaultDiskMiB           = 4096
	minDiskMiB, maxDiskMiB   = 64, 1 << 20
	nobody                   = 65534
)

// Defaults of the connection limits of Options.
const (
	DefaultMaxConnections  = 1024
	DefaultBodyReadTimeout = 2 * time.Minute

	DefaultMaxIngressRequestsPerLease = 64
	DefaultMaxEgressConnections       = 1024
)

// DefaultRoot is the workspace directory a server uses when Options.Root is
// empty: sandboxd-<uid> in the system's temporary directory.
func DefaultRoot() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("sandboxd-%d", os.Getuid()))
}

// ImageCacheEnv names the variable that overrides the default
// Options.ImageCache.
const ImageCacheEnv = image.CacheEnv

// DefaultImageCache is the image cache a server uses when
// Options.ImageCache is empty: $SANDBOXFLOW_IMAGE_CACHE, else
// /var/cache/sandboxflow/images.
func DefaultImageCache() string { return image.DefaultCacheDir() }

// DefaultReadOnlyPaths are the host directories of the host image.
func DefaultReadOnlyPaths() []string {
	return []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}
}

// withDefaults returns o with every zero field set to its default, or an
// error for a setting that cannot work.
func (o Options) withDefaults() (Options, error) {
	if o.APIKey == "" && !o.InsecureNoAuth {
		return o, fmt.Errorf("localsandbox: an API key is required (or set InsecureNoAuth)")
	}
	switch o.Isolation {
	case IsolationAuto, IsolationNamespaces, IsolationProcessGroup:
	default:
		return o, fmt.Errorf("localsandbox: unknown isolation %q", o.Isolation)
	}
	if o.Root == "" {
		o.Root = DefaultRoot()
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return o, fmt.Errorf("localsandbox: root: %w", err)
	}
	o.Root = root
	if o.HostUID < 0 || o.HostGID < 0 {
		return o, fmt.Errorf("localsandbox: host ids must not be negative")
	}
	if o.HostUID == 0 {
		o.HostUID = nobody
	}
	if o.HostGID == 0 {
		o.HostGID = nobody
	}
	if o.HostIDBase == 0 {
		o.HostIDBase = DefaultHostIDBase
	}
	if o.HostIDBase < 1000 || o.HostIDBase > 1<<31 {
		return o, fmt.Errorf("localsandbox: HostIDBase must be between 1000 and 2^31")
	}
	if o.RootfsDir != "" {
		dir, err := filepath.Abs(o.RootfsDir)
		if err != nil {
			return o, fmt.Errorf("localsandbox: rootfs directory: %w", err)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return o, fmt.Errorf("localsandbox: rootfs directory %s is not a directory", dir)
		}
		if strings.ContainsAny(dir, ",:\\") {
			return o, fmt.Errorf("localsandbox: rootfs directory %s must not contain ',', ':' or '\\'", dir)
		}
		o.RootfsDir = dir
	}
	if o.ImageCache == "" {
		o.ImageCache = DefaultImageCache()
	}
	if o.ImageCache, err = filepath.Abs(o.ImageCache); err != nil {
		return o, fmt.Errorf("localsandbox: image cache: %w", err)
	}
	if strings.ContainsAny(o.ImageCache, ",:\\") {
		return o, fmt.Errorf("localsandbox: image cache %s must not contain ',', ':' or '\\'", o.ImageCache)
	}
	if o.ImageBuildOutput == nil {
		o.ImageBuildOutput = os.Stderr
	}
	if o.ReadOnlyPaths == nil {
		o.ReadOnlyPaths = DefaultReadOnlyPaths()
	}
	for _, p := range o.ReadOnlyPaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || strings.ContainsAny(p, ",:\\") {
			return o, fmt.Errorf("localsandbox: read-only path %q must be a clean absolute path below /", p)
		}
		switch p {
		case leaseinit.Workspace, leaseinit.Tmp, "/proc", "/dev":
			return o, fmt.Errorf("localsandbox: read-only path %q is reserved", p)
		}
	}
	positive := func(v *int, def int, name string) error {
		if *v < 0 {
			return fmt.Errorf("localsandbox: %s must not be negative", name)
		}
		if *v == 0 {
			*v = def
		}
		return nil
	}
	for _, f := range []struct {
		v    *int
		def  int
		name string
	}{
		{&o.MaxProcesses, DefaultMaxProcesses, "MaxProcesses"},
		{&o.MaxOpenFiles, DefaultMaxOpenFiles, "MaxOpenFiles"},
		{&o.JournalBytes, DefaultJournalBytes, "JournalBytes"},
		{&o.MaxLeases, DefaultMaxLeases, "MaxLeases"},
		{&o.MaxLiveProcesses, DefaultMaxLiveProcesses, "MaxLiveProcesses"},
		{&o.KeepExited, DefaultKeepExited, "KeepExited"},
		{&o.HistorySize, DefaultHistorySize, "HistorySize"},
		{&o.DefaultDiskMiB, DefaultDiskMiB, "DefaultDiskMiB"},
	} {
		if err := positive(f.v, f.def, f.name); err != nil {
			return o, err
		}
	}
	if o.DiskBudgetMiB < 0 {
		return o, fmt.Errorf("localsandbox: DiskBudgetMiB must not be negative")
	}
	if o.JournalBytes < journal.MaxChunk {
		return o, fmt.Errorf("localsandbox: JournalBytes must be at least %d", journal.MaxChunk)
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxConnections < 0 || o.MaxConnectionsPerAddress < 0 {
		return o, fmt.Errorf("localsandbox: connection limits must not be negative")
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = defaultMaxConnections()
	}
	if o.MaxConnectionsPerAddress == 0 {
		o.MaxConnectionsPerAddress = max(1, o.MaxConnections/2)
	}
	if o.BodyReadTimeout <= 0 {
		o.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if o.autoPauseUnit <= 0 {
		o.autoPauseUnit = time.Second
	}
	if err := o.networkDefaults(); err != nil {
		return o, err
	}
	return o, nil
}
