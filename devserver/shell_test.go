package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sandboxflow/sandboxflow/createos"
	"github.com/sandboxflow/sandboxflow/internal/starterapp"
	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// screen is what a pseudo-terminal's master reads: what the program on
// its slave shows.
type screen struct {
	mu      sync.Mutex
	out     bytes.Buffer
	changed chan struct{}
}

func (s *screen) read(master *os.File) {
	buf := make([]byte, 4096)
	for {
		n, err := master.Read(buf)
		s.mu.Lock()
		s.out.Write(buf[:n])
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// waitFor waits until the output after offset from matches re and returns
// the submatches and the offset past the match.
func (s *screen) waitFor(t *testing.T, from int, re *regexp.Regexp) ([]string, int) {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	for {
		s.mu.Lock()
		out, changed := s.out.String(), s.changed
		s.mu.Unlock()
		if loc := re.FindStringSubmatchIndex(out[from:]); loc != nil {
			m := re.FindStringSubmatch(out[from:])
			return m, from + loc[1]
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("no %s on the screen; it showed:\n%q", re, out)
		}
	}
}

// devserver shell in a terminal of the test's own: a pseudo-terminal whose
// slave is the command's controlling terminal. What is typed runs in the
// lease, the lease's terminal has the window's size and follows a resize
// (SIGWINCH), the shell's exit code is the command's, the local terminal
// is restored, and the lease it made is gone.
func TestShellRelaysATerminal(t *testing.T) {
	url := shellServer(t)

	master, slave := openPTY(t, 30, 90)
	raw, err := unix.IoctlGetTermios(int(master.Fd()), unix.TCGETS)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := devserver(ctx, t, "shell", "--sandbox-url", url)
	cmd.Env = append(cmd.Env, "SANDBOX_API_KEY="+shellKey)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, cmd.Start())
	slave.Close()
	scr := &screen{changed: make(chan struct{})}
	go scr.read(master)

	master.WriteString("echo $((6*7))\r")
	_, at := scr.waitFor(t, 0, regexp.MustCompile(`[\r\n]42\r\n`))
	size := regexp.MustCompile(`[\r\n](\d+ \d+)\r\n`)
	master.WriteString("stty size\r")
	m, at := scr.waitFor(t, at, size)
	require.Equal(t, "30 90", m[1], "the lease's terminal has the window's size")

	// The window changes: the kernel signals devserver shell, which
	// resizes the lease's terminal — not at once, so ask until it shows.
	require.NoError(t, unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 120}))
	for tries := 0; m[1] != "50 120"; tries++ {
		require.Less(t, tries, 100, "the lease's terminal never took the new size")
		master.WriteString("stty size\r")
		m, at = scr.waitFor(t, at, size)
	}

	master.WriteString("exit 7\r")
	err = cmd.Wait()
	var exitErr interface{ ExitCode() int }
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 7, exitErr.ExitCode(), "devserver shell exits with the shell's code")

	restored, err := unix.IoctlGetTermios(int(master.Fd()), unix.TCGETS)
	require.NoError(t, err)
	require.Equal(t, raw.Lflag&(unix.ICANON|unix.ECHO), restored.Lflag&(unix.ICANON|unix.ECHO), "the local terminal is not restored")

	requireNoLease(t, url)
	scr.mu.Lock()
	defer scr.mu.Unlock()
	require.False(t, strings.Contains(scr.out.String(), shellKey), "the API key reached the screen")
}

// devserver shell ends without a terminal of its own, with a command the
// server refuses, and when a signal tells it to stop mid-command: each
// time with the command's code or its own, and without the lease it made.
func TestShellLeavesNoLease(t *testing.T) {
	url := shellServer(t)
	shell := func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := devserver(ctx, t, append([]string{"shell", "--sandbox-url", url, "--"}, args...)...)
		cmd.Env = append(cmd.Env, "SANDBOX_API_KEY="+shellKey)
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("NotATerminal", func(t *testing.T) {
		require.Equal(t, 5, exitCode(t, ctx, shell(ctx, "sh", "-c", "exit 5")), "the command's code")
		requireNoLease(t, url)
	})
	t.Run("CommandRefused", func(t *testing.T) {
		// No cmd, only args: the server answers 400 after the lease was made.
		require.Equal(t, starterapp.ExitRunFailed, exitCode(t, ctx, shell(ctx, "", "x")))
		requireNoLease(t, url)
	})
	// Told to stop: SIGTERM, SIGHUP, or SIGINT — Ctrl-C where stdin is not
	// a terminal (a terminal in raw mode sends it to the lease as a key).
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT} {
		t.Run(unix.SignalName(sig), func(t *testing.T) {
			cmd := shell(ctx, "sh", "-c", "echo started; exec sleep 600")
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			line, err := bufio.NewReader(out).ReadString('\n')
			require.NoError(t, err)
			require.Contains(t, line, "started")
			require.NoError(t, cmd.Process.Signal(sig))
			var exit *exec.ExitError
			require.ErrorAs(t, cmd.Wait(), &exit)
			require.NoError(t, ctx.Err())
			require.Equal(t, starterapp.ExitRunFailed, exit.ExitCode(), "ended by %v, not by the signal", exit)
			requireNoLease(t, url)
		})
	}
}

// shellKey is the API key of shellServer's sandbox server.
const shellKey = "shell-test-key-0123456789"

// shellServer serves a sandbox server of the test's own, keyed shellKey,
// and returns its URL.
func shellServer(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t, "a lease's terminal needs a root sandbox server")
	srv, err := localsandbox.New(localsandbox.Options{Root: filepath.Join(t.TempDir(), "root"), APIKey: shellKey})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// requireNoLease fails unless the sandbox server at url holds no lease.
func requireNoLease(t *testing.T, url string) {
	t.Helper()
	client, err := createos.New(createos.Config{BaseURL: url, APIKey: shellKey})
	require.NoError(t, err)
	leases, err := client.ListLeases(t.Context(), nil)
	require.NoError(t, err)
	require.Empty(t, leases, "devserver shell left its lease")
}

// openPTY opens a pseudo-terminal pair of the given size on the host.
func openPTY(t *testing.T, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	master = os.NewFile(uintptr(m), "ptmx")
	t.Cleanup(func() { master.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0))
	require.NoError(t, unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}))
	s, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		t.Fatal(errno)
	}
	return master, os.NewFile(s, "pts")
}
