package temporalserver

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// serverLogger adapts a *slog.Logger to the Temporal server's tag-based
// log.Logger. Level filtering is done by the slog handler (see
// newLevelFilter), so the server's chatty Info/Debug output costs one
// Enabled check and nothing else.
//
// Once stopping is set, warnings are logged at Debug: while the services
// stop one after the other, those still running warn about the ones
// already gone ("network dial error ... connection refused"), which says
// nothing about the server's health.
type serverLogger struct {
	slog     *slog.Logger
	stopping *atomic.Bool
}

func newServerLogger(l *slog.Logger) serverLogger {
	return serverLogger{slog: l, stopping: new(atomic.Bool)}
}

var (
	_ log.Logger      = serverLogger{}
	_ log.WithLogger  = serverLogger{}
	_ log.SLogWrapper = serverLogger{}
)

func (l serverLogger) Debug(msg string, tags ...tag.Tag) { l.log(slog.LevelDebug, msg, tags) }
func (l serverLogger) Info(msg string, tags ...tag.Tag)  { l.log(slog.LevelInfo, msg, tags) }
func (l serverLogger) Warn(msg string, tags ...tag.Tag)  { l.log(slog.LevelWarn, msg, tags) }
func (l serverLogger) Error(msg string, tags ...tag.Tag) { l.log(slog.LevelError, msg, tags) }

// DPanic is an error, as in zap's production mode.
func (l serverLogger) DPanic(msg string, tags ...tag.Tag) { l.log(slog.LevelError, msg, tags) }

// Panic and Fatal log an error and panic. The server's code does not expect
// them to return (zap's Fatal exits the process): after "Failed to start
// gRPC listener" it goes on to serve a nil listener. Panicking here, rather
// than calling os.Exit, at least names the cause and runs deferred calls.
func (l serverLogger) Panic(msg string, tags ...tag.Tag) { l.panic(msg, tags) }
func (l serverLogger) Fatal(msg string, tags ...tag.Tag) { l.panic(msg, tags) }

func (l serverLogger) panic(msg string, tags []tag.Tag) {
	l.log(slog.LevelError, msg, tags)
	panic(fmt.Sprintf("temporal server: %s %v", msg, tagsToAttrs(tags)))
}

// With returns a logger that adds tags to every record.
func (l serverLogger) With(tags ...tag.Tag) log.Logger {
	return serverLogger{slog: slog.New(l.slog.Handler().WithAttrs(tagsToAttrs(tags))), stopping: l.stopping}
}

// SLog lets server components that want a *slog.Logger use the same
// (filtered) destination.
func (l serverLogger) SLog() *slog.Logger { return l.slog }

func (l serverLogger) log(level slog.Level, msg string, tags []tag.Tag) {
	if level == slog.LevelWarn && l.stopping.Load() {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !l.slog.Enabled(ctx, level) {
		return
	}
	l.slog.LogAttrs(ctx, level, msg, tagsToAttrs(tags)...)
}

func tagsToAttrs(tags []tag.Tag) []slog.Attr {
	attrs := make([]slog.Attr, len(tags))
	for i, t := range tags {
		attrs[i] = slog.Any(t.Key(), t.Value())
	}
	return attrs
}

// levelFilter drops records below min before they reach next, whatever
// level next itself accepts.
type levelFilter struct {
	min  slog.Leveler
	next slog.Handler
}

func newLevelFilter(min slog.Leveler, next slog.Handler) slog.Handler {
	return levelFilter{min: min, next: next}
}

func (h levelFilter) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= h.min.Level() && h.next.Enabled(ctx, level)
}

func (h levelFilter) Handle(ctx context.Context, r slog.Record) error {
	return h.next.Handle(ctx, r)
}

func (h levelFilter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelFilter{min: h.min, next: h.next.WithAttrs(attrs)}
}

func (h levelFilter) WithGroup(name string) slog.Handler {
	return levelFilter{min: h.min, next: h.next.WithGroup(name)}
}
