package leaseinit

import (
	"encoding/json"
	"fmt"
	"syscall"
	"time"
	"unicode/utf8"
)

// The protocol between the server and its inits: what the server sends a
// lease init on its control socket (Config, then Requests), the init's one
// Reply, what it tells a supervisor (SupervisorConfig), and the Status
// lines both write on a command's status pipe.
//
//	server ──Config + [lease dir, lower layers]──────────────▶ lease init
//	server ◀──Reply{ready} or Reply{failure}───────────────── lease init
//	server ──Request{spawn} + [stdin stdout stderr status]──▶ lease init
//	server ──Request{signal} / Request{kill}────────────────▶ lease init
//	server ◀──────────── {"started"} {"exited",code} on status ─ init or supervisor
//	server ◀──── {"started"} + [terminal master] on status ─ supervisor (Terminal)
//
// and, on the spawner's socket (spawner.go), how a lease init comes to be:
//
//	server ──SpawnRequest + [control socket, network namespace]──▶ spawner
//	server ◀──SpawnReply{pid} + [pidfd] or SpawnReply{failure}──── spawner
//	server ◀──SpawnReply{exited} once the init was reaped────────── spawner

// Program is the file name of the init program, a build of
// cmd/sandboxflow-init: a small binary holding this package and little
// else, which a server looks for beside itself.
const Program = "sandboxflow-init"

// ProtocolVersion names what a server and an init program built from this
// package say to each other, and how an init behaves. A server runs only
// an init program that prints the same version (VersionArg), so that a
// stale program beside a new server is refused at start rather than
// misread mid-lease. Change it whenever this package changes;
// TestProtocolVersionFollowsTheSource fails until you do.
const ProtocolVersion = "sandboxflow-init/7"

// Spawn kinds: an exec is forked by the init itself (cheap: no new binary
// is loaded); a managed process runs under a supervisor, a child subreaper
// that holds its tree together, so that its tree can be waited for and
// killed as a whole.
const (
	KindExec    = "exec"
	KindProcess = "process"
)

// Request is one message from the server to a lease init.
type Request struct {
	Op     string   `json:"op"` // "spawn", "signal" or "kill"
	ID     uint64   `json:"id"`
	Kind   string   `json:"kind,omitempty"`
	Argv   []string `json:"argv,omitempty"`
	Cwd    string   `json:"cwd,omitempty"`
	Env    []string `json:"env,omitempty"`
	Signal int      `json:"signal,omitempty"`
	// Terminal: a managed process on a terminal of this size (KindProcess
	// only), passed on to its supervisor.
	Terminal *WinSize `json:"terminal,omitempty"`
}

// WinSize is a terminal's size in characters.
type WinSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// SpawnRequest asks the spawner to start a lease init: the init program
// with argv [Arg0, Root, LeaseArg], cloned with Cloneflags (the lease's
// namespaces) and, in its new user namespace, the given id maps; root of
// that namespace, in a session of its own, killed when the spawner dies.
// Attached: the init's end of its control socket, which becomes its fd 3,
// and with NetNS the network namespace the server made for the lease,
// which the init is started in (Cloneflags then lacks CLONE_NEWNET).
type SpawnRequest struct {
	ID         uint64                 `json:"id"`
	Root       string                 `json:"root"`
	Cloneflags uintptr                `json:"cloneflags"`
	UIDMap     []syscall.SysProcIDMap `json:"uid_map"`
	GIDMap     []syscall.SysProcIDMap `json:"gid_map"`
	// Setgroups allows setgroups(2) in the namespace: a range of ids,
	// where su, apt and the like set groups.
	Setgroups bool `json:"setgroups,omitempty"`
	NetNS     bool `json:"netns,omitempty"`
}

// SpawnReply is the spawner's answer to the SpawnRequest of ID: the
// init's host pid, with a pidfd of it attached, or why it could not
// start; and later, once the init was reaped (every process of its PID
// namespace before it), Exited.
type SpawnReply struct {
	ID      uint64 `json:"id"`
	Pid     int    `json:"pid,omitempty"`
	Failure string `json:"failure,omitempty"`
	Exited  bool   `json:"exited,omitempty"`
}

// Reply is the init's one message to the server: ready, or why not.
type Reply struct {
	Ready   bool   `json:"ready,omitempty"`
	Failure string `json:"failure,omitempty"`
}

// Bounds of the control channel. A reply longer than MaxReplyBytes, or one
// that does not parse, is a protocol failure: the init is killed.
const (
	MaxReplyBytes   = 4 << 10
	MaxRequestBytes = 4 << 20 // argv and environment of one command
	MaxRequestFDs   = 64
)

// Config is the first message to a lease init. The descriptors attached to
// it: with MountFDs a detached mount of the lease directory (overlays and
// binds need their directories on a mount of the init's own mount
// namespace, and the init may not be able to reach it by path); then one
// detached mount per layer with LowerFD (and one per path of its Above),
// in order. Without MountFDs (a server that is not root cannot make
// detached mounts) the init opens LeaseDir itself.
type Config struct {
	Hostname string    `json:"hostname"`
	LeaseDir string    `json:"lease_dir"`
	MountFDs bool      `json:"mount_fds"`
	Root     string    `json:"root"` // the server's root, argv[1] of supervisors
	Layers   []Layer   `json:"layers"`
	Symlinks []Symlink `json:"symlinks,omitempty"`
	// Masks are paths of the lease's / (files or directories of a lower
	// layer) that the init hides behind an empty file or opaque directory
	// of the lease's own in the upper layer before the lease runs: the
	// host files of the host image that are not world-readable
	// (rootfs.go, hideInUpper).
	Masks        []string `json:"masks,omitempty"`
	MaxProcs     uint64   `json:"max_procs"`
	MaxOpenFiles uint64   `json:"max_open_files"`
}

// Layer is one mount of the lease's root file system.
type Layer struct {
	Target string `json:"target"` // "/" or a path below it
	Name   string `json:"name"`   // upper/<Name> and work/<Name> in the lease directory
	// Lower is the host path of the read-only layer, which the init opens
	// itself; LowerFD says it comes as a (idmapped) detached mount instead.
	// Neither: Target is the upper directory itself.
	Lower   string `json:"lower,omitempty"`
	LowerFD bool   `json:"lower_fd,omitempty"`
	// Above are further read-only layers over Lower, the topmost last (a
	// template's build layers over its image): host paths, or with
	// LowerFD one more detached mount each, after Lower's (the paths
	// then empty: only their number counts).
	Above []string `json:"above,omitempty"`
}

// Symlink is a symlink of the lower layer's top, recreated in /.
type Symlink struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// The lease directory (<root>/leases/<id>) as the server makes it and the
// init mounts it, and where the lease's processes see its workspace and
// tmp directory.
const (
	UpperDir     = "upper"     // upper/<layer>: what the lease wrote over each lower layer
	WorkDir      = "work"      // work/<layer>: the overlays' work directories
	WorkspaceDir = "workspace" // mounted at Workspace
	TmpDir       = "tmp"       // mounted at Tmp
	Workspace    = "/workspace"
	Tmp          = "/tmp"
)

// SupervisorConfig is what the server (or a lease init) tells a supervisor
// to do.
type SupervisorConfig struct {
	Argv []string `json:"argv"`
	Cwd  string   `json:"cwd"` // absolute, as the command sees the file system
	Env  []string `json:"env"`
	// WorkspacePath is where relative working directories start.
	WorkspacePath string `json:"workspace_path"`
	MaxProcs      uint64 `json:"max_procs,omitempty"`
	MaxOpenFiles  uint64 `json:"max_open_files,omitempty"`
	// Terminal: run the command on a new pseudo-terminal of this size,
	// opened where the supervisor runs (inside the lease: the lease's own
	// devpts), as its controlling terminal in a session of its own. The
	// supervisor sends the terminal's master with its Started line
	// (SCM_RIGHTS: the status channel is then a unix socket) and keeps no
	// copy.
	Terminal *WinSize `json:"terminal,omitempty"`
}

// Status is one line an init writes on a command's status pipe: first
// Started or a Failure, later the command's exit status.
type Status struct {
	Started bool `json:"started,omitempty"`
	// Pid is the started command's, as its supervisor sees it.
	Pid int `json:"pid,omitempty"`
	// Failure says why the command could not start; FailureKind is
	// FailCwd, FailCommand (not found / not executable) or FailSetup.
	Failure     string `json:"failure,omitempty"`
	FailureKind string `json:"failure_kind,omitempty"`
	Exited      bool   `json:"exited,omitempty"`
	ExitCode    int    `json:"exit_code,omitempty"`
	Signal      string `json:"signal,omitempty"`
}

// The failure kinds of a Status.
const (
	FailCwd     = "cwd"
	FailCommand = "command"
	FailSetup   = "setup"
)

// MaxStatusLine bounds a line on a status pipe. A longer line, or one that
// does not parse, is a protocol failure: the tree is killed, and nothing of
// the line is taken for an exit status.
const MaxStatusLine = 4 << 10

// maxFailureBytes bounds the Failure text of a status message, so that a
// failure quoting a long command line (or path) still fits in
// MaxStatusLine however JSON escapes it (at most 6 bytes a byte).
const maxFailureBytes = 512

// Encode returns m as one status line, its Failure clipped.
func (m Status) Encode() []byte {
	m.Failure = clip(m.Failure, maxFailureBytes)
	b, _ := json.Marshal(m)
	return append(b, '\n')
}

// DecodeStatus parses one status line (without its newline). A line longer
// than MaxStatusLine, or one that is not a message, is not ok: the caller
// treats it as a protocol failure, never as an exit status.
func DecodeStatus(line []byte) (Status, bool) {
	var msg Status
	if len(line) > MaxStatusLine || json.Unmarshal(line, &msg) != nil {
		return Status{}, false
	}
	return msg, true
}

// clip returns s if it has at most n bytes, else a copy of its first n
// (cut at a character boundary) marked "…(+N bytes)", as the API clips
// what it quotes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s…(+%d bytes)", s[:n], len(s)-n)
}

// Timeouts of the server's inits.
const (
	// StartTimeout bounds how long a new init (or slirp4netns) may take to
	// report.
	StartTimeout = 30 * time.Second
	// KillConfirmTimeout bounds how long a tree may take to disappear
	// after SIGKILL before the server says it cannot confirm it.
	KillConfirmTimeout = 10 * time.Second
)
