package temporalserver

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/server/common/log/tag"
)

func TestServerLogger(t *testing.T) {
	var buf bytes.Buffer
	next := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})
	l := newServerLogger(slog.New(newLevelFilter(slog.LevelWarn, next)))

	l.Info("chatter")
	require.Empty(t, buf.String(), "below the filter's level")

	l.With(tag.NewStringTag("service", "history")).Warn("shard lost", tag.NewInt("shard", 1))
	require.Contains(t, buf.String(), `level=WARN msg="shard lost" service=history shard=1`)

	buf.Reset()
	l.stopping.Store(true)
	l.Warn("network dial error")
	require.Empty(t, buf.String(), "warnings while stopping are demoted to Debug, below the filter")
	l.Error("still an error")
	require.Contains(t, buf.String(), "level=ERROR")

	require.PanicsWithValue(t, `temporal server: Failed to start gRPC listener [address=127.0.0.1:1]`, func() {
		l.Fatal("Failed to start gRPC listener", tag.NewStringTag("address", "127.0.0.1:1"))
	})
}
