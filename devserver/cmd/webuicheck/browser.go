package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// chromium runs Debian's Chromium headless, one process per page load,
// each with a new empty profile: nothing carries over between loads, and
// nothing is left behind.
type chromium struct {
	path string
	// limit bounds one Chromium process in real time.
	limit time.Duration
}

// renderBudget is the virtual time a page gets to load and render before
// Chromium dumps or shoots it. Virtual time stands still while requests
// are in flight and skips ahead while the page waits on nothing but
// timers, so a slow server does not eat into it and an idle page does not
// make us wait it out.
const renderBudget = 10 * time.Second

func newChromium(path string) (chromium, error) {
	if _, err := exec.LookPath(path); err != nil {
		return chromium{}, fmt.Errorf("no Chromium at %s (apt-get install chromium, or `make webui-check` which installs it): %w", path, err)
	}
	return chromium{path: path, limit: 90 * time.Second}, nil
}

// flags are the flags of every load. Headless, no sandbox (we run as
// root in a container), no GPU; and no connection that the page did not
// ask for: no first-run, sync, component-update or background requests,
// which the machine's closed network would refuse anyway.
func (c chromium) flags(profile string, budget time.Duration) []string {
	return []string{
		"--headless",
		"--no-sandbox",
		"--disable-gpu",
		"--disable-dev-shm-usage",
		"--disable-quic",
		"--no-first-run",
		"--no-default-browser-check",
		"--disable-background-networking",
		"--disable-component-update",
		"--disable-sync",
		"--disable-extensions",
		"--password-store=basic",
		"--hide-scrollbars",
		"--user-data-dir=" + profile,
		"--window-size=1600,1000",
		"--virtual-time-budget=" + strconv.FormatInt(budget.Milliseconds(), 10),
	}
}

// dumpDOM loads url and returns the DOM as it stands once the page has
// had budget to render (not the HTML the server sent: the Web UI is a
// single-page app whose server HTML is an empty shell).
func (c chromium) dumpDOM(ctx context.Context, url string, budget time.Duration) (string, error) {
	out, err := c.run(ctx, budget, "--dump-dom", url)
	if err != nil {
		return "", fmt.Errorf("dump the DOM of %s: %w", url, err)
	}
	return string(out), nil
}

// screenshot loads url, saves a PNG of the window to file and returns its
// size in bytes.
func (c chromium) screenshot(ctx context.Context, url, file string) (int64, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return 0, fmt.Errorf("screenshot file: %w", err)
	}
	if err := os.Remove(abs); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("replace the old screenshot: %w", err)
	}
	if _, err := c.run(ctx, renderBudget, "--screenshot="+abs, url); err != nil {
		return 0, fmt.Errorf("screenshot %s: %w", url, err)
	}
	info, err := os.Stat(abs)
	if err != nil {
		return 0, fmt.Errorf("chromium exited but saved no screenshot: %w", err)
	}
	return info.Size(), nil
}

// run starts Chromium with the common flags, a render budget and args in
// a new profile, waits for it and returns its standard output. Chromium's
// helper processes share its process group, which is killed if ctx ends
// or the limit passes first.
func (c chromium) run(ctx context.Context, budget time.Duration, args ...string) ([]byte, error) {
	profile, err := os.MkdirTemp("", "webuicheck-chromium-")
	if err != nil {
		return nil, fmt.Errorf("chromium profile: %w", err)
	}
	defer os.RemoveAll(profile)

	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.path, append(c.flags(profile, budget), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		switch {
		case parent.Err() != nil:
			err = parent.Err()
		case ctx.Err() != nil:
			err = fmt.Errorf("%w: chromium ran past %s", ctx.Err(), c.limit)
		}
		return nil, fmt.Errorf("%s: %w%s", c.path, err, lastError(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// lastError is the last line Chromium logged that is not harmless, as a
// suffix for an error.
func lastError(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if line := strings.TrimSpace(lines[i]); line != "" && !harmless(line) {
			return ": " + line
		}
	}
	return ""
}

// harmless tells a line that Chromium logs on every run here and that
// never explains a failure: there is no D-Bus session bus, and Debian's
// launcher script trips over its own /dev/shm size test ("[: …:
// unexpected operator") before it starts the browser all the same.
func harmless(line string) bool {
	for _, h := range []string{"dbus", "unexpected operator"} {
		if strings.Contains(line, h) {
			return true
		}
	}
	return false
}
