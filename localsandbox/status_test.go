package localsandbox

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
	"golang.org/x/sys/unix"
)

// A status channel that breaks the protocol — a garbled line, a line
// longer than leaseinit.MaxStatusLine, or a pty process's start without
// its terminal — kills the tree, and nothing of it
// is taken for an exit status.
func TestBrokenStatusChannelKillsTheTree(t *testing.T) {
	ts := startServer(t, Options{})
	for name, garbage := range map[string]string{
		"garbled":  `{"exited":true,"exit_code":0` + "\n",
		"too long": `{"started":true,"failure":"` + strings.Repeat("x", leaseinit.MaxStatusLine) + `"}` + "\n",
		"no end":   strings.Repeat("y", leaseinit.MaxStatusLine+1),
		// A pty process that started without sending its terminal.
		"pty without its terminal": `{"started":true,"pid":7}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("sleep", "1000")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// stdout and stderr pipes, and the status channel: a socket,
			// as newInitFiles makes it.
			var fds [3][2]int
			for i := range fds {
				var err error
				if i == 2 {
					fds[i], err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				} else {
					err = unix.Pipe2(fds[i][:], unix.O_CLOEXEC)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			l := &lease{server: ts.srv, id: "status-test"}
			p := &process{lease: l, cmd: cmd, journal: journal.New(DefaultJournalBytes, time.Second),
				record: &ProcessRecord{}, startCh: make(chan leaseinit.Status, 1), mainExited: make(chan struct{}), done: make(chan struct{})}
			if strings.HasPrefix(name, "pty") {
				p.size = &leaseinit.WinSize{Rows: 24, Cols: 80}
			}
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
