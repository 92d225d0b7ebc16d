package localsandbox

import (
	"bytes"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"golang.org/x/sys/unix"
)

// A status channel that breaks the protocol — a garbled line, or a line
// longer than maxStatusLine — kills the tree, and nothing of it is taken
// for an exit status.
func TestBrokenStatusChannelKillsTheTree(t *testing.T) {
	ts := startServer(t, Options{})
	for name, garbage := range map[string]string{
		"garbled":  `{"exited":true,"exit_code":0` + "\n",
		"too long": `{"started":true,"failure":"` + strings.Repeat("x", maxStatusLine) + `"}` + "\n",
		"no end":   strings.Repeat("y", maxStatusLine+1),
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("sleep", "1000")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var fds [3][2]int
			for i := range fds {
				if err := unix.Pipe2(fds[i][:], unix.O_CLOEXEC); err != nil {
					t.Fatal(err)
				}
			}
			l := &lease{server: ts.srv, id: "status-test"}
			p := &process{lease: l, cmd: cmd, journal: journal.New(DefaultJournalBytes, time.Second),
				record: &ProcessRecord{}, startCh: make(chan initMessage, 1), mainExited: make(chan struct{}), done: make(chan struct{})}
			pumped := make(chan struct{})
			go func() { defer close(pumped); p.pump(ts.srv, fds[0][0], fds[1][0], fds[2][0]) }()
			unix.Write(fds[2][1], []byte(garbage))
			err := cmd.Wait()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Errorf("the tree was not killed: %v", err)
			}
			for i := range fds {
				unix.Close(fds[i][1])
			}
			<-pumped
			if st, ok := p.exitStatus(); ok {
				t.Errorf("the broken channel gave an exit status: %+v", st)
			}
			select {
			case msg := <-p.startCh:
				t.Errorf("the broken channel gave a start message: %+v", msg)
			default:
			}
		})
	}
}

// FuzzStatusLine: whatever arrives on a status pipe, the decoder never
// panics, never accepts more than maxStatusLine, and what the init encodes
// — whatever its failure text says — always fits and reads back the same.
func FuzzStatusLine(f *testing.F) {
	f.Add([]byte(`{"exited":true,"exit_code":7}`), "")
	f.Add([]byte(`{"started":true}`), "command not found")
	f.Add([]byte(`{"failure":"`+strings.Repeat("\x01", 600)+`"}`), strings.Repeat("\x00", 4096))
	f.Add([]byte("not json"), "\xff\xfe")
	f.Fuzz(func(t *testing.T, line []byte, failure string) {
		if msg, ok := decodeStatusLine(line); ok && len(line) > maxStatusLine {
			t.Fatalf("accepted a %d-byte line: %+v", len(line), msg)
		}
		sent := initMessage{Failure: failure, FailureKind: failCommand, ExitCode: len(failure)}
		enc := sent.encode()
		if len(enc) > maxStatusLine+1 {
			t.Fatalf("a failure of %d bytes encodes to a %d-byte line", len(failure), len(enc))
		}
		got, ok := decodeStatusLine(bytes.TrimSuffix(enc, []byte("\n")))
		if !ok || got.ExitCode != sent.ExitCode || got.FailureKind != sent.FailureKind || !utf8.ValidString(got.Failure) {
			t.Fatalf("%q read back as %+v, %v", enc, got, ok)
		}
	})
}
