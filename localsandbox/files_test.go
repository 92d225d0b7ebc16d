package localsandbox

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestFilesRoundTripWithParentsAndOwnership(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	for _, p := range []string{"/workspace/a/b/c.txt", "/tmp/x/y", "/workspace/./dot//slash"} {
		content := "content of " + p + "\x00\xff"
		if status := ts.putFile(lease, p, content); status != http.StatusOK {
			t.Fatalf("PUT %s: %d", p, status)
		}
		got, status := ts.getFile(lease, p)
		if status != http.StatusOK || got != content {
			t.Errorf("GET %s: %d %q", p, status, got)
		}
	}
	// Overwrite, and an empty file (the client's start gate).
	ts.putFile(lease, "/workspace/a/b/c.txt", "")
	if got, _ := ts.getFile(lease, "/workspace/a/b/c.txt"); got != "" {
		t.Errorf("after overwrite: %q", got)
	}
	if os.Geteuid() == 0 {
		uid, gid := ts.leaseIDs(lease)
		for _, rel := range []string{"workspace/a", "workspace/a/b", "workspace/a/b/c.txt"} {
			fi, err := os.Stat(filepath.Join(ts.root, leasesDir, lease, rel))
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid || int(st.Gid) != gid {
				t.Errorf("%s is owned by %d:%d, want the lease's root, %d:%d", rel, st.Uid, st.Gid, uid, gid)
			}
		}
	}
	// The sandbox's root can change what the server wrote.
	r := ts.exec(lease, `echo more >> /workspace/a/b/c.txt && rm -r /workspace/a/b && echo ok`)
	if r.Stdout != "ok\n" {
		t.Errorf("the sandbox cannot use the uploaded files: %q %q", r.Stdout, r.Stderr)
	}
	if _, status := ts.getFile(lease, "/workspace/nothing"); status != http.StatusNotFound {
		t.Errorf("GET of a missing file: %d, want 404", status)
	}
}

func TestFilesStayInsideTheLease(t *testing.T) {
	ts := startServer(t, Options{MaxFileBytes: 1000})
	lease := ts.createLease()
	other := ts.createLease()
	ts.putFile(other, "/workspace/secret", "of the other lease")
	hostSecret := filepath.Join(ts.root, leasesDir, other, "workspace", "secret")
	r := ts.exec(lease, `
		ln -s /etc /workspace/etc
		ln -s ../.. /workspace/up
		ln -s /workspace/real /workspace/abs
		mkdir /workspace/real && echo inside > /workspace/real/f
		ln -s real /workspace/rel
		mkfifo /workspace/fifo
		mkdir /workspace/dir
		echo ok`)
	if r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.Stdout, r.Stderr)
	}
	for _, p := range []string{
		"", "relative/path", "/workspace", "/workspace/", "/tmp", "/etc/passwd", "/proc/self/environ",
		"/workspace/../etc/passwd", "/workspace/a/../../etc/passwd", "/workspace/x\x00y",
		"/workspace/etc/passwd", "/workspace/up/" + other + "/workspace/secret", "/workspace/abs/f",
		"/workspace/fifo", "/workspace/dir", "/workspacex/f",
	} {
		if _, status := ts.getFile(lease, p); status != http.StatusBadRequest {
			t.Errorf("GET %q: %d, want 400", p, status)
		}
	}
	// (Below /tmp the host path names a file of this lease's /tmp: 404.)
	if got, status := ts.getFile(lease, hostSecret); status == http.StatusOK {
		t.Errorf("GET of the other lease's file by its host path: %q", got)
	}
	if got, status := ts.getFile(lease, "/workspace/rel/f"); status != http.StatusOK || got != "inside\n" {
		t.Errorf("GET through a symlink that stays inside: %d %q", status, got)
	}
	for _, p := range []string{
		"relative", "/workspace", "/etc/x", "/workspace/../x", "/workspace/x\x00y", "/workspace/etc/x",
		"/workspace/up/x", "/workspace/rel/x", "/workspace/abs/x", "/workspace/dir", "/workspace/fifo/x",
	} {
		if status := ts.putFile(lease, p, "written"); status != http.StatusBadRequest {
			t.Errorf("PUT %q: %d, want 400", p, status)
		}
	}
	if status := ts.putFile(lease, "/workspace/big", strings.Repeat("x", 1001)); status != http.StatusRequestEntityTooLarge {
		t.Errorf("PUT over the limit: %d, want 413", status)
	}
	// Chunked, so that the limit is found while reading.
	resp := ts.request("PUT", "/sandboxes/"+lease+"/files?path="+url.QueryEscape("/workspace/big"),
		struct{ *strings.Reader }{strings.NewReader(strings.Repeat("x", 5000))}, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked PUT over the limit: %d, want 413", resp.StatusCode)
	}
	// Nothing was written anywhere: the lease holds only what the setup made.
	r = ts.exec(lease, `cd /workspace && find . | sort | tr '\n' ' '; ls /tmp | wc -l; cat /workspace/real/f`)
	if want := ". ./abs ./dir ./etc ./fifo ./real ./real/f ./rel ./up 0\ninside\n"; r.Stdout != want {
		t.Errorf("lease files: %q, want %q", r.Stdout, want)
	}
	if got, _ := os.ReadFile(hostSecret); string(got) != "of the other lease" {
		t.Errorf("the other lease's file changed: %q", got)
	}
	if _, err := os.Stat("/etc/x"); err == nil {
		t.Errorf("/etc/x exists on the host")
	}
}
