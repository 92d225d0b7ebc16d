package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CacheEnv overrides DefaultCacheDir.
const CacheEnv = "SANDBOXFLOW_IMAGE_CACHE"

// DefaultCacheDir is where images are kept: $SANDBOXFLOW_IMAGE_CACHE, else
// /var/cache/sandboxflow/images — outside any checkout, shared by every
// server and test of the machine.
func DefaultCacheDir() string {
	if d := os.Getenv(CacheEnv); d != "" {
		return d
	}
	return "/var/cache/sandboxflow/images"
}

// Recipe is everything that decides an image's content but the mirror.
// Its hash names the image in the cache.
type Recipe struct {
	// Suite is the Debian release, e.g. "bookworm".
	Suite string `json:"suite"`
	// Variant is mmdebstrap's --variant.
	Variant string `json:"variant"`
	// Include are the packages beyond the variant's, sorted.
	Include []string `json:"include"`
	// DpkgOpts are mmdebstrap --dpkgopt values (what is left out).
	DpkgOpts []string `json:"dpkg_opts"`
	// SourceDateEpoch is SOURCE_DATE_EPOCH for the build: file times and
	// generated files do not depend on when it ran.
	SourceDateEpoch int64 `json:"source_date_epoch"`
}

// DefaultPackages are what a lease has beyond Debian's minbase variant
// (which brings bash, coreutils, dash, findutils, grep, sed, gzip, tar,
// util-linux, passwd for useradd, login for su, apt and dpkg): what the
// README promises a lease and the tests run in one — python3, TLS roots,
// ps and friends, ip.
var DefaultPackages = []string{"ca-certificates", "iproute2", "procps", "python3"}

// defaultEpoch is the SOURCE_DATE_EPOCH of the default recipe
// (2026-12-05T00:00:00Z). Changing it builds a new image.
const defaultEpoch = 1796428800

// DefaultRecipe is the recipe of the default image: minbase plus
// DefaultPackages of the Debian release the host runs, without manuals,
// translations or documentation but the copyright files.
func DefaultRecipe() (Recipe, error) {
	suite, err := hostSuite()
	if err != nil {
		return Recipe{}, &Error{Step: StepRecipe, Err: err}
	}
	return Recipe{
		Suite:   suite,
		Variant: "minbase",
		Include: DefaultPackages,
		DpkgOpts: []string{
			"path-exclude=/usr/share/man/*",
			"path-exclude=/usr/share/locale/*",
			"path-exclude=/usr/share/doc/*",
			"path-include=/usr/share/doc/*/copyright",
		},
		SourceDateEpoch: defaultEpoch,
	}, nil
}

// hostSuite is VERSION_CODENAME of /etc/os-release.
func hostSuite() (string, error) {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "", fmt.Errorf("the host's release: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok {
			v = strings.Trim(v, `"'`)
			if v != "" && !strings.ContainsAny(v, "/ \t") {
				return v, nil
			}
		}
	}
	return "", errors.New("the host's /etc/os-release names no VERSION_CODENAME (the default image is built from the Debian release the host runs)")
}

// Name is the image's directory name in the cache: <suite>-<hash of the
// recipe>.
func (r Recipe) Name() string {
	canon := r
	canon.Include = append([]string(nil), r.Include...)
	slices.Sort(canon.Include)
	data, _ := json.Marshal(canon)
	sum := sha256.Sum256(data)
	return r.Suite + "-" + hex.EncodeToString(sum[:8])
}

// args are mmdebstrap's arguments building r into dir, the mirror read
// from standard input.
func (r Recipe) args(dir string) []string {
	args := []string{"--variant=" + r.Variant, "--format=directory"}
	if os.Geteuid() == 0 {
		args = append(args, "--mode=root")
	} else {
		args = append(args, "--mode=unshare")
	}
	if len(r.Include) > 0 {
		inc := append([]string(nil), r.Include...)
		slices.Sort(inc)
		args = append(args, "--include="+strings.Join(inc, ","))
	}
	for _, o := range r.DpkgOpts {
		args = append(args, "--dpkgopt="+o)
	}
	return append(args, r.Suite, dir, "-")
}

// Step names what failed.
type Step string

const (
	StepRecipe  Step = "recipe"  // the host's release could not be read
	StepCache   Step = "cache"   // the cache directory or its lock
	StepSources Step = "sources" // the host's apt sources
	StepBuild   Step = "build"   // mmdebstrap missing or failed
	StepInstall Step = "install" // renaming the built image into place
)

// Error is why an image could not be had.
type Error struct {
	Step  Step
	Image string // the image's name, when known
	Err   error
}

func (e *Error) Error() string {
	if e.Image != "" {
		return fmt.Sprintf("image %s: %s: %v", e.Image, e.Step, e.Err)
	}
	return fmt.Sprintf("image: %s: %v", e.Step, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Cache is a directory of built images.
type Cache struct {
	// Dir holds the images, <Dir>/<recipe name>.
	Dir string
	// Progress receives mmdebstrap's output while an image is built, each
	// line prefixed "image: "; nil discards it.
	Progress io.Writer
}

// Path is where the image of r is (or will be) kept.
func (c Cache) Path(r Recipe) string { return filepath.Join(c.Dir, r.Name()) }

// Lookup returns the image of r if it is built.
func (c Cache) Lookup(r Recipe) (string, bool) {
	p := c.Path(r)
	fi, err := os.Stat(p)
	return p, err == nil && fi.IsDir()
}

// Ensure returns the directory of the image of r, building it first if it
// is not in the cache.
func (c Cache) Ensure(ctx context.Context, r Recipe) (string, error) {
	name := r.Name()
	if p, ok := c.Lookup(r); ok {
		return p, nil
	}
	fail := func(step Step, err error) (string, error) {
		return "", &Error{Step: step, Image: name, Err: err}
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return fail(StepCache, err)
	}
	lock, err := lockFile(ctx, filepath.Join(c.Dir, "."+name+".lock"))
	if err != nil {
		return fail(StepCache, err)
	}
	defer lock.Close() // and with it the lock
	// Whoever held the lock may have built it.
	if p, ok := c.Lookup(r); ok {
		return p, nil
	}
	// What a builder that died left.
	if stale, _ := filepath.Glob(filepath.Join(c.Dir, ".build-"+name+"-*")); len(stale) > 0 {
		for _, d := range stale {
			if err := removeBuild(d); err != nil {
				return fail(StepCache, err)
			}
		}
	}
	sources, err := hostSources()
	if err != nil {
		return fail(StepSources, err)
	}
	tmp, err := os.MkdirTemp(c.Dir, ".build-"+name+"-")
	if err != nil {
		return fail(StepCache, err)
	}
	defer removeBuild(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // apt's downloads run as _apt
		return fail(StepCache, err)
	}
	target := filepath.Join(tmp, "root")
	if err := c.build(ctx, r, target, sources); err != nil {
		return fail(StepBuild, err)
	}
	if err := os.Chmod(target, 0o755); err != nil {
		return fail(StepInstall, err)
	}
	final := c.Path(r)
	if err := os.Rename(target, final); err != nil {
		return fail(StepInstall, err)
	}
	return final, nil
}

// build runs mmdebstrap.
func (c Cache) build(ctx context.Context, r Recipe, target string, sources []byte) error {
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return errors.New("mmdebstrap is not installed (apt-get install mmdebstrap)")
	}
	progress := c.Progress
	if progress == nil {
		progress = io.Discard
	}
	out := &prefixWriter{w: progress, prefix: "image: "}
	defer out.Flush()
	fmt.Fprintf(out, "building %s (Debian %s, %s + %s) once, into %s\n", r.Name(), r.Suite, r.Variant, strings.Join(r.Include, " "), c.Dir)
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, r.args(target)...)
	// Stopped, mmdebstrap unmounts what it mounted in the target (/proc,
	// /sys, /dev); killed, it would leave them (removeBuild copes).
	cmd.Cancel = func() error { return cmd.Process.Signal(unix.SIGTERM) }
	cmd.WaitDelay = time.Minute
	cmd.Stdin = bytes.NewReader(sources)
	cmd.Stdout, cmd.Stderr = out, out
	// The system's own tools only: a python3 of the caller's PATH (pyenv
	// and the like) would make the build slower and its result depend on
	// the caller.
	cmd.Env = append(os.Environ(), "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"SOURCE_DATE_EPOCH="+strconv.FormatInt(r.SourceDateEpoch, 10), "LC_ALL=C.UTF-8")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mmdebstrap: %w (its output is above, prefixed %q)", err, "image: ")
	}
	fmt.Fprintf(out, "built %s in %s\n", r.Name(), time.Since(start).Round(time.Second))
	return nil
}

// removeBuild removes a build directory. A build that was killed may have
// left the host's /proc, /sys or /dev mounted inside it (mmdebstrap's root
// mode mounts them in the target): those are detached first, and a
// directory with anything still mounted below it is never removed — a
// recursive removal would reach into the host's /dev/shm.
func removeBuild(dir string) error {
	mounted := func() []string {
		data, _ := os.ReadFile("/proc/self/mountinfo")
		var below []string
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasPrefix(unescapeMountPath(f[4]), dir+"/") {
				below = append(below, unescapeMountPath(f[4]))
			}
		}
		// Deepest first.
		slices.SortFunc(below, func(a, b string) int { return len(b) - len(a) })
		return below
	}
	for _, mp := range mounted() {
		unix.Unmount(mp, unix.MNT_DETACH)
	}
	if left := mounted(); len(left) > 0 {
		return fmt.Errorf("%s is not removed: %d file systems are still mounted below it (%s)", dir, len(left), left[0])
	}
	return os.RemoveAll(dir)
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(p string) string {
	if !strings.Contains(p, "\\") {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' && i+3 < len(p) {
			if n, err := strconv.ParseUint(p[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// hostSources are the host's apt sources, one-line and deb822 files alike,
// as mmdebstrap reads them on its standard input: the image comes from the
// mirror the host uses, which no file of the project names.
func hostSources() ([]byte, error) {
	var buf bytes.Buffer
	files := []string{"/etc/apt/sources.list"}
	for _, pat := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		buf.Write(data)
		buf.WriteString("\n\n")
	}
	if strings.TrimSpace(buf.String()) == "" {
		return nil, errors.New("the host has no apt sources (/etc/apt/sources.list, sources.list.d)")
	}
	return buf.Bytes(), nil
}

// lockFile opens file and takes an exclusive lock on it, giving up when
// ctx ends; closing the file releases it.
func lockFile(ctx context.Context, file string) (*os.File, error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	// flock blocks for as long as another builder builds; the goroutine
	// owns f until the lock is handed over, and closes it if nobody waits
	// for it any more.
	got := make(chan error, 1)
	taken := make(chan bool)
	go func() {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		got <- err
		if err != nil || !<-taken {
			f.Close()
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			return nil, err
		}
		taken <- true
		return f, nil
	case <-ctx.Done():
		go func() {
			if <-got == nil {
				taken <- false
			}
		}()
		return nil, fmt.Errorf("waiting for another build of the image: %w", ctx.Err())
	}
}

// prefixWriter writes each line to w behind prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.w.Write(append([]byte(p.prefix), p.buf[:i+1]...))
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

// Flush writes a last unterminated line.
func (p *prefixWriter) Flush() {
	if len(p.buf) > 0 {
		p.w.Write(append(append([]byte(p.prefix), p.buf...), '\n'))
		p.buf = nil
	}
}
