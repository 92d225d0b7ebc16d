package localsandbox

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestOutputOfBothStreamsInOrderThenExitCode(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	out := ts.run(lease, `for i in $(seq 1 2000); do echo "out $i"; echo "err $i" >&2; done; exit 7`)
	var wantOut, wantErr strings.Builder
	for i := 1; i <= 2000; i++ {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	if got := out.stdout.String(); got != wantOut.String() {
		t.Errorf("stdout differs: %d bytes, want %d", len(got), wantOut.Len())
	}
	if got := out.stderr.String(); got != wantErr.String() {
		t.Errorf("stderr differs: %d bytes, want %d", len(got), wantErr.Len())
	}
	if out.last.Type != "exit" || out.last.ExitCode == nil || *out.last.ExitCode != 7 {
		t.Errorf("last frame %+v, want exit 7", out.last)
	}
}

func TestExitFrameFollowsAllOutputOfAFastExit(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	// More than a pipe holds, written just before the process exits.
	out := ts.run(lease, `head -c 300000 /dev/zero | tr '\0' x; printf tail`)
	if got := out.stdout.Len(); got != 300004 {
		t.Errorf("stdout has %d bytes before the exit frame, want 300004", got)
	}
	if !strings.HasSuffix(out.stdout.String(), "tail") {
		t.Errorf("the last bytes are missing")
	}
	if out.last.ExitCode == nil || *out.last.ExitCode != 0 {
		t.Errorf("last frame %+v", out.last)
	}
}

func TestExitBySignal(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	out := ts.run(lease, `echo before; kill -TERM $$`)
	if out.last.Type != "exit" || out.last.Signal != "SIGTERM" || out.last.ExitCode != nil {
		t.Errorf("last frame %+v, want signal SIGTERM", out.last)
	}
	if out.stdout.String() != "before\n" {
		t.Errorf("stdout %q", out.stdout.String())
	}
}

func TestStdinInputThenClose(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `cat; echo "done $?"`)
	base := "/sandboxes/" + lease + "/processes/" + pid
	for i, chunk := range []string{"hello ", "world\n"} {
		var w struct {
			InputSeq int `json:"input_seq"`
		}
		ts.mustCall("POST", base+"/input", map[string]string{"data_base64": base64.StdEncoding.EncodeToString([]byte(chunk))}, &w)
		if w.InputSeq != i+1 {
			t.Errorf("input_seq %d, want %d", w.InputSeq, i+1)
		}
	}
	var closed struct{ OK bool }
	if ts.mustCall("POST", base+"/stdin/close", nil, &closed); !closed.OK {
		t.Errorf("stdin/close answered no ok")
	}
	if status := ts.call("POST", base+"/stdin/close", nil, nil); status != http.StatusOK {
		t.Errorf("second stdin/close: %d, want 200 (idempotent)", status)
	}
	if status := ts.call("POST", base+"/input", map[string]string{"data_base64": "eA=="}, nil); status != http.StatusConflict {
		t.Errorf("input after close: %d, want 409", status)
	}
	out := ts.connect(lease, pid, 0).drain(0)
	if got := out.stdout.String(); got != "hello world\ndone 0\n" {
		t.Errorf("stdout %q", got)
	}
}

// stdin/close of a process that has exited, and a repeated one, answer
// 200: the Go and Python managed-process examples close stdin of a process
// that may be done. (They answered 409.)
func TestStdinCloseAfterExitIsOK(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `echo done`)
	if _, status := ts.waitTree(lease, pid, 10*time.Second); status != http.StatusOK {
		t.Fatalf("wait: %d", status)
	}
	for i := range 2 {
		var closed struct{ OK bool }
		if status := ts.call("POST", "/sandboxes/"+lease+"/processes/"+pid+"/stdin/close", nil, &closed); status != http.StatusOK || !closed.OK {
			t.Errorf("stdin/close %d after the exit: %d %+v, want 200 ok", i+1, status, closed)
		}
	}
	if status := ts.call("POST", "/sandboxes/"+lease+"/processes/proc-unknown/stdin/close", nil, nil); status != http.StatusNotFound {
		t.Errorf("stdin/close of no process: %d, want 404", status)
	}
}

func TestEnvironmentAndWorkingDirectory(t *testing.T) {
	t.Setenv("SANDBOXD_TEST_SECRET", "must-not-leak")
	ts := startServer(t, Options{})
	lease := ts.createLease()
	ts.exec(lease, "mkdir -p /workspace/sub/dir")
	for _, tc := range []struct{ cwd, want string }{
		{"", "/workspace"},
		{"sub/dir", "/workspace/sub/dir"},
		{"/tmp", "/tmp"},
		{"/workspace/sub", "/workspace/sub"},
	} {
		var created struct {
			ProcessID string `json:"process_id"`
		}
		ts.mustCall("POST", "/sandboxes/"+lease+"/processes", map[string]any{"cmd": "pwd", "args": []string{}, "cwd": tc.cwd}, &created)
		out := ts.connect(lease, created.ProcessID, 0).drain(0)
		if got := strings.TrimSpace(out.stdout.String()); got != tc.want {
			t.Errorf("cwd %q: pwd says %q, want %q", tc.cwd, got, tc.want)
		}
	}
	out := ts.run(lease, `env GREETING='hi there' bash -c 'echo "$GREETING"'; env`)
	lines := strings.SplitN(out.stdout.String(), "\n", 2)
	if lines[0] != "hi there" {
		t.Errorf("env: %q", lines[0])
	}
	if strings.Contains(out.stdout.String(), "must-not-leak") {
		t.Errorf("the server's environment reached the sandbox")
	}
	for _, want := range []string{"HOME=/workspace", "PATH=" + sandboxPath} {
		if !strings.Contains(out.stdout.String(), want+"\n") {
			t.Errorf("environment lacks %s", want)
		}
	}
}

func TestBadCommandOrCwdIsNotCreated(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	for _, body := range []map[string]any{
		{"cmd": "no-such-program-xyz", "args": []string{}},
		{"cmd": "/workspace/missing", "args": []string{}},
		{"cmd": "/bin/bash", "args": []string{"-c", "true"}, "cwd": "/no/such/dir"},
		{"cmd": "/bin/bash", "args": []string{"-c", "true"}, "cwd": "missing-sub"},
	} {
		if status := ts.call("POST", "/sandboxes/"+lease+"/processes", body, nil); status != http.StatusBadRequest {
			t.Errorf("%v: %d, want 400", body, status)
		}
	}
	if h := ts.srv.History(); len(h) != 0 {
		t.Errorf("history has %d records of commands that never ran", len(h))
	}
	if st, _ := ts.srv.Stats(); st.Processes != 0 || st.ProcessesStarted != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestConcurrentReadersReplayAndHeartbeat(t *testing.T) {
	ts := startServer(t, Options{HeartbeatInterval: 20 * time.Millisecond})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `echo one; echo two; read line; echo "$line"`)
	base := "/sandboxes/" + lease + "/processes/" + pid
	first := ts.connect(lease, pid, 0)
	var got []string
	for len(got) < 2 {
		ev, ok := first.next(false)
		if !ok || ev.Type != "data" {
			t.Fatalf("frame %+v", ev)
		}
		data, _ := base64.StdEncoding.DecodeString(ev.DataBase64)
		got = append(got, strings.Split(strings.TrimSpace(string(data)), "\n")...)
	}
	// The process now waits on stdin: both streams go idle and carry
	// heartbeats.
	if ev, _ := first.next(true); ev.Type != "heartbeat" {
		t.Errorf("idle stream carried %+v, want a heartbeat", ev)
	}
	second := ts.connect(lease, pid, 0)
	ts.mustCall("POST", base+"/input", map[string]string{"data_base64": base64.StdEncoding.EncodeToString([]byte("three\n"))}, nil)
	if status := ts.call("POST", base+"/stdin/close", nil, nil); status != http.StatusOK {
		t.Errorf("stdin/close: %d", status)
	}
	full := second.drain(0)
	if full.stdout.String() != "one\ntwo\nthree\n" {
		t.Errorf("second reader got %q", full.stdout.String())
	}
	rest := first.drain(full.newestSeq - 1)
	if rest.stdout.String() != "three\n" || rest.last.ExitCode == nil {
		t.Errorf("first reader got %q then %+v", rest.stdout.String(), rest.last)
	}
	// A late reader gets the tail it asks for, then the exit.
	late := ts.connect(lease, pid, full.newestSeq-1).drain(full.newestSeq - 1)
	if late.stdout.String() != "three\n" || late.last.ExitCode == nil || *late.last.ExitCode != 0 {
		t.Errorf("late reader got %q then %+v", late.stdout.String(), late.last)
	}
	w, status := ts.waitTree(lease, pid, time.Second)
	if status != http.StatusOK || w.Output.NewestSeq != full.newestSeq || w.ExitCode == nil || *w.ExitCode != 0 || !w.TreeExited {
		t.Errorf("wait: %d %+v", status, w)
	}
}

func TestSignalGoesToTheTree(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `trap 'echo got INT; exit 3' INT; echo ready; while :; do sleep 0.01; done`)
	st := ts.connect(lease, pid, 0)
	if ev, _ := st.next(false); ev.Type != "data" {
		t.Fatalf("frame %+v", ev)
	}
	base := "/sandboxes/" + lease + "/processes/" + pid
	for _, bad := range []any{map[string]string{"signal": "SIGSTOP"}, map[string]string{"signal": "TERM"}, map[string]int{"signal": 15}} {
		if status := ts.call("POST", base+"/signal", bad, nil); status != http.StatusBadRequest {
			t.Errorf("signal %v: %d, want 400", bad, status)
		}
	}
	ts.mustCall("POST", base+"/signal", map[string]string{"signal": "SIGINT"}, nil)
	out := st.drain(1)
	if out.stdout.String() != "got INT\n" || out.last.ExitCode == nil || *out.last.ExitCode != 3 {
		t.Errorf("after SIGINT: %q %+v", out.stdout.String(), out.last)
	}
	ts.waitTree(lease, pid, 5*time.Second)
	if status := ts.call("POST", base+"/signal", map[string]string{"signal": "SIGTERM"}, nil); status != http.StatusConflict {
		t.Errorf("signal after exit: %d, want 409", status)
	}
}

// doubleFork starts a grandchild that leaves its parent's tree the classic
// way (setsid in a subshell that exits) and then waits for the gate file;
// the main process exits at once.
const doubleFork = `( setsid bash -c 'echo $$ > /workspace/grandchild; until [ -e /workspace/gate ]; do sleep 0.01; done; echo grandchild done' & ); until [ -s /workspace/grandchild ]; do sleep 0.01; done; echo main done`

func TestWaitTreeWaitsForADoubleForkedGrandchild(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, doubleFork)
	ts.mustCall("POST", "/sandboxes/"+lease+"/processes/"+pid+"/stdin/close", nil, nil)
	out := ts.connect(lease, pid, 0).drain(0)
	if out.stdout.String() != "main done\n" || out.last.ExitCode == nil {
		t.Fatalf("main: %q %+v", out.stdout.String(), out.last)
	}
	// At the timeout, wait answers the process as it is: its leader has
	// exited, its tree has not.
	if w, status := ts.waitTree(lease, pid, 100*time.Millisecond); status != http.StatusOK || w.TreeExited ||
		!w.LeaderExited || w.State != "exited" || w.ExitCode == nil || *w.ExitCode != 0 {
		t.Fatalf("wait with the grandchild alive: %d %+v, want the leader exited, not the tree", status, w)
	}
	for _, scope := range []string{"leader", "process"} {
		var w waitData
		ts.mustCall("GET", "/sandboxes/"+lease+"/processes/"+pid+"/wait?timeout_ms=10000&scope="+scope, nil, &w)
		if w.ExitCode == nil || *w.ExitCode != 0 || !w.LeaderExited || w.TreeExited {
			t.Errorf("wait scope=%s: %+v", scope, w)
		}
	}
	if ts.putFile(lease, "/workspace/gate", "") != http.StatusOK {
		t.Fatal("gate upload failed")
	}
	done, status := ts.waitTree(lease, pid, 10*time.Second)
	if status != http.StatusOK || !done.TreeExited || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Fatalf("wait: %d %+v", status, done)
	}
	// The grandchild's output came after the exit: it is in the journal.
	if done.Output.NewestSeq != out.newestSeq+1 {
		t.Errorf("newest_seq %d, want %d", done.Output.NewestSeq, out.newestSeq+1)
	}
	if st, _ := ts.srv.Stats(); st.Processes != 0 {
		t.Errorf("%d processes still counted", st.Processes)
	}
}

func TestDeleteKillsTheWholeTree(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, doubleFork)
	ts.connect(lease, pid, 0).drain(0)
	if st, _ := ts.srv.Stats(); st.Processes < 2 {
		t.Fatalf("expected the init and the grandchild alive, stats %+v", st)
	}
	var del struct {
		TreeExited bool `json:"tree_exited"`
	}
	ts.mustCall("DELETE", "/sandboxes/"+lease+"/processes/"+pid+"?grace_ms=50", nil, &del)
	if !del.TreeExited {
		t.Fatalf("tree_exited false")
	}
	if st, _ := ts.srv.Stats(); st.Processes != 0 {
		t.Errorf("%d processes alive after DELETE", st.Processes)
	}
	if pids, _ := SandboxProcesses(ts.root); len(pids) != 1 || pids[0] != ts.leaseInit(lease) {
		t.Errorf("processes alive after DELETE: %v, want only the lease's init", pids)
	}
	if status := ts.call("DELETE", "/sandboxes/"+lease+"/processes/"+pid, nil, nil); status != http.StatusNotFound {
		t.Errorf("second DELETE: %d, want 404", status)
	}
	h := ts.srv.History()
	if len(h) != 1 || h[0].End.IsZero() || string(h[0].Stdout) != "main done\n" {
		t.Errorf("history %+v", h)
	}
}

func TestDeleteGivesTheTreeItsGrace(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	pid := ts.startProcess(lease, `trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.01; done`)
	st := ts.connect(lease, pid, 0)
	st.next(false)
	var del struct {
		TreeExited bool `json:"tree_exited"`
	}
	start := time.Now()
	ts.mustCall("DELETE", "/sandboxes/"+lease+"/processes/"+pid+"?grace_ms=30000", nil, &del)
	if !del.TreeExited {
		t.Fatal("tree_exited false")
	}
	if elapsed := time.Since(start); elapsed > 20*time.Second {
		t.Errorf("DELETE waited out the grace (%v) although the tree exited on SIGTERM", elapsed)
	}
	if h := ts.srv.History(); len(h) != 1 || h[0].ExitCode != 0 || h[0].Signal != "" {
		t.Errorf("history %+v: want a clean exit on SIGTERM", h)
	}
}
