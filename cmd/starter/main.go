// Command starter starts a sandboxflow RunCommand workflow for a command
// line and exits with the command's exit code.
//
//	starter [flags] -- cmd [args...]
//
// It reaches Temporal as configured by the environment (TEMPORAL_ADDRESS,
// TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TLS settings, profiles: see
// go.temporal.io/sdk/contrib/envconfig). Exit codes: the command's own;
// 124 when it timed out; 128+n when signal n killed it; 2 for a bad command
// line; 125 when the run failed or could not start; 130 when interrupted.
//
// When SANDBOXFLOW_CODEC_KEYS or SANDBOXFLOW_CODEC_KEYS_FILE holds a key
// ring, the command, its input and its result travel encrypted (see package
// codec): the worker must hold the same ring.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"go.temporal.io/sdk/contrib/envconfig"
	"go.temporal.io/sdk/log"

	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
)

func main() {
	temporalOptions, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starter: Temporal client configuration: %v\n", err)
		os.Exit(starterapp.ExitUsage)
	}
	keys, err := codec.LoadKeys(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starter: %v\n", err)
		os.Exit(starterapp.ExitUsage)
	}
	temporalOptions.DataConverter, temporalOptions.FailureConverter = codec.DataConverter(keys), codec.FailureConverter(keys)
	// The SDK's own logs would interleave with the command's output.
	temporalOptions.Logger = log.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	stdio := starterapp.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Progress: starterapp.IsTerminal(os.Stderr)}
	os.Exit(starterapp.Main(context.Background(), os.Args[1:], stdio, temporalOptions, nil))
}
