package localsandbox

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"golang.org/x/sys/unix"
)

// terminal follows a pty process's output stream in the background.
type terminal struct {
	t     *testing.T
	ts    *testServer
	lease string
	pid   string

	mu      sync.Mutex
	out     bytes.Buffer
	seq     int64 // the newest data frame's
	exit    *event
	changed chan struct{} // closed and replaced on every frame
}

// startTerminal creates a pty process with body (cmd, args, pty) and
// follows its output from the start.
func (ts *testServer) startTerminal(t *testing.T, lease string, body map[string]any) *terminal {
	t.Helper()
	var view processView
	ts.mustCall("POST", "/sandboxes/"+lease+"/processes", body, &view)
	if view.Kind != "pty" {
		t.Errorf("kind %q, want pty", view.Kind)
	}
	term := &terminal{t: t, ts: ts, lease: lease, pid: view.ProcessID, changed: make(chan struct{})}
	st := ts.connect(lease, view.ProcessID, 0)
	go term.follow(st)
	return term
}

func (term *terminal) follow(st *stream_) {
	for {
		ev, ok := st.next(false)
		term.mu.Lock()
		switch {
		case !ok:
			term.exit = &event{Type: "end of stream"}
		case ev.Type == "data":
			data, err := base64.StdEncoding.DecodeString(ev.DataBase64)
			if ev.Stream != "pty" || err != nil || ev.Seq != term.seq+1 {
				term.t.Errorf("frame %+v after seq %d", ev, term.seq)
			}
			term.seq = ev.Seq
			term.out.Write(data)
		default:
			term.exit = &ev
		}
		close(term.changed)
		term.changed = make(chan struct{})
		term.mu.Unlock()
		if !ok || ev.Type != "data" {
			return
		}
	}
}

// waitFor waits until the output after offset from contains want, and
// returns the offset just past it.
func (term *terminal) waitFor(from int, want string) int {
	term.t.Helper()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		term.mu.Lock()
		out, changed, exit := term.out.String(), term.changed, term.exit
		term.mu.Unlock()
		if i := strings.Index(out[from:], want); i >= 0 {
			return from + i + len(want)
		}
		if exit != nil {
			term.t.Fatalf("the terminal ended (%+v) without %q; it showed:\n%s", *exit, want, out)
		}
		select {
		case <-changed:
		case <-timer.C:
			term.t.Fatalf("no %q on the terminal; it showed:\n%s", want, out)
		}
	}
}

// end waits for the stream's last frame.
func (term *terminal) end() event {
	term.t.Helper()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		term.mu.Lock()
		exit, changed := term.exit, term.changed
		term.mu.Unlock()
		if exit != nil {
			return *exit
		}
		select {
		case <-changed:
		case <-timer.C:
			term.t.Fatal("the stream did not end")
		}
	}
}

// shown returns the output after offset from.
func (term *terminal) shown(from int) string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.String()[from:]
}

// size returns how much output came so far.
func (term *terminal) size() int {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.Len()
}

func (term *terminal) input(data string) {
	term.t.Helper()
	body := map[string]string{"data_base64": base64.StdEncoding.EncodeToString([]byte(data))}
	term.ts.mustCall("POST", term.path("/input"), body, nil)
}

func (term *terminal) resize(rows, cols int) int {
	term.t.Helper()
	return term.ts.call("POST", term.path("/resize"), map[string]int{"rows": rows, "cols": cols}, nil)
}

func (term *terminal) path(suffix string) string {
	return "/sandboxes/" + term.lease + "/processes/" + term.pid + suffix
}

// A shell on a terminal of the lease's: it runs what is typed, sees the
// size it was created with and the new one after a resize, ^C interrupts
// its foreground command, and its exit code comes through wait. The
// terminal is numbered in the lease's own devpts: the host's terminal,
// opened first, is not in the lease's /dev/pts.
func TestPtyShellTypedInputSizeResizeInterruptAndExit(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own devpts needs namespaces")
	host, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	hostPty, err := unix.IoctlGetUint32(int(host.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Options{Isolation: IsolationNamespaces})
	lease := ts.createLease()
	term := ts.startTerminal(t, lease, map[string]any{"cmd": "/bin/sh", "args": []string{"-i"}, "pty": map[string]int{"rows": 24, "cols": 80}})

	term.input("echo $((6*7))\n")
	at := term.waitFor(0, "42")
	term.input("stty size\n")
	at = term.waitFor(at, "24 80")
	term.input("trap 'echo winch-$((3*3))' WINCH; echo trapped-$((2*2))\n")
	at = term.waitFor(at, "trapped-4")
	if status := term.resize(40, 100); status != http.StatusOK {
		t.Fatalf("resize: HTTP %d", status)
	}
	term.input("stty size\n")
	term.waitFor(at, "winch-9") // the shell got SIGWINCH
	at = term.waitFor(at, "40 100")

	// The terminal's own: the lease's devpts has only it, numbered from 0,
	// whatever the host's has.
	term.input("tty; ls /dev/pts | tr '\\n' ' '; echo :$((1+1))\n")
	end := term.waitFor(at, ":2")
	shown := term.shown(at)
	at = end
	if !strings.Contains(shown, "/dev/pts/0") || !strings.Contains(shown, "0 ptmx :2") {
		t.Errorf("the lease's terminal is not /dev/pts/0 of its own devpts (the host's terminal is %d); it showed:\n%s", hostPty, shown)
	}

	term.input("echo sleeping-$((2+2)); sleep 100\n")
	at = term.waitFor(at, "sleeping-4")
	// ^C is for the terminal's foreground process group: type it once
	// the shell made sleep's group that (nothing signals it: look).
	waitForeground(t, ts, lease, "sleep\x00")
	began := time.Now()
	term.input("\x03")
	term.input("echo status-$?\n")
	at = term.waitFor(at, "status-130")
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("^C took %v to end sleep", took)
	}

	term.input("exit 3\n")
	w, status := ts.waitTree(lease, term.pid, 20*time.Second)
	if status != http.StatusOK || !w.TreeExited || w.ExitCode == nil || *w.ExitCode != 3 {
		t.Fatalf("wait: HTTP %d %+v, want exit code 3", status, w)
	}
	if end := term.end(); end.Type != "exit" || end.ExitCode == nil || *end.ExitCode != 3 {
		t.Errorf("the stream ended with %+v, want exit code 3", end)
	}
}

// waitForeground waits until a process of the lease whose command line
// starts with prefix is in the foreground process group of its terminal.
func waitForeground(t *testing.T, ts *testServer, lease, prefix string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); <-tick.C {
		for _, pid := range hostPIDs(t, ts, lease, prefix) {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			// After the command's name (in parentheses): state, ppid,
			// pgrp, session, tty_nr, tpgid.
			_, rest, _ := strings.Cut(string(stat), ") ")
			if f := strings.Fields(rest); len(f) > 5 && f[2] == f[5] {
				return
			}
		}
	}
	t.Fatalf("no %q in the foreground of its terminal", prefix)
}

// A pty process's output is journaled like a pipe process's: a second
// connect from the start replays it all, one after the first's cursor
// gets only what came later, and the exit frame follows the last output.
func TestPtyReconnectReplaysFromTheCursor(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own devpts needs namespaces")
	ts := startServer(t, Options{Isolation: IsolationNamespaces})
	lease := ts.createLease()
	// No cmd: the image's shell.
	term := ts.startTerminal(t, lease, map[string]any{"pty": map[string]int{"rows": 10, "cols": 60}})
	term.input("echo first-$((1+1))\n")
	term.waitFor(0, "first-2")
	term.mu.Lock()
	cursor, before := term.seq, term.out.String()
	term.mu.Unlock()

	term.input("echo second-$((1+2)); exit\n")
	if w, _ := ts.waitTree(lease, term.pid, 20*time.Second); !w.TreeExited || w.ExitCode == nil || *w.ExitCode != 0 {
		t.Fatalf("wait: %+v", w)
	}
	replay := ts.connect(lease, term.pid, 0).drainPty(t, 0)
	if !strings.HasPrefix(replay, before) || !strings.Contains(replay, "second-3") {
		t.Errorf("a replay from 0 showed:\n%s\nwant it to start with:\n%s\nand show second-3", replay, before)
	}
	rest := ts.connect(lease, term.pid, cursor).drainPty(t, cursor)
	if rest != replay[len(before):] {
		t.Errorf("after seq %d: %q, want %q", cursor, rest, replay[len(before):])
	}
}

// drainPty reads a pty process's stream to its exit frame and returns
// what the terminal showed.
func (st *stream_) drainPty(t *testing.T, after int64) string {
	t.Helper()
	var out bytes.Buffer
	for {
		ev, ok := st.next(false)
		switch {
		case !ok:
			t.Fatal("the stream ended without an exit frame")
		case ev.Type == "data" && ev.Stream == "pty" && ev.Seq == after+1:
			after = ev.Seq
			data, _ := base64.StdEncoding.DecodeString(ev.DataBase64)
			out.Write(data)
		case ev.Type == "exit":
			return out.String()
		default:
			t.Fatalf("frame %+v after seq %d", ev, after)
		}
	}
}

// Closing a terminal's stdin types its EOF: cat, reading it, ends; more
// input is refused, and a signal reaches the tree as on pipes.
func TestPtyStdinCloseTypesEOFAndSignalsReachTheTree(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own devpts needs namespaces")
	ts := startServer(t, Options{Isolation: IsolationNamespaces})
	lease := ts.createLease()
	term := ts.startTerminal(t, lease, map[string]any{"cmd": "cat", "pty": map[string]int{"rows": 5, "cols": 20}})
	term.input("meow\n")
	term.waitFor(0, "meow\r\nmeow\r\n") // echoed by the terminal, then by cat
	ts.mustCall("POST", term.path("/stdin/close"), nil, nil)
	if w, _ := ts.waitTree(lease, term.pid, 20*time.Second); !w.TreeExited || w.ExitCode == nil || *w.ExitCode != 0 {
		t.Fatalf("cat after stdin/close: %+v", w)
	}
	body := map[string]string{"data_base64": base64.StdEncoding.EncodeToString([]byte("x"))}
	if status := ts.call("POST", term.path("/input"), body, nil); status != http.StatusConflict {
		t.Errorf("input after stdin/close: HTTP %d, want 409", status)
	}
	if status := term.resize(10, 10); status != http.StatusConflict {
		t.Errorf("resize after the tree exited: HTTP %d, want 409", status)
	}

	sleeper := ts.startTerminal(t, lease, map[string]any{"cmd": "sleep", "args": []string{"100"}, "pty": map[string]int{"rows": 5, "cols": 20}})
	ts.mustCall("POST", sleeper.path("/signal"), map[string]string{"signal": "SIGTERM"}, nil)
	if w, _ := ts.waitTree(lease, sleeper.pid, 20*time.Second); !w.TreeExited || w.Signal != "SIGTERM" {
		t.Fatalf("sleep after SIGTERM: %+v", w)
	}
}

// Bad sizes are refused before anything starts; resize is a terminal's,
// and an exec never has one.
func TestPtyBadSizesAreRefused(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	for _, pty := range []string{`{}`, `{"rows":0,"cols":80}`, `{"rows":24,"cols":1001}`, `{"rows":-1,"cols":80}`, `{"rows":"24","cols":80}`} {
		body := fmt.Sprintf(`{"cmd":"true","pty":%s}`, pty)
		if status := ts.call("POST", "/sandboxes/"+lease+"/processes", body, nil); status != http.StatusBadRequest {
			t.Errorf("create with pty %s: HTTP %d, want 400", pty, status)
		}
	}
	var procs struct{ Processes []processView }
	ts.mustCall("GET", "/sandboxes/"+lease+"/processes", nil, &procs)
	if len(procs.Processes) != 0 {
		t.Errorf("refused creates started processes: %+v", procs.Processes)
	}
	if status := ts.call("POST", "/sandboxes/"+lease+"/exec", `{"cmd":"true","pty":{"rows":24,"cols":80}}`, nil); status != http.StatusBadRequest {
		t.Errorf("exec with a pty: HTTP %d, want 400", status)
	}

	pid := ts.startProcess(lease, "exec sleep 100")
	base := "/sandboxes/" + lease + "/processes/" + pid
	for _, size := range []string{`{"rows":0,"cols":80}`, `{"rows":24,"cols":1001}`, `{}`} {
		if status := ts.call("POST", base+"/resize", size, nil); status != http.StatusBadRequest {
			t.Errorf("resize to %s: HTTP %d, want 400", size, status)
		}
	}
	if status := ts.call("POST", base+"/resize", `{"rows":24,"cols":80}`, nil); status != http.StatusConflict {
		t.Errorf("resize of a process on pipes: HTTP %d, want 409", status)
	}
	ts.mustCall("DELETE", base+"?grace_ms=0", nil, nil)
}

// In process-group mode, which has no lease namespaces, the supervisor
// opens the terminal on the host: the same API, the same terminal.
func TestPtyInProcessGroupMode(t *testing.T) {
	// Commands run as uid 65534 and must reach the root by path.
	dir, err := os.MkdirTemp("", "sandboxd-pty-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ts := startServer(t, Options{Isolation: IsolationProcessGroup, Root: filepath.Join(dir, "root")})
	lease := ts.createLease()
	term := ts.startTerminal(t, lease, map[string]any{"cmd": "/bin/sh", "args": []string{"-i"}, "pty": map[string]int{"rows": 7, "cols": 33}})
	term.input("stty size; exit 5\n")
	term.waitFor(0, "7 33")
	if end := term.end(); end.Type != "exit" || end.ExitCode == nil || *end.ExitCode != 5 {
		t.Errorf("the stream ended with %+v, want exit code 5", end)
	}
}

// A background process that keeps the terminal open (deaf to the SIGHUP
// of its session leader's exit) does not hold back the leader's exit: it
// is recorded terminalDrainGrace after the status, with what the leader
// showed before it, and the tree lives on until a DELETE ends it.
func TestPtyLeaderExitIsNotHeldByABackgroundProcess(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own devpts needs namespaces")
	ts := startServer(t, Options{Isolation: IsolationNamespaces})
	lease := ts.createLease()
	term := ts.startTerminal(t, lease, map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "trap '' HUP; sleep 1000 & echo leader-$((2+3)); exit 4"}, "pty": map[string]int{"rows": 5, "cols": 40}})
	var w waitData
	ts.mustCall("GET", term.path("/wait?scope=leader&timeout_ms=20000"), nil, &w)
	if !w.LeaderExited || w.TreeExited || w.ExitCode == nil || *w.ExitCode != 4 {
		t.Fatalf("wait for the leader: %+v, want exit code 4 with the tree alive", w)
	}
	if end := term.end(); end.Type != "exit" || !strings.Contains(term.shown(0), "leader-5") {
		t.Errorf("the stream ended with %+v after %q, want the exit after leader-5", end, term.shown(0))
	}
	var gone processView
	ts.mustCall("DELETE", term.path("?grace_ms=0"), nil, &gone)
	if !gone.TreeExited {
		t.Errorf("DELETE left the tree: %+v", gone)
	}
}

// A lease opens at most leaseinit.MaxTerminals terminals at once: its devpts says
// no past that, so no lease takes the kernel's pool from the others.
func TestPtyALeaseHasAtMostMaxTerminals(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own devpts needs namespaces")
	ts := startServer(t, Options{Isolation: IsolationNamespaces})
	lease := ts.createLease()
	r := ts.exec(lease, `exec perl -e 'my @f; while (@f < 1000 && open(my $f, "+<", "/dev/ptmx")) { push @f, $f } print scalar(@f), " $!"'`)
	if want := fmt.Sprintf("%d No space left on device", leaseinit.MaxTerminals); r.Stdout != want {
		t.Errorf("terminals opened: %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}
}

// BenchmarkPtyKeystrokeEcho is the round trip of one key through the
// API: input, the lease's terminal echoing it, and its frame back on the
// open connect stream.
func BenchmarkPtyKeystrokeEcho(b *testing.B) {
	testenv.RequireRoot(b, "a lease's own devpts needs namespaces")
	ts := startServer(b, Options{Isolation: IsolationNamespaces})
	lease := ts.createLease()
	var view processView
	ts.mustCall("POST", "/sandboxes/"+lease+"/processes", map[string]any{"cmd": "cat", "pty": map[string]int{"rows": 5, "cols": 20}}, &view)
	st := ts.connect(lease, view.ProcessID, 0)
	path := "/sandboxes/" + lease + "/processes/" + view.ProcessID + "/input"
	key := map[string]string{"data_base64": base64.StdEncoding.EncodeToString([]byte("k"))}
	b.ResetTimer()
	for range b.N {
		ts.mustCall("POST", path, key, nil)
		if ev, ok := st.next(false); !ok || ev.Type != "data" {
			b.Fatalf("frame %+v", ev)
		}
	}
}
