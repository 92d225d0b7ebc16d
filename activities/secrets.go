package activities

import (
	"context"
	"fmt"
	"os"
)

// Secrets resolves secret names to values on the worker, so that secret
// values never travel through workflow history: a workflow names the secret,
// the Execute activity looks it up just before the command runs.
type Secrets interface {
	Secret(ctx context.Context, name string) (string, error)
}

// EnvSecrets reads secrets from the worker's own environment: the secret
// NAME is the variable Prefix+NAME.
type EnvSecrets struct {
	Prefix string
}

// Secret returns the value of the environment variable Prefix+name.
func (s EnvSecrets) Secret(_ context.Context, name string) (string, error) {
	value, ok := os.LookupEnv(s.Prefix + name)
	if !ok {
		return "", fmt.Errorf("secret %q is not set on this worker (expected variable %s%s)", name, s.Prefix, name)
	}
	return value, nil
}
