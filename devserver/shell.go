package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/devserver/stack"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/sandbox"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

const shellUsage = "devserver shell [--sandbox-url URL] [--sandbox-api-key KEY] [--lease ID] [-- cmd [args...]]"

// The size of a terminal when stdin is not one.
const (
	defaultRows = 24
	defaultCols = 80
)

// shell opens a terminal in a lease of a running sandbox server (the dev
// stack's, by default) in this one: a new lease, destroyed at the end,
// or --lease's. It runs the image's shell, or the command after --, with
// the local terminal in raw mode: what is typed goes to it, what it shows
// comes back, the window's size follows (SIGWINCH), and the exit code is
// the command's (128+n for a signal). The HTTP is createos's (Terminal).
func shell(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("devserver shell", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("sandbox-url", "http://127.0.0.1:"+strconv.Itoa(stack.DefaultSandboxPort), "the sandbox server: by default the one devserver dev serves")
	key := fs.String("sandbox-api-key", os.Getenv("SANDBOX_API_KEY"), "the API `KEY` of the sandbox server, which devserver dev prints (default: SANDBOX_API_KEY, which ps does not show)")
	leaseID := fs.String("lease", "", "open the terminal in the lease with this `ID` instead of a new one (which is destroyed at the end)")
	if code, ok := parseFlags(fs, args, shellUsage, nil); !ok {
		return code
	}
	if *key == "" {
		fmt.Fprintln(os.Stderr, "devserver shell: no API key: pass --sandbox-api-key (or set SANDBOX_API_KEY) to the key `devserver dev` printed")
		return starterapp.ExitUsage
	}
	client, err := createos.New(createos.Config{BaseURL: *url, APIKey: *key})
	if err != nil {
		fmt.Fprintf(os.Stderr, "devserver shell: %v\n", err)
		return starterapp.ExitUsage
	}
	spec := createos.TerminalSpec{Rows: defaultRows, Cols: defaultCols}
	if cmd := fs.Args(); len(cmd) > 0 {
		spec.Cmd, spec.Args = cmd[0], cmd[1:]
	}
	if t := os.Getenv("TERM"); t != "" {
		spec.Env = map[string]string{"TERM": t}
	}
	code, err := openShell(ctx, client, *leaseID, spec, os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "devserver shell: %v\n", err)
		return starterapp.ExitRunFailed
	}
	return code
}

// openShell runs spec on a terminal in the lease (a new one when leaseID
// is empty) with in and out as its keyboard and screen, and returns its
// exit code.
func openShell(ctx context.Context, client *createos.Client, leaseID string, spec createos.TerminalSpec, in, out *os.File) (int, error) {
	if leaseID == "" {
		lease, err := client.CreateLease(ctx, sandbox.LeaseSpec{})
		if err != nil {
			return 0, fmt.Errorf("creating a lease: %w", err)
		}
		leaseID = lease.ID
		defer func() {
			cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := client.DestroyLease(cleanup, leaseID); err != nil {
				fmt.Fprintf(os.Stderr, "devserver shell: destroying lease %s: %v\n", leaseID, err)
			}
		}()
	}
	local := int(in.Fd())
	isTerm := term.IsTerminal(local)
	if isTerm {
		if cols, rows, err := term.GetSize(local); err == nil && rows > 0 && cols > 0 {
			spec.Rows, spec.Cols = min(rows, createos.MaxTerminalSide), min(cols, createos.MaxTerminalSide)
		}
	}
	t, err := client.OpenTerminal(ctx, leaseID, spec)
	if err != nil {
		return 0, err
	}
	if isTerm {
		// Raw: every key, ^C included, goes to the lease's terminal, which
		// echoes and interprets it.
		state, err := term.MakeRaw(local)
		if err != nil {
			t.Kill(context.WithoutCancel(ctx))
			return 0, fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(local, state)
	}
	relay, stop := context.WithCancel(ctx)
	defer stop()
	go typeInto(relay, t, in)
	if isTerm {
		go followWindow(relay, t, local)
	}
	exit, err := t.Follow(ctx, out)
	if err != nil {
		t.Kill(context.WithoutCancel(ctx))
		return 0, err
	}
	if exit.Signal != "" {
		return 128 + int(unix.SignalNum(exit.Signal)), nil
	}
	return exit.Code, nil
}

// typeInto sends what is read from in to the terminal, until in ends or
// the terminal goes away.
func typeInto(ctx context.Context, t *createos.Terminal, in io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 && t.Input(ctx, buf[:n]) != nil {
			return
		}
		if err != nil {
			return
		}
	}
}

// followWindow resizes the terminal whenever the local window changes.
func followWindow(ctx context.Context, t *createos.Terminal, local int) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
			if cols, rows, err := term.GetSize(local); err == nil && rows > 0 && cols > 0 {
				t.Resize(ctx, min(rows, createos.MaxTerminalSide), min(cols, createos.MaxTerminalSide))
			}
		}
	}
}
