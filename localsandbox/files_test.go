package localsandbox

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
	"golang.org/x/sys/unix"
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

// A path names a file of the lease's whole root, as its processes see it:
// a new file under /opt, /root or /etc, with its parents, and a file of the
// image's read-only layer rewritten (the overlay copies it up; the image
// stays as it was). What the server makes is the lease root's, and an
// existing file keeps its permissions.
func TestFilesAnywhereInTheLeasesRoot(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own root needs namespaces and idmapped layers")
	ts := startServer(t, Options{})
	lease := ts.createLease()
	image, _ := ts.srv.imageLayers(ts.srv.leases[lease].rootfs)
	imageVersion, err := os.ReadFile(filepath.Join(image, "etc/debian_version"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"/opt/tool/bin/run":     "#!/bin/sh\necho run\n",
		"/root/.config/x":       "of root",
		"/etc/sandboxflow.conf": "conf",
		"/etc/debian_version":   "rewritten\n",
	}
	for p, content := range files {
		if status := ts.putFile(lease, p, content); status != http.StatusOK {
			t.Fatalf("PUT %s: %d", p, status)
		}
		if got, status := ts.getFile(lease, p); status != http.StatusOK || got != content {
			t.Errorf("GET %s: %d %q", p, status, got)
		}
	}
	r := ts.exec(lease, `cat /etc/debian_version; chmod 600 /root/.config/x; stat -c '%u:%g %a %n' /opt/tool /opt/tool/bin /opt/tool/bin/run /root/.config /etc/sandboxflow.conf /etc/debian_version`)
	want := "rewritten\n0:0 755 /opt/tool\n0:0 755 /opt/tool/bin\n0:0 644 /opt/tool/bin/run\n0:0 755 /root/.config\n0:0 644 /etc/sandboxflow.conf\n0:0 644 /etc/debian_version\n"
	if r.Stdout != want {
		t.Errorf("in the lease:\n%s%s\nwant\n%s", r.Stdout, r.Stderr, want)
	}
	if got, _ := os.ReadFile(filepath.Join(image, "etc/debian_version")); string(got) != string(imageVersion) {
		t.Errorf("the image's file changed: %q", got)
	}
	ts.putFile(lease, "/root/.config/x", "again")
	if r := ts.exec(lease, `stat -c '%u:%g %a' /root/.config/x; cat /root/.config/x`); r.Stdout != "0:0 600\nagain" {
		t.Errorf("a rewritten file: %q, want it to keep its mode 600", r.Stdout)
	}
}

// /proc, /sys and /dev, a FIFO and a directory are refused, whether named
// or reached through a symlink of the lease; nothing is made there.
func TestFilesRefuseWhatIsNotAFileOfTheDisk(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own root needs namespaces and idmapped layers")
	ts := startServer(t, Options{MaxFileBytes: 1000})
	lease := ts.createLease()
	r := ts.exec(lease, `
		mkfifo /workspace/fifo && mkdir /workspace/dir && echo x > /dev/shm/x &&
		ln -s /proc/1/environ /workspace/penv && ln -s /proc /workspace/proc &&
		ln -s /dev /workspace/dev && ln -s /dev/shm /workspace/shm && ln -s /proc/1/root /workspace/magic && echo ok`)
	if r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.Stdout, r.Stderr)
	}
	for _, p := range []string{
		"/", "/etc", "/proc", "/proc/1/environ", "/proc/self/environ", "/sys/kernel/notes", "/dev/null", "/dev/shm/x",
		"/workspace/fifo", "/workspace/dir", "/workspace/penv", "/workspace/proc/1/environ", "/workspace/dev/null",
		"/workspace/shm/x", "/workspace/magic/etc/hostname",
	} {
		if got, status := ts.getFile(lease, p); status != http.StatusBadRequest {
			t.Errorf("GET %q: %d %q, want 400", p, status, got)
		}
	}
	for _, p := range []string{
		"/", "/etc", "/proc/x", "/sys/x", "/dev/x", "/dev/shm/y", "/workspace/fifo", "/workspace/dir",
		"/workspace/proc/x", "/workspace/dev/y", "/workspace/shm/y", "/workspace/shm/d/y", "/workspace/magic/etc/x",
	} {
		if status := ts.putFile(lease, p, "written"); status != http.StatusBadRequest {
			t.Errorf("PUT %q: %d, want 400", p, status)
		}
	}
	if status := ts.putFile(lease, "/opt/big", strings.Repeat("x", 1001)); status != http.StatusRequestEntityTooLarge {
		t.Errorf("PUT over the limit: %d, want 413", status)
	}
	resp := ts.request("PUT", "/sandboxes/"+lease+"/files?path="+url.QueryEscape("/opt/big"),
		struct{ *strings.Reader }{strings.NewReader(strings.Repeat("x", 5000))}, nil) // chunked: found while reading
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked PUT over the limit: %d, want 413", resp.StatusCode)
	}
	r = ts.exec(lease, `ls -A /opt; ls /dev/shm | tr '\n' ' '; test -p /workspace/fifo && ls /workspace/dir | wc -l; test -e /etc/x || echo none`)
	if r.Stdout != "x 0\nnone\n" {
		t.Errorf("after the refusals: %q %q", r.Stdout, r.Stderr)
	}
}

// The lease plants symlinks to host paths, absolute and relative ("..",
// however many), and to its root: each resolves inside the lease's root,
// never the host's. Nothing of the host is read, nothing written there.
func TestFilesSymlinksOfTheLeaseStayInItsRoot(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own root needs namespaces and idmapped layers")
	ts := startServer(t, Options{})
	lease := ts.createLease()
	host := hostDirWithSecret(t)
	other := ts.createLease()
	ts.putFile(other, "/workspace/secret", "of the other lease")
	otherSecret := filepath.Join(ts.root, leasesDir, other, "workspace", "secret")
	// The lease has a directory of the host's name, as a naive join of
	// its links would need to write to the host.
	r := ts.exec(lease, `mkdir -p `+host+` &&
		ln -s `+host+` /workspace/abs && ln -s ../../../../../../../..`+host+` /workspace/rel &&
		ln -s / /workspace/root && ln -s ../../../../.. /workspace/up && ln -s /nowhere/at/all /workspace/dangling && echo ok`)
	if r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.Stdout, r.Stderr)
	}
	for _, p := range []string{
		"/workspace/abs/secret", "/workspace/rel/secret", "/workspace/root" + host + "/secret", "/workspace/up" + host + "/secret",
		host + "/secret", otherSecret, "/workspace/up" + otherSecret, "/workspace/root/etc/shadow-not-here",
	} {
		if got, status := ts.getFile(lease, p); status != http.StatusNotFound {
			t.Errorf("GET %q: %d %q, want 404 (no such file in the lease)", p, status, got)
		}
	}
	hostname := ts.exec(lease, `cat /etc/hostname`).Stdout
	if got, status := ts.getFile(lease, "/workspace/up/etc/hostname"); status != http.StatusOK || got != hostname {
		t.Errorf("GET through ../..: %d %q, want the lease's /etc/hostname %q", status, got, hostname)
	}
	for _, p := range []string{"/workspace/abs/a", "/workspace/rel/b", "/workspace/root" + host + "/c", "/workspace/up" + host + "/d", host + "/e", otherSecret} {
		if status := ts.putFile(lease, p, "written"); status != http.StatusOK {
			t.Errorf("PUT %q: %d", p, status)
		}
	}
	if status := ts.putFile(lease, "/workspace/dangling/x", "written"); status != http.StatusNotFound {
		t.Errorf("PUT through a dangling link: %d, want 404 (as mkdir -p in the lease fails)", status)
	}
	if r := ts.exec(lease, `cd `+host+` && ls | tr '\n' ' '`); r.Stdout != "a b c d e " {
		t.Errorf("the lease's %s holds %q %q, want what was written through its links", host, r.Stdout, r.Stderr)
	}
	assertHostUntouched(t, host, otherSecret)
}

// hostDirWithSecret is a host directory that anybody may write, holding a
// secret anybody may read: a file operation that left the lease would
// succeed there.
func hostDirWithSecret(t *testing.T) string {
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "secret"), []byte("of the host"), 0o644)
	os.Chmod(host, 0o777)
	return host
}

// assertHostUntouched fails unless the host directory holds its secret
// alone and the other lease's file is as it was.
func assertHostUntouched(t *testing.T, host, otherSecret string) {
	t.Helper()
	if entries, _ := os.ReadDir(host); len(entries) != 1 {
		t.Errorf("the host's %s holds %d files, want its secret alone", host, len(entries))
	}
	if got, _ := os.ReadFile(filepath.Join(host, "secret")); string(got) != "of the host" {
		t.Errorf("the host's secret changed: %q", got)
	}
	if got, _ := os.ReadFile(otherSecret); string(got) != "of the other lease" {
		t.Errorf("the other lease's file changed: %q", got)
	}
}

// A process of the lease swaps a directory and a symlink to a host
// directory at one name, as fast as it can, while the server writes and
// reads through that name: whatever the interleaving, nothing is written
// to or read from the host.
func TestFilesRenameRaceStaysInTheLease(t *testing.T) {
	testenv.RequireRoot(t, "a lease's own root needs namespaces and idmapped layers")
	ts := startServer(t, Options{})
	lease := ts.createLease()
	host := hostDirWithSecret(t)
	other := ts.createLease()
	ts.putFile(other, "/workspace/secret", "of the other lease")
	otherSecret := filepath.Join(ts.root, leasesDir, other, "workspace")
	swapper := ts.startProcess(lease, `exec python3 -c '
import os, sys
os.mkdir("/workspace/dir")
os.symlink(sys.argv[1], "/workspace/link")
open("/workspace/swapping", "w").close()
while True:
    os.rename("/workspace/dir", "/workspace/race"); os.rename("/workspace/race", "/workspace/dir")
    os.rename("/workspace/link", "/workspace/race"); os.rename("/workspace/race", "/workspace/link")
' `+host)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, status := ts.getFile(lease, "/workspace/swapping"); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the swapper did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 300 {
		ts.putFile(lease, "/workspace/race/f"+strconv.Itoa(i), "written")
		ts.putFile(lease, "/workspace/race/secret", "written")
		if got, status := ts.getFile(lease, "/workspace/race/secret"); status == http.StatusOK && got != "written" {
			t.Fatalf("read %q through the race", got)
		}
	}
	ts.call("DELETE", "/sandboxes/"+lease+"/processes/"+swapper, nil, nil)
	assertHostUntouched(t, host, filepath.Join(otherSecret, "secret"))
}

// In process-group mode there is no lease root: only the lease's
// workspace and tmp are files of the API, as host paths, and no symlink
// leads out of them.
func TestFilesOfAProcessGroupLease(t *testing.T) {
	// Commands run as uid 65534 and must reach the root by path.
	dir, err := os.MkdirTemp("", "sandboxd-files-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	ts := startServer(t, Options{Isolation: IsolationProcessGroup, MaxFileBytes: 1000, Root: filepath.Join(dir, "root")})
	lease := ts.createLease()
	ws := filepath.Join(ts.root, leasesDir, lease, "workspace")
	host := hostDirWithSecret(t)
	r := ts.exec(lease, `cd `+ws+` && ln -s `+host+` abs && ln -s ../../../../../../../..`+host+` rel && mkdir real && echo in > real/f && ln -s real in && mkfifo fifo && echo ok`)
	if r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.Stdout, r.Stderr)
	}
	if status := ts.putFile(lease, ws+"/a/b", "x"); status != http.StatusOK {
		t.Errorf("PUT below the workspace: %d", status)
	}
	if got, status := ts.getFile(lease, ws+"/in/f"); status != http.StatusOK || got != "in\n" {
		t.Errorf("GET through a link that stays inside: %d %q", status, got)
	}
	for _, p := range []string{"/etc/passwd", ws, ws + "/abs/secret", ws + "/rel/secret", ws + "/fifo", ws + "/real", ws + "/../x"} {
		if _, status := ts.getFile(lease, p); status != http.StatusBadRequest {
			t.Errorf("GET %q: %d, want 400", p, status)
		}
	}
	for _, p := range []string{"/etc/x", ws, ws + "/abs/x", ws + "/rel/x", ws + "/fifo", ws + "/real"} {
		if status := ts.putFile(lease, p, "x"); status != http.StatusBadRequest {
			t.Errorf("PUT %q: %d, want 400", p, status)
		}
	}
	if status := ts.putFile(lease, ws+"/big", strings.Repeat("x", 1001)); status != http.StatusRequestEntityTooLarge {
		t.Errorf("PUT over the limit: %d, want 413", status)
	}
	// Chunked, so that the limit is found while reading.
	resp := ts.request("PUT", "/sandboxes/"+lease+"/files?path="+url.QueryEscape(ws+"/big"),
		struct{ *strings.Reader }{strings.NewReader(strings.Repeat("x", 5000))}, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked PUT over the limit: %d, want 413", resp.StatusCode)
	}
	if r := ts.exec(lease, `cd `+ws+` && find . | sort | tr '\n' ' '`); r.Stdout != ". ./a ./a/b ./abs ./fifo ./in ./real ./real/f ./rel " {
		t.Errorf("the workspace holds %q", r.Stdout)
	}
	if entries, _ := os.ReadDir(host); len(entries) != 1 {
		t.Errorf("the host's %s holds %d files", host, len(entries))
	}
}

// A panic inside asOwner (recovered by the server, whose goroutine then
// serves the connection's next request) leaves no thread with a lease's
// file system ids: before, the ids were restored only on a normal return.
func TestAsOwnerRestoresTheIdsOnAPanic(t *testing.T) {
	testenv.RequireRoot(t, "setfsuid to another id needs CAP_SETUID")
	fr := &fileRoot{own: &hostfs.Owner{UID: 100000, GID: 100000}}
	func() {
		defer func() { recover() }()
		fr.asOwner(func() error { panic("in the callback") })
	}()
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	if uid != 0 || gid != 0 {
		t.Errorf("after a panic the thread's fsuid/fsgid are %d/%d, want 0/0", uid, gid)
	}
}
