// Command sandboxd is the local CreateOS-compatible sandbox server: the
// HTTP API of PROTOCOL.md over Linux namespaces (see package localsandbox).
//
//	SANDBOXD_API_KEY=secret sandboxd                  # 127.0.0.1:7575, key required
//	sandboxd --api-key-file /etc/sandboxd/key         # the key from a file of mode 0600
//	sandboxd --insecure-no-auth                       # loopback only, no key
//	sandboxd --listen 127.0.0.1:9000 --root /var/lib/sandboxd
//
// Each sandbox's init and each managed process run sandboxflow-init
// (cmd/sandboxflow-init), which sandboxd finds beside itself; make build
// puts both in bin/.
//
// It stops cleanly on SIGINT or SIGTERM, killing every process it started
// and removing every workspace.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		os.Exit(1)
	}
}

// config is what the command line says.
type config struct {
	listen       string
	apiKey       string
	apiKeyFile   string
	noAuth       bool
	root         string
	journalBytes int
	isolation    string
	uid, gid     int
	logLevel     slog.Level

	maxConns, maxConnsPerAddress int
	bodyReadTimeout              time.Duration
	machine                      machineFlags
	network                      networkFlags
}

// machineFlags configure the leases' machines (a block of its own).
type machineFlags struct {
	initProgram   string
	rootfsDir     string
	imageCache    string
	hostImage     bool
	defaultImage  string
	requireLimits bool
	diskBudgetMiB int
}

func (m *machineFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&m.requireLimits, "require-limits", false, "refuse to start unless the kernel enforces every limit of a shape (memory, processes, CPU, freezing) per sandbox")
	fs.StringVar(&m.initProgram, "init-program", "", "the program each sandbox's init and managed process runs, a build of cmd/sandboxflow-init of this version (default $"+localsandbox.InitProgramEnv+", else sandboxflow-init beside sandboxd, else sandboxd itself, re-executed: slower)")
	fs.StringVar(&m.rootfsDir, "rootfs-dir", "", "directory of images: a create with rootfs NAME uses DIR/NAME as the sandbox's read-only lower layer")
	fs.StringVar(&m.imageCache, "image-cache", "", "where the default image (Debian of the host's release, from Debian's packages) is built once and kept; building needs root and mmdebstrap (default $"+localsandbox.ImageCacheEnv+", else "+localsandbox.DefaultImageCache()+")")
	fs.BoolVar(&m.hostImage, "host-image", false, "offer the image \"host\": the host's system directories, read-only, with every file that is not world-readable on the host hidden")
	fs.StringVar(&m.defaultImage, "default-image", "", "the image of a create without rootfs: the Debian image (default) or host (with --host-image)")
	fs.IntVar(&m.diskBudgetMiB, "disk-budget-mib", 0, "the disks of all sandboxes together (their disk_mib) stay within this many MiB; past it a create or fork is refused (default: no budget, disks are sparse; the host's free space is checked)")
}

func (m *machineFlags) apply(o *localsandbox.Options) {
	o.InitProgram = m.initProgram
	o.RootfsDir = m.rootfsDir
	o.ImageCache = m.imageCache
	o.HostImage = m.hostImage
	o.DefaultImage = m.defaultImage
	o.RequireLimits = m.requireLimits
	o.DiskBudgetMiB = m.diskBudgetMiB
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("sandboxd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7575", "address to listen on")
	fs.StringVar(&c.apiKey, "api-key", "", "API key clients must send in X-Api-Key; DEPRECATED: every local user sees it in ps, use --api-key-file or $SANDBOXD_API_KEY")
	fs.StringVar(&c.apiKeyFile, "api-key-file", "", "file holding the API key clients must send in X-Api-Key (one trailing newline is dropped); its mode must give group and others nothing (default $SANDBOXD_API_KEY)")
	fs.BoolVar(&c.noAuth, "insecure-no-auth", false, "accept requests without an API key (only on a loopback address)")
	fs.StringVar(&c.root, "root", localsandbox.DefaultRoot(), "directory for the workspaces; cleared of a previous run's leftovers on start")
	fs.IntVar(&c.journalBytes, "journal-bytes", localsandbox.DefaultJournalBytes, "output kept per process, in bytes")
	fs.StringVar(&c.isolation, "isolation", "auto", "auto, namespaces or process-group")
	fs.IntVar(&c.uid, "uid", 65534, "host uid commands run as in process-group isolation (when run as root; namespaced sandboxes get id ranges of their own)")
	fs.IntVar(&c.gid, "gid", 65534, "host gid commands run as in process-group isolation (when run as root)")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	fs.IntVar(&c.maxConns, "max-connections", 0, "connections held at once; over it an idle one is closed, or the new one (default 1024, at most a quarter of RLIMIT_NOFILE)")
	fs.IntVar(&c.maxConnsPerAddress, "max-connections-per-address", 0, "connections held from one client IP address (default half of --max-connections)")
	fs.DurationVar(&c.bodyReadTimeout, "body-read-timeout", localsandbox.DefaultBodyReadTimeout, "how long a request body may take to arrive")
	c.machine.register(fs)
	c.network.register(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := c.readKey(stderr); err != nil {
		return c, err
	}
	if c.apiKey != "" && c.noAuth {
		return c, errors.New("--insecure-no-auth and an API key exclude each other")
	}
	if c.apiKey == "" && !c.noAuth {
		return c, errors.New("an API key is required: set SANDBOXD_API_KEY or --api-key-file, or pass --insecure-no-auth to serve loopback without one")
	}
	if c.uid <= 0 || c.gid <= 0 {
		return c, errors.New("--uid and --gid must be positive: sandboxes never map to host root")
	}
	return c, nil
}

// keyEnv is the environment variable that holds the API key.
const keyEnv = "SANDBOXD_API_KEY"

// readKey takes the key from --api-key-file, --api-key (with a warning:
// /proc/PID/cmdline is readable by every local user, and the key lets
// anyone drive the server, which runs as root) or the environment, in
// that order, one source at most. The variable is removed from the
// environment once read, so that no process the server starts inherits
// it.
func (c *config) readKey(stderr io.Writer) error {
	env := os.Getenv(keyEnv)
	os.Unsetenv(keyEnv)
	switch {
	case c.apiKeyFile != "" && c.apiKey != "":
		return errors.New("--api-key and --api-key-file exclude each other")
	case c.apiKeyFile != "":
		key, err := readKeyFile(c.apiKeyFile)
		if err != nil {
			return err
		}
		c.apiKey = key
	case c.apiKey != "":
		fmt.Fprintln(stderr, "sandboxd: warning: --api-key shows the key to every local user (ps, /proc/PID/cmdline); use --api-key-file or $"+keyEnv)
	default:
		c.apiKey = env
	}
	return nil
}

// readKeyFile reads the key from file: its content without one trailing
// newline. A file that group or others may read is refused, as ssh
// refuses such a private key: the key it holds is no secret any more.
func readKeyFile(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("--api-key-file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("--api-key-file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("--api-key-file: %s is not a regular file", file)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("--api-key-file: %s has mode %v: a key file must give group and others nothing (chmod 600)", file, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("--api-key-file: %w", err)
	}
	key := strings.TrimSuffix(string(b), "\n")
	if key == "" || strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("--api-key-file: %s must hold the key alone, on one line", file)
	}
	return key, nil
}

func run(args []string, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	isolation := localsandbox.Isolation(c.isolation)
	if c.isolation == "auto" {
		isolation = localsandbox.IsolationAuto
	}

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	if addr, ok := ln.Addr().(*net.TCPAddr); c.noAuth && (!ok || !addr.IP.IsLoopback()) {
		ln.Close()
		return fmt.Errorf("refusing to listen on %s without an API key: --insecure-no-auth is only allowed on a loopback address such as 127.0.0.1", ln.Addr())
	}
	opts := localsandbox.Options{
		APIKey:         c.apiKey,
		InsecureNoAuth: c.noAuth,
		Root:           c.root,
		Isolation:      isolation,
		HostUID:        c.uid,
		HostGID:        c.gid,
		JournalBytes:   c.journalBytes,
		Logger:         log,

		MaxConnections:           c.maxConns,
		MaxConnectionsPerAddress: c.maxConnsPerAddress,
		BodyReadTimeout:          c.bodyReadTimeout,
	}
	c.machine.apply(&opts)
	c.network.apply(&opts)
	srv, err := localsandbox.New(opts)
	if err != nil {
		ln.Close()
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err = <-served:
	case <-ctx.Done():
		log.Info("shutting down")
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if shutdownErr := srv.Shutdown(shutdownCtx); shutdownErr != nil {
		return errors.Join(err, shutdownErr)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
