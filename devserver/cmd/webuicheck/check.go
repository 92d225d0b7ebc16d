package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/activities"
	"github.com/sandboxflow/sandboxflow/codec"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/devserver/temporalserver"
)

// check is the whole check: boot the stack, make a run compensate, check
// what the server stored and what the Web UI shows, save the screenshot.
// All of that must be done within cfg.timeout; with cfg.linger the stack
// then serves until ctx ends.
func check(ctx context.Context, cfg config) (err error) {
	serving := ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	browser, err := newChromium(cfg.chromium)
	if err != nil {
		return err
	}

	started := time.Now()
	s, err := bootStack(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := s.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stop the stack: %w", stopErr))
		}
	}()
	progress("stack up in %s, Web UI at %s", since(started), s.Temporal.UIURL())

	m := newMarker()
	run, err := runCompensated(ctx, s, m)
	if err != nil {
		return err
	}
	progress("run %s compensated (%d fresh lease) and printed %q", run.workflowID, run.result.FreshLeases, m.output)

	if err := checkStoredHistory(ctx, s, run, m, cfg.encrypt); err != nil {
		return err
	}
	if cfg.encrypt {
		progress("the stored history holds no %q in plain text: payloads are encrypted (codec server %s)", m.word, s.CodecURL)
	} else {
		progress("the stored history holds %q in plain text, as it should without encryption", m.word)
	}

	pages := pagesOf(s, run)
	want := []string{run.workflowID, activities.NameAcquireFreshLease, m.output}
	for _, page := range pages.all() {
		if err := checkPageShows(ctx, browser, page, want); err != nil {
			return err
		}
		progress("%s shows %s", page, strings.Join(quoteAll(want), ", "))
	}

	size, err := browser.screenshot(ctx, pages.timeline, cfg.out)
	if err != nil {
		return err
	}
	progress("screenshot of the timeline saved to %s (%d KB)", cfg.out, size/1024)

	if err := checkLiveOutput(ctx, s, browser, cfg.encrypt); err != nil {
		return err
	}
	progress("done in %s", since(started))

	if cfg.linger {
		progress("serving %s until Ctrl-C", pages.history)
		<-serving.Done()
	}
	return nil
}

// checkLiveOutput checks that a running command's output, which only its
// pending Execute's heartbeat carries, is on the run's pending-activities
// page: decoded through the codec server when payloads are encrypted, and
// not readable in the details the server holds.
func checkLiveOutput(ctx context.Context, s *stack.Stack, browser chromium, encrypted bool) error {
	m := newMarker()
	live, err := startLive(ctx, s, m)
	if err != nil {
		return err
	}
	progress("run %s runs, and its Execute's heartbeat carries %q", live.workflowID, m.output)
	if err := checkStoredHeartbeat(ctx, s, live, m, encrypted); err != nil {
		return err
	}
	proxy, err := newSettleProxy(s.Temporal.UIURL(), s.CodecURL)
	if err != nil {
		return err
	}
	defer proxy.Close()
	page := proxy.page(pendingActivitiesPage(s, live.workflowID, live.runID))
	want := []string{live.workflowID, activities.NameExecute, m.output}
	if err := checkPageShows(ctx, browser, page, want); err != nil {
		return err
	}
	progress("%s shows %s while the command runs", page, strings.Join(quoteAll(want), ", "))
	return finishLive(ctx, s, live, m)
}

// bootStack starts the stack the check needs: a fault proxy in front of
// the sandbox server, the frontend and the Web UI on free ports (so that
// the check runs beside `make dev` and the tests of others), its logs
// only with -v. With -encrypt its payloads are encrypted under a key made
// for this run alone, and its Web UI decodes them through the stack's
// codec server.
func bootStack(ctx context.Context, cfg config) (*stack.Stack, error) {
	logs := io.Discard
	if cfg.verbose {
		logs = os.Stderr
	}
	opts := stack.Options{
		Temporal:   temporalserver.Options{}, // free ports, database in memory
		FaultProxy: true,
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if cfg.encrypt {
		keys, err := codec.GenerateKeys("webuicheck")
		if err != nil {
			return nil, fmt.Errorf("make a payload key: %w", err)
		}
		opts.Codec = keys
	}
	s, err := stack.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("boot the stack: %w", err)
	}
	s.Proxy.AddRule(dropFirstProcessCreate())
	return s, nil
}

// runPages are the Web UI pages of one run.
type runPages struct {
	// history is the run's page, its event history, as
	// Server.RunURL links to it.
	history string
	// timeline is the same page on its Timeline tab: one bar per activity,
	// the failed Execute in red before the compensation's DestroyLease and
	// AcquireFreshLease, so it is the one to show.
	timeline string
}

func pagesOf(s *stack.Stack, run compensatedRun) runPages {
	history := s.Temporal.RunURL(run.workflowID, run.runID)
	return runPages{history: history, timeline: strings.TrimSuffix(history, "/history") + "/timeline"}
}

// all lists the pages to check.
func (p runPages) all() []string { return []string{p.history, p.timeline} }

// marker is what the run's command prints: a random word, so that finding
// it in a page or a history cannot be a coincidence. The command computes
// the end of its output, so output appears only in the run's result, never
// in its input, while word appears in both.
type marker struct {
	word    string
	command []string
	output  string
}

func newMarker() marker {
	word := "webuicheck-" + strings.ToLower(rand.Text()[:10])
	return marker{
		word:    word,
		command: []string{"sh", "-c", "echo " + word + "-$((6*7))"},
		output:  word + "-42",
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "webuicheck: "+format+"\n", args...)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}
