package temporalserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/server/common/searchattribute/sadefs"
)

// Well-known values, the same as `temporal server start-dev`, so that tools
// and SDK defaults (client.DefaultHostPort is 127.0.0.1:7233) just work.
const (
	DefaultNamespace    = "default"
	DefaultIP           = "127.0.0.1"
	DefaultFrontendPort = 7233
	DefaultUIPort       = 8233
)

// NoUI as Options.UIPort starts the server without its Web UI.
const NoUI = -1

// Options configures Start. The zero value is a valid, test-friendly
// configuration: namespace "default" on 127.0.0.1, frontend and UI on free
// ports, database in memory. DefaultOptions gives the well-known ports.
type Options struct {
	// Namespace is created if it does not exist. Default "default".
	Namespace string
	// IP is the address every listener binds to, and that clients dial:
	// an IP address of this host, not a name. Default 127.0.0.1.
	IP string
	// FrontendPort is the gRPC port clients and workers dial.
	// 0 picks a free port; FrontendHostPort reports it.
	FrontendPort int
	// UIPort is the Web UI's HTTP port. 0 picks a free port; NoUI disables
	// the UI.
	UIPort int
	// DBFile is the SQLite file that persists workflows across restarts.
	// It is created, with its schema, on first use and reused afterwards.
	// Its directory must exist. "" keeps everything in memory.
	DBFile string
	// SearchAttributes are registered on Namespace (idempotently: on a
	// persisted database only missing ones are added). A name registered
	// earlier with another type is an error.
	SearchAttributes map[string]enumspb.IndexedValueType
	// CodecEndpoint, when set, is the codec server that the Web UI asks to
	// decode the payloads it shows (and to encode those an operator sends),
	// like http://127.0.0.1:8234: the server stores whatever the clients'
	// codec made of them, the operator reads them decoded. The browser calls
	// it directly, so it must allow the UI's origin (CORS); see
	// codec.NewHTTPHandler.
	CodecEndpoint string
	// Logger receives the server's own logs. Default slog.Default().
	Logger *slog.Logger
	// LogLevel is the least severe server log level passed on to Logger.
	// Default slog.LevelWarn: the server is very chatty at Info.
	LogLevel slog.Leveler
}

// DefaultOptions returns the configuration of a developer's local server:
// frontend on 127.0.0.1:7233, Web UI on 127.0.0.1:8233, namespace
// "default", database in memory.
func DefaultOptions() Options {
	return Options{
		Namespace:    DefaultNamespace,
		IP:           DefaultIP,
		FrontendPort: DefaultFrontendPort,
		UIPort:       DefaultUIPort,
	}
}

// withDefaults fills in the defaults and rejects what cannot work, before
// anything is bound or written.
func (o Options) withDefaults() (Options, error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.IP == "" {
		o.IP = DefaultIP
	}
	if net.ParseIP(o.IP) == nil {
		return o, fmt.Errorf("temporalserver: IP %q is not an IP address", o.IP)
	}
	if o.FrontendPort < 0 || o.FrontendPort > 65535 {
		return o, fmt.Errorf("temporalserver: frontend port %d is out of range", o.FrontendPort)
	}
	if (o.UIPort < 0 && o.UIPort != NoUI) || o.UIPort > 65535 {
		return o, fmt.Errorf("temporalserver: UI port %d is out of range (use NoUI to disable the UI)", o.UIPort)
	}
	if o.CodecEndpoint != "" {
		if u, err := url.Parse(o.CodecEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return o, errors.New("temporalserver: the codec endpoint must be an http(s) URL without credentials")
		}
	}
	if strings.ContainsAny(o.DBFile, "?#") {
		// The file name becomes the path of a file: URI (the SQLite DSN).
		return o, fmt.Errorf("temporalserver: database file name %q contains '?' or '#'", o.DBFile)
	}
	for name, typ := range o.SearchAttributes {
		if name == "" || sadefs.IsReserved(name) {
			return o, fmt.Errorf("temporalserver: search attribute name %q is empty or reserved", name)
		}
		if _, known := enumspb.IndexedValueType_name[int32(typ)]; !known || typ == enumspb.INDEXED_VALUE_TYPE_UNSPECIFIED {
			return o, fmt.Errorf("temporalserver: search attribute %q has no valid type", name)
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.LogLevel == nil {
		o.LogLevel = slog.LevelWarn
	}
	return o, nil
}
