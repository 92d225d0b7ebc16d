// Command webuicheck is the browser check of the embedded Temporal Web UI:
// it boots the development stack, makes one RunCommand run compensate,
// opens that run's pages in headless Chromium, checks that the rendered
// pages really show the run, and saves a screenshot of its timeline. Then
// it checks that a running command's live output shows on its run's
// pending-activities page.
//
//	cd devserver && go run ./cmd/webuicheck -out ../docs/webui-compensated.png
//
// `make webui-check` installs Chromium (Debian's chromium package) when it
// is missing and runs this.
//
// The run compensates because a FaultProxy between the worker and the
// sandbox server drops the response to the first process-create request:
// the command started, but the worker cannot know it, so Execute fails
// with SandboxCleanupError and the workflow destroys the lease, acquires a
// fresh one (sandboxflow.AcquireFreshLease) and runs the command again.
//
// Payloads are encrypted (stack.Options.Codec, a key made for this run
// only), and the Web UI decodes what it shows through the stack's codec
// server; -encrypt=false checks the plain-text stack instead.
//
// The check fails, with a one-line reason and exit status 1, when:
//   - the run did not compensate exactly once, or printed the wrong thing;
//   - the history the server stored, read by a client without the codec,
//     holds the command's marker in plain text although payloads are
//     encrypted (or does not hold it although they are not: then the
//     search itself is broken);
//   - a page Chromium rendered, the run's event history or its timeline,
//     does not name the workflow, the sandboxflow.AcquireFreshLease
//     activity and the command's output. The output is computed by the
//     command, so it is in the run's result only: the page can show it
//     only once the UI has read the result and, encrypted, had the codec
//     server decrypt it.
//
// The live-output check runs a command that prints a computed word and
// then waits (for a file the check creates at the end): while it waits,
// the word is in its pending Execute's heartbeat details only. The check
// fails when those details, as the server holds them, show the word in
// plain text although payloads are encrypted, or when the rendered
// pending-activities page does not show the word.
//
// Chromium runs once per page load, with flags only (--dump-dom,
// --screenshot, --virtual-time-budget), a new empty profile each time and
// no background connections; nothing drives it over DevTools.
//
// Flags:
//
//	-out FILE        where to save the PNG screenshot (default webui-compensated.png)
//	-chromium PATH   the Chromium binary (default /usr/bin/chromium)
//	-timeout D       give up after D (default 4m)
//	-linger          keep serving the Web UI after the check until Ctrl-C
//	-encrypt=false   leave payloads in plain text (default: encrypted)
//	-v               show the stack's logs (warnings and errors)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// config is what the flags set.
type config struct {
	out      string
	chromium string
	timeout  time.Duration
	linger   bool
	verbose  bool
	encrypt  bool
}

func main() {
	var cfg config
	flag.StringVar(&cfg.out, "out", "webui-compensated.png", "where to save the PNG screenshot")
	flag.StringVar(&cfg.chromium, "chromium", "/usr/bin/chromium", "the Chromium binary")
	flag.DurationVar(&cfg.timeout, "timeout", 4*time.Minute, "give up after this long")
	flag.BoolVar(&cfg.linger, "linger", false, "keep serving the Web UI after the check until Ctrl-C")
	flag.BoolVar(&cfg.encrypt, "encrypt", true, "encrypt payloads, and have the Web UI decode them through the stack's codec server")
	flag.BoolVar(&cfg.verbose, "v", false, "show the stack's warnings and errors (the injected fault's among them)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := check(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "webuicheck: FAIL:", oneLine(err, cfg.timeout))
		os.Exit(1)
	}
}

// oneLine is err as the one line the check ends with: joined errors on
// one line, and a deadline named for what it was.
func oneLine(err error, timeout time.Duration) string {
	line := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	if errors.Is(err, context.DeadlineExceeded) {
		line += fmt.Sprintf(" (the check gave up after -timeout %s)", timeout)
	}
	return line
}
