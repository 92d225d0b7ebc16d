package localsandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// InitProgramEnv names the init program of a server whose
// Options.InitProgram is empty (see Options.InitProgram).
const InitProgramEnv = "SANDBOXD_INIT_PROGRAM"

// initProgram is what the server executes as a lease init, and as a
// supervisor in process-group mode: a build of cmd/sandboxflow-init, held
// open from New to Shutdown so that replacing the file on disk (an
// upgrade) changes nothing for this server, or else the server's own
// binary.
type initProgram struct {
	file *os.File // nil: the server's own binary
	path string   // what exec is given: /proc/self/fd/N or /proc/self/exe
	name string   // for the log
}

// handshakeTimeout bounds the init program's answer to VersionArg.
const handshakeTimeout = 10 * time.Second

// openInitProgram finds the init program (Options.InitProgram), opens it
// and checks that it speaks this server's protocol.
func openInitProgram(opts Options) (*initProgram, error) {
	path, origin := opts.InitProgram, "Options.InitProgram"
	if path == "" {
		path, origin = os.Getenv(InitProgramEnv), "$"+InitProgramEnv
	}
	if path == "" {
		if exe, err := os.Executable(); err == nil {
			beside := filepath.Join(filepath.Dir(exe), leaseinit.Program)
			if _, err := os.Stat(beside); err == nil {
				path, origin = beside, "beside the server's binary"
			}
		}
	}
	if path == "" {
		return &initProgram{path: "/proc/self/exe", name: "this binary, re-executed"}, nil
	}
	p, err := openInitProgramFile(path)
	if err != nil {
		return nil, fmt.Errorf("localsandbox: the init program %s (%s): %w", path, origin, err)
	}
	return p, nil
}

func openInitProgramFile(path string) (*initProgram, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && (!fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	p := &initProgram{file: f, path: fmt.Sprintf("/proc/self/fd/%d", f.Fd()), name: path}
	if err := p.handshake(); err != nil {
		f.Close()
		return nil, err
	}
	return p, nil
}

// handshake asks the program which protocol it speaks.
func (p *initProgram) handshake() error {
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.path)
	cmd.Args = []string{leaseinit.Arg0, "-", leaseinit.VersionArg}
	cmd.Env = []string{}
	out, err := cmd.Output()
	got := strings.TrimSpace(string(out[:min(len(out), 200)]))
	switch {
	case err == nil && got == leaseinit.ProtocolVersion:
		return nil
	case got == "":
		if err == nil {
			err = errors.New("no answer")
		}
		return fmt.Errorf("it does not answer as an init program (%w): is it a build of cmd/%s?", err, leaseinit.Program)
	default:
		return fmt.Errorf("it speaks %q, this server %q: build both from the same source (make build)", got, leaseinit.ProtocolVersion)
	}
}

// Close releases the program's file.
func (p *initProgram) Close() {
	if p.file != nil {
		p.file.Close()
	}
}
