package localsandbox

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The host-compromise attack of issue 26, item 1, as an attacker would run
// it through the API: a lease replaces every path the server touches on
// its behalf (the skeleton directories of its root, /etc/resolv.conf, the
// files a fork's id shift re-owns) with symlinks into a host directory,
// pauses and forks with egress on; the fork is set up, started and
// destroyed, and so is the source. The host directory must come out as it
// went in: nothing created, written, re-moded or re-owned. (On be7ee59 the
// fork's set-up made var/tmp, mode 1777 and owned by the fork, in the host
// directory, and wrote the fork's resolv.conf over the host file.)
func TestLeaseSymlinksDoNotReachTheHost(t *testing.T) {
	needNetwork(t)
	host := t.TempDir() // root's, mode 0700: nothing a lease could reach itself
	for _, d := range []string{"var", "run", "root", "home", "opt", "srv", "mnt", "etc", "deep/er"} {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"victim", "etc/resolv.conf", "etc/hostname", "shadow", "deep/er/file"} {
		if err := os.WriteFile(filepath.Join(host, f), []byte("host's own "+f+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, host)

	ts := startServer(t, Options{Egress: EgressAny})
	src := ts.createWith(map[string]any{"egress": []string{"*"}}).ID
	// Every skeleton directory, resolv.conf, whole trees and single files,
	// in the root's upper layer, the workspace and tmp: as links to the
	// host, which a fork's copy, id shift and set-up meet.
	var plant strings.Builder
	plant.WriteString("set -e\n")
	for _, d := range []string{"var", "run", "root", "home", "opt", "srv", "mnt"} {
		fmt.Fprintf(&plant, "rm -rf /%s && ln -s %s /%s\n", d, filepath.Join(host, d), d)
	}
	fmt.Fprintf(&plant, "rm -f /etc/resolv.conf && ln -s %s /etc/resolv.conf\n", filepath.Join(host, "victim"))
	fmt.Fprintf(&plant, "ln -s %s /etc/hostlink\n", filepath.Join(host, "etc"))
	fmt.Fprintf(&plant, "mkdir -p /usr/local/x && ln -s %s /usr/local/x/shadow\n", filepath.Join(host, "shadow"))
	fmt.Fprintf(&plant, "ln -s %s /workspace/deep && ln -s %s /tmp/file\n", filepath.Join(host, "deep"), filepath.Join(host, "deep/er/file"))
	fmt.Fprintf(&plant, "chown -h 1000:1000 /workspace/deep /tmp/file /usr/local/x/shadow\n")
	if r := ts.exec(src, plant.String()); r.ExitCode != 0 {
		t.Fatalf("planting the links: %+v", r)
	}
	ts.mustCall("POST", "/sandboxes/"+src+"/pause", nil, nil)
	waitStatus(t, ts, src, "paused")
	var fork sandboxData
	ts.mustCall("POST", "/sandboxes/"+src+"/fork", map[string]any{"egress": []string{"*"}}, &fork)
	got := waitSettled(t, ts, fork.ID)
	if got == "running" {
		// The fork has the server's resolv.conf, not the host's file, and
		// the lease's own links as it left them.
		if r := ts.exec(fork.ID, "cat /etc/resolv.conf; readlink /var /workspace/deep"); !strings.Contains(r.Stdout, "nameserver") ||
			!strings.Contains(r.Stdout, filepath.Join(host, "var")) {
			t.Errorf("in the fork: %+v", r)
		}
	}
	ts.mustCall("POST", "/sandboxes/"+src+"/resume", nil, nil)
	waitStatus(t, ts, src, "running")
	for _, id := range []string{fork.ID, src} {
		if status := ts.call("DELETE", "/sandboxes/"+id, nil, nil); status != http.StatusOK {
			t.Errorf("destroying %s: %d", id, status)
		}
	}
	after := snapshot(t, host)
	for p, was := range before {
		if now, ok := after[p]; !ok {
			t.Errorf("host %s: removed", p)
		} else if now != was {
			t.Errorf("host %s: was %s, now %s", p, was, now)
		}
	}
	for p, now := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("host %s: created, %s", p, now)
		}
	}
	if got != "running" {
		t.Errorf("the fork is %s, want running: its set-up may refuse a link, not fail the fork", got)
	}
}

// snapshot describes every file below dir: type, mode, owner and content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v %d:%d", fi.Mode(), st.Uid, st.Gid)
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		m[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitSettled waits for a fork to leave "forking" and returns its status.
func waitSettled(t *testing.T, ts *testServer, id string) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		s := ts.status(id)
		if s != "forking" {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s stays forking", id)
		}
		time.Sleep(5 * time.Millisecond) // polling, as the protocol's clients do
	}
}
