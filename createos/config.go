package createos

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Defaults of the Config fields left at their zero value.
const (
	// DefaultShape is the machine size of a sandbox when neither the
	// LeaseSpec nor the Config names one.
	DefaultShape = "s-1vcpu-1gb"
	// DefaultOperationTimeout bounds each request that is not a stream.
	DefaultOperationTimeout = 30 * time.Second
	// DefaultCreateTimeout bounds each attempt of a sandbox create: the
	// hosted service holds the request until the sandbox runs, which can
	// outlast the official SDKs' 60 s.
	DefaultCreateTimeout = 3 * time.Minute
	// DefaultReadyTimeout bounds the wait for a new sandbox to run.
	DefaultReadyTimeout = 2 * time.Minute
	// DefaultPaceInterval spaces requests to a hosted service: it allows
	// 300 requests a minute per caller.
	DefaultPaceInterval = 300 * time.Millisecond
	// DefaultCaptureBytes is how much of each output stream a Result keeps:
	// small enough that a Result always fits one Temporal payload.
	DefaultCaptureBytes = 256 << 10
	// DefaultWorkspace is where commands start when the server does not
	// name a workspace for the lease.
	DefaultWorkspace = "/workspace"
	// DefaultStreamIdleTimeout is how long an output stream may stay silent,
	// heartbeats included, before it is taken for dropped.
	DefaultStreamIdleTimeout = 60 * time.Second
)

// Config configures a Client. Only BaseURL and APIKey are required; every
// other field has a default used when it is left at its zero value.
type Config struct {
	// BaseURL is the server's origin, for example
	// "https://sandbox.example.com". It must use https unless the host is
	// loopback (localhost, 127.0.0.1, [::1]), and must carry no user
	// information, query, fragment or path; a trailing "/v1" is accepted.
	BaseURL string
	// APIKey is sent as the X-Api-Key header of every request. It must not
	// be empty or contain control characters (CR, LF, NUL…).
	APIKey string

	// Shape, Rootfs and Region are used by CreateLease when the LeaseSpec
	// leaves them empty. Shape defaults to DefaultShape; an empty Rootfs or
	// Region is not sent, leaving the choice to the server.
	Shape  string
	Rootfs string
	Region string

	// OperationTimeout bounds each request that is not a stream: the
	// request is given up when no complete answer arrived in time. For an
	// output stream it bounds the wait for the response headers.
	// Default DefaultOperationTimeout.
	OperationTimeout time.Duration
	// CreateTimeout bounds each attempt of a sandbox create, which the
	// hosted service answers only once the sandbox runs. Default
	// DefaultCreateTimeout.
	CreateTimeout time.Duration
	// ReadyTimeout bounds, as one deadline, the wait for a new sandbox to
	// reach the running state. Default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// PaceInterval is the least time between the starts of two requests of
	// this Client (a stream counts once, when it opens). Zero means the
	// default: DefaultPaceInterval, or no pacing when the host is loopback.
	// A negative value turns pacing off; a positive one sets the interval.
	PaceInterval time.Duration
	// CaptureBytes is how many bytes of each output stream a Result keeps:
	// the tail of the stream, cut at a character boundary. Output beyond it
	// is still delivered live to the Observer. Default DefaultCaptureBytes.
	CaptureBytes int
	// Workspace is the directory where commands start and files are staged
	// when the server does not report one for the lease. It must be an
	// absolute path. Default DefaultWorkspace.
	Workspace string
	// StreamIdleTimeout: an output stream that delivers no line at all, not
	// even a heartbeat, for this long is treated as dropped and reconnected.
	// Default DefaultStreamIdleTimeout.
	StreamIdleTimeout time.Duration

	// Secrets resolves the secret names of LeaseSpec.SecretEnv just before
	// a create (activities.EnvSecrets fits). Nil means a LeaseSpec cannot
	// have secrets.
	Secrets Secrets

	// HTTPClient sends the requests; nil means a client over
	// http.DefaultTransport. The Client uses a copy of it that never
	// follows redirects (the API key must not travel to another host) and
	// has no overall Timeout (streams are long-lived; OperationTimeout
	// bounds the other requests).
	HTTPClient *http.Client
}

// Secrets resolves secret names to values. Its errors must not contain
// secret values.
type Secrets interface {
	Secret(ctx context.Context, name string) (string, error)
}

// settings is a validated Config with its defaults applied.
type settings struct {
	base              string // origin + "/v1", without a trailing slash
	key               string
	shape             string
	rootfs, region    string
	operationTimeout  time.Duration
	createTimeout     time.Duration
	readyTimeout      time.Duration
	paceInterval      time.Duration // 0: no pacing
	captureBytes      int
	workspace         string
	streamIdleTimeout time.Duration
	secrets           Secrets
	httpClient        *http.Client
}

// resolve validates cfg and applies its defaults. Its errors are
// *sandbox.InvalidInputError and never quote the URL or the key.
func (cfg Config) resolve() (settings, error) {
	origin, loopback, err := checkBaseURL(cfg.BaseURL)
	if err != nil {
		return settings{}, err
	}
	if err := checkAPIKey(cfg.APIKey); err != nil {
		return settings{}, err
	}
	s := settings{
		base:              origin + "/v1",
		key:               cfg.APIKey,
		shape:             orDefault(cfg.Shape, DefaultShape),
		rootfs:            cfg.Rootfs,
		region:            cfg.Region,
		operationTimeout:  orDefault(cfg.OperationTimeout, DefaultOperationTimeout),
		createTimeout:     orDefault(cfg.CreateTimeout, DefaultCreateTimeout),
		readyTimeout:      orDefault(cfg.ReadyTimeout, DefaultReadyTimeout),
		captureBytes:      orDefault(cfg.CaptureBytes, DefaultCaptureBytes),
		workspace:         orDefault(cfg.Workspace, DefaultWorkspace),
		streamIdleTimeout: orDefault(cfg.StreamIdleTimeout, DefaultStreamIdleTimeout),
		secrets:           cfg.Secrets,
	}
	for _, d := range []struct {
		field string
		value time.Duration
	}{
		{"OperationTimeout", s.operationTimeout},
		{"CreateTimeout", s.createTimeout},
		{"ReadyTimeout", s.readyTimeout},
		{"StreamIdleTimeout", s.streamIdleTimeout},
	} {
		if d.value < 0 {
			return settings{}, &sandbox.InvalidInputError{Field: d.field, Reason: "must not be negative"}
		}
	}
	if s.captureBytes < 0 {
		return settings{}, &sandbox.InvalidInputError{Field: "CaptureBytes", Reason: "must not be negative"}
	}
	if err := checkWorkspace("Workspace", s.workspace); err != nil {
		return settings{}, err
	}
	switch {
	case cfg.PaceInterval > 0:
		s.paceInterval = cfg.PaceInterval
	case cfg.PaceInterval == 0 && !loopback:
		s.paceInterval = DefaultPaceInterval
	}
	s.httpClient = noRedirects(cfg.HTTPClient)
	return s, nil
}

// checkBaseURL applies the URL rules of the protocol and returns the
// origin ("https://host:port") and whether the host is loopback.
func checkBaseURL(raw string) (origin string, loopback bool, err error) {
	invalid := func(reason string) (string, bool, error) {
		return "", false, &sandbox.InvalidInputError{Field: "BaseURL", Reason: reason}
	}
	if raw == "" {
		return invalid("is required")
	}
	u, err := url.Parse(raw)
	if err != nil { // url.Parse's error quotes the URL: never pass it on
		return invalid("is not a valid URL")
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return invalid("must use https (or http on loopback)")
	case u.User != nil:
		return invalid("must not contain user information; pass the key as APIKey")
	case u.Opaque != "" || u.Host == "":
		return invalid("must name a host")
	case u.RawQuery != "" || u.ForceQuery:
		return invalid("must not contain a query")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return invalid("must not contain a fragment")
	}
	if p := strings.TrimSuffix(u.EscapedPath(), "/"); p != "" && p != "/v1" {
		return invalid(`must be an origin, without a path (a trailing "/v1" is accepted)`)
	}
	host := u.Hostname()
	ip := net.ParseIP(host)
	loopback = strings.EqualFold(host, "localhost") || (ip != nil && ip.IsLoopback())
	if u.Scheme == "http" && !loopback {
		return invalid("must use https unless the host is loopback")
	}
	return u.Scheme + "://" + u.Host, loopback, nil
}

// checkAPIKey rejects keys that could not travel safely in a header.
func checkAPIKey(key string) error {
	if key == "" {
		return &sandbox.InvalidInputError{Field: "APIKey", Reason: "is required"}
	}
	if strings.ContainsFunc(key, isControl) {
		return &sandbox.InvalidInputError{Field: "APIKey", Reason: "must not contain control characters (CR, LF, NUL…)"}
	}
	return nil
}

// checkWorkspace accepts absolute paths without NUL bytes.
func checkWorkspace(field, dir string) error {
	if !path.IsAbs(dir) || strings.ContainsRune(dir, 0) {
		return &sandbox.InvalidInputError{Field: field, Reason: "must be an absolute path without NUL bytes"}
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// noRedirects returns a copy of hc (or a new client) that hands 3xx
// answers back instead of following them and has no overall timeout.
func noRedirects(hc *http.Client) *http.Client {
	var c http.Client
	if hc != nil {
		c = *hc
	}
	c.Timeout = 0
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
