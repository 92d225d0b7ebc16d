package createos

import (
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Client is a sandbox.Provider over the CreateOS sandbox HTTP API. It is
// safe for concurrent use; its requests share one pacer.
type Client struct {
	cfg  settings
	pace *pacer

	// reconnectDelay is the pause before each reconnect of an output stream
	// and pollInterval the pause between two reads of a sandbox's state
	// while it becomes ready. Tests shorten them.
	reconnectDelay time.Duration
	pollInterval   time.Duration
	// retryBase is the base of the backoff between two attempts of one
	// request (docs/CREATEOS-API.md §4.2).
	retryBase time.Duration
}

var _ sandbox.Provider = (*Client)(nil)

const (
	// reconnectDelay: the pause before each reconnect of an output stream.
	defaultReconnectDelay = 250 * time.Millisecond
	// pollInterval: the pause between two reads of a new sandbox's state.
	defaultPollInterval = 250 * time.Millisecond
	// maxReconnects is the reconnect budget of one command's output: connect
	// failures and dropped streams share it.
	maxReconnects = 3
)

// New returns a Client for cfg. It validates cfg (see Config) and returns a
// *sandbox.InvalidInputError, which never quotes the URL or the key, when
// cfg is unusable. New sends no request.
func New(cfg Config) (*Client, error) {
	s, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	return &Client{
		cfg:            s,
		pace:           newPacer(s.paceInterval),
		reconnectDelay: defaultReconnectDelay,
		pollInterval:   defaultPollInterval,
		retryBase:      defaultRetryBase,
	}, nil
}
