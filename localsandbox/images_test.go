package localsandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/image"
)

// ensureTestImage builds the default image if the cache lacks it, before
// any test starts a server (New would, with less to say). A machine that
// cannot build it fails every namespace test; under CI that is said at
// once and the run fails.
func ensureTestImage() error {
	r, err := image.DefaultRecipe()
	if err != nil {
		return err
	}
	cache := image.Cache{Dir: image.DefaultCacheDir(), Progress: os.Stderr}
	if _, ok := cache.Lookup(r); ok {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("the default image %s is not built and only root can build it", cache.Path(r))
	}
	_, err = cache.Ensure(context.Background(), r)
	return err
}

// hostSecretOf reports whether file (a host path) is hidden from an
// unprivileged host user: it or a directory above it denies others.
func hostSecretOf(file string) bool {
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm()&0o004 == 0 {
		return err == nil
	}
	for d := filepath.Dir(file); ; d = filepath.Dir(d) {
		di, err := os.Stat(d)
		if err != nil || di.Mode().Perm()&0o001 == 0 {
			return err == nil
		}
		if d == "/" {
			return false
		}
	}
}

// plantHostSecret writes a file of random content, mode 0600, into the
// host's /etc for the length of the test, and returns its path and
// content.
func plantHostSecret(t *testing.T) (string, string) {
	t.Helper()
	b := make([]byte, 16)
	rand.Read(b)
	secret := "sandboxflow-secret-" + hex.EncodeToString(b)
	path := "/etc/sandboxflow-test-secret-" + hex.EncodeToString(b[:4])
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatalf("planting a host secret: %v", err)
	}
	t.Cleanup(func() { os.Remove(path) })
	return path, secret
}

// A lease reads no file that an unprivileged host user could not: every
// file under the lease's /etc is read in the lease (as its root), and
// none may have the content of a host file at that place which is not
// world-readable — /etc/shadow, SSH host keys, a secret planted for the
// test. On the default image the lease's /etc is the image's own; on the
// host image, which only an operator offers, what is not world-readable is
// masked.
func TestNoHostSecretInALease(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name   string
		opts   Options
		rootfs string
	}{
		{"default image", Options{}, ""},
		{"devbox:1", Options{}, "devbox:1"},
		{"host image", Options{HostImage: true}, "host"},
	} {
		t.Run(c.name, func(t *testing.T) {
			secretPath, secret := plantHostSecret(t)
			ts := startServer(t, c.opts)
			var sb sandboxData
			ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": c.rootfs}, &sb)
			// Every file of /etc the lease's root can read, with its hash;
			// those it cannot read are no leak.
			r := ts.exec(sb.ID, `find /etc -xdev -type f -print0 | xargs -0 sha256sum 2>/dev/null; cat `+secretPath+` 2>/dev/null; true`)
			if r.ExitCode != 0 || !strings.Contains(r.Stdout, " /etc/passwd\n") {
				t.Fatalf("listing /etc in the lease: %+v", r)
			}
			if strings.Contains(r.Stdout, secret) {
				t.Errorf("the lease read the secret planted in the host's %s", secretPath)
			}
			read, leaked := 0, []string{}
			for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
				sum, file, ok := strings.Cut(line, "  ")
				if !ok || !strings.HasPrefix(file, "/etc/") {
					continue
				}
				read++
				if !hostSecretOf(file) {
					continue
				}
				data, err := os.ReadFile(file)
				if err != nil || len(data) == 0 {
					continue // an empty file tells nothing
				}
				if h := sha256.Sum256(data); hex.EncodeToString(h[:]) == sum {
					leaked = append(leaked, file)
				}
			}
			if len(leaked) > 0 {
				t.Errorf("the lease read %d host files that no unprivileged host user may: %v", len(leaked), leaked)
			} else {
				t.Logf("%d files of the lease's /etc read, none a host secret", read)
			}
			shadow := ts.exec(sb.ID, `cat /etc/shadow 2>/dev/null | sha256sum`).Stdout
			hostShadow, err := os.ReadFile("/etc/shadow")
			if err != nil {
				t.Fatal(err)
			}
			if h := sha256.Sum256(hostShadow); strings.HasPrefix(shadow, hex.EncodeToString(h[:])) {
				t.Errorf("the lease's /etc/shadow is the host's")
			}
			if c.rootfs != "host" {
				if got := ts.exec(sb.ID, `. /etc/os-release; echo "$ID"; grep -c '^root:' /etc/shadow`).Stdout; got != "debian\n1\n" {
					t.Errorf("the image's /etc: %q, want Debian's os-release and a shadow of its own", got)
				}
			}
		})
	}
}

// The host image masks what is not world-readable, in directories too:
// the lease sees an empty file or directory of its own in its place, which
// it may write and remove (useradd locks the host's 0600 /etc/.pwd.lock)
// without ever reaching the host's; the rest of the host's /etc works as
// before.
func TestHostImageMasksWhatIsNotWorldReadable(t *testing.T) {
	needRoot(t)
	dir, err := os.MkdirTemp("/etc", "sandboxflow-test-private-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.WriteFile(filepath.Join(dir, "key"), []byte("private-key\n"), 0o644) // readable, in a 0700 directory
	secretPath, secret := plantHostSecret(t)
	ts := startServer(t, Options{HostImage: true, DefaultImage: "host"})
	lease := ts.createLease()
	r := ts.exec(lease, fmt.Sprintf(`cat %[1]s/key %[2]s 2>/dev/null; ls -A %[1]s | wc -l; stat -c '%%s %%a' %[2]s
		echo mine > %[2]s && cat %[2]s; rm %[2]s && echo removed; cat %[2]s 2>/dev/null
		rmdir %[1]s && echo rmdir; ls -A %[1]s 2>/dev/null | wc -l
		useradd -M masked-test && grep -c '^masked-test:' /etc/passwd`, dir, secretPath))
	if strings.Contains(r.Stdout, secret) || strings.Contains(r.Stdout, "private-key") {
		t.Errorf("a host secret read through the host image: %q", r.Stdout)
	}
	if want := "0\n0 600\nmine\nremoved\nrmdir\n0\n1\n"; r.Stdout != want {
		t.Errorf("in the lease: %q (stderr %q), want %q: the masks empty, the lease's own, and useradd working", r.Stdout, r.Stderr, want)
	}
	if got, _ := os.ReadFile(secretPath); string(got) != secret+"\n" {
		t.Errorf("the host's file changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "key")); err != nil {
		t.Errorf("the host's directory changed: %v", err)
	}
}

// GET /v1/rootfs lists the images, the default first; the vendor's
// example name and the default resolve to the Debian image; a name that
// is none, or the host image that the operator did not offer, is a 400.
func TestRootfsNamesResolveToImages(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "alpine"), 0o755)
	for _, c := range []struct {
		opts Options
		want []string
		def  string
	}{
		{Options{RootfsDir: dir}, []string{"debian:", "devbox:1", "nodeops/sandbox:debian", "alpine"}, "debian:"},
		{Options{HostImage: true}, []string{"debian:", "devbox:1", "nodeops/sandbox:debian", "host"}, "debian:"},
		{Options{HostImage: true, DefaultImage: "host"}, []string{"debian:", "devbox:1", "nodeops/sandbox:debian", "host"}, "host"},
	} {
		ts := startServer(t, c.opts)
		var cat struct {
			Rootfs  []string
			Default string
			Entries []struct{ Name, Description string }
		}
		ts.mustCall("GET", "/rootfs", nil, &cat)
		trimmed := slices.Clone(cat.Rootfs)
		for i, n := range trimmed {
			if strings.HasPrefix(n, "debian:") {
				trimmed[i] = "debian:"
			}
		}
		if !slices.Equal(trimmed, c.want) || !strings.HasPrefix(cat.Default, c.def) || !slices.Contains(cat.Rootfs, cat.Default) || len(cat.Entries) != len(cat.Rootfs) {
			t.Errorf("%+v: GET /rootfs %+v, want %v, default %s…", c.opts, cat, c.want, c.def)
		}
		debian := cat.Rootfs[0]
		for _, name := range []string{"", "devbox:1", "nodeops/sandbox:debian", debian} {
			var sb sandboxData
			ts.mustCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": name}, &sb)
			want := debian
			if name == "" {
				want = cat.Default
			}
			if sb.Rootfs != want {
				t.Errorf("rootfs %q: the sandbox runs on %q, want %q", name, sb.Rootfs, want)
			}
			if want == debian {
				if got := ts.exec(sb.ID, `. /etc/os-release; echo "$ID $VERSION_CODENAME"; python3 -c 'print(6*7)'`).Stdout; got != "debian "+strings.TrimPrefix(debian, "debian:")+"\n42\n" {
					t.Errorf("rootfs %q: %q", name, got)
				}
			}
		}
		bad := []string{"ubuntu:24.04", "devbox:2", "debian:sid", "..", "a,b"}
		if !c.opts.HostImage {
			bad = append(bad, "host")
		}
		for _, name := range bad {
			if status := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "rootfs": name}, nil); status != http.StatusBadRequest {
				t.Errorf("%+v: rootfs %q: HTTP %d, want 400", c.opts, name, status)
			}
		}
	}
}

// The vendor's desktop examples create on rootfs "desktop:1" with the
// desktop API to follow, which this server declines: the create says so,
// 400 UNSUPPORTED naming that API (before: 400 INVALID_REQUEST "unknown
// rootfs"), and makes no sandbox.
func TestDesktopImageIsDeclinedAsTheDesktopAPI(t *testing.T) {
	ts := startServer(t, Options{})
	status, body := ts.rawCall("POST", "/sandboxes", map[string]any{"shape": "s-2vcpu-4gb", "rootfs": "desktop:1", "ingress_enabled": true})
	if status != http.StatusBadRequest || !strings.Contains(body, `"code":"UNSUPPORTED"`) || !strings.Contains(body, `rootfs \"desktop:1\"`) || !strings.Contains(body, "the desktop (computer-use) API") {
		t.Errorf("create on desktop:1: %d %s, want 400 UNSUPPORTED naming the rootfs and the desktop API", status, body)
	}
	if entries, _ := os.ReadDir(filepath.Join(ts.root, leasesDir)); len(entries) > 0 {
		t.Errorf("%d lease directories after a declined create", len(entries))
	}
}
