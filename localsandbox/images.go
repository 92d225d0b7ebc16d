package localsandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/image"
)

// The images a lease may run on, and how a create's rootfs names one
// (docs/CREATEOS-API.md §3.1 GET /v1/rootfs, §3.2 the create's rootfs).
//
// A lease is a small machine with an image of its own, never a view of the
// host's files. The images:
//
//   - the default, "debian:<suite>": a Debian system of the release the
//     host runs, built once by mmdebstrap into Options.ImageCache (package
//     image); New builds it when it is missing. The names the vendor's
//     programs use for it (debianAliases: "devbox:1" of the catalog
//     example, docs/CREATEOS-API.md §3.1, and "nodeops/sandbox:debian", the
//     base of its template examples) resolve to it, as an empty rootfs does.
//   - "host", only when the operator names it (Options.HostImage): the
//     host's ReadOnlyPaths, with every file and directory that is not
//     world-readable on the host masked in the lease (hostMasks): the
//     lease sees an empty file or directory of its own there.
//   - each directory of Options.RootfsDir, by its name.
//   - each ready template (templates.go), by its name or id: an image and
//     the read-only build layers above it.
//
// A process-group server runs commands on the host itself: its only image
// is "host", and a create naming another is refused.

// Names of images.
const (
	hostImage = "host"
)

// debianAliases are the vendor's names of its Debian image, which resolve
// to the default Debian image here.
var debianAliases = []string{"devbox:1", "nodeops/sandbox:debian"}

// images is the catalog of a server.
type images struct {
	// debian is the default image's name, debian:<suite>, and debianDir
	// its directory ("" when it is not built: a server whose default is
	// the host image and that found none in the cache).
	debian, debianDir string
	// def is the name of the default image.
	def string
	// host says the host image is offered.
	host bool
	// templates are the images Dockerfiles built (templates.go).
	templates *templateStore
}

// setUpImages settles the catalog, building the default image if it is
// missing (namespace isolation only: a process-group server has no image).
func (s *Server) setUpImages(ctx context.Context) error {
	if s.opts.Isolation == IsolationProcessGroup {
		return nil
	}
	r, err := image.DefaultRecipe()
	if err != nil {
		return fmt.Errorf("localsandbox: the default image: %w", err)
	}
	im := &images{debian: "debian:" + r.Suite, host: s.opts.HostImage}
	cache := image.Cache{Dir: s.opts.ImageCache, Progress: s.opts.ImageBuildOutput}
	if s.opts.DefaultImage == hostImage {
		if !s.opts.HostImage {
			return errors.New("localsandbox: DefaultImage host needs HostImage")
		}
		im.def = hostImage
		if dir, ok := cache.Lookup(r); ok {
			im.debianDir = dir
		}
	} else {
		im.def = im.debian
		if s.opts.DefaultImage != "" && s.opts.DefaultImage != im.debian && !slices.Contains(debianAliases, s.opts.DefaultImage) {
			return fmt.Errorf("localsandbox: DefaultImage %q is not an image of this server (%s or %s)", s.opts.DefaultImage, im.debian, hostImage)
		}
		if _, ok := cache.Lookup(r); !ok {
			s.log.Info("building the default image once; mmdebstrap's progress follows on the image build output", "image", im.debian, "cache", cache.Dir)
		}
		if im.debianDir, err = cache.Ensure(ctx, r); err != nil {
			return fmt.Errorf("localsandbox: the default image %s: %w", im.debian, err)
		}
	}
	if im.templates, err = s.loadTemplates(); err != nil {
		return err
	}
	s.images = im
	s.log.Info("sandboxes run on images of their own", "default", im.def, "debian", im.debianDir, "host_image", im.host)
	return nil
}

// imageEntry is an image of GET /v1/rootfs.
type imageEntry struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// catalog lists the images a create may name, the default first.
func (s *Server) catalog() (names []string, def string, entries []imageEntry) {
	if s.images == nil || s.isolation != IsolationNamespaces {
		return []string{hostImage}, hostImage, []imageEntry{{hostImage, "process-group isolation: commands run on the host itself"}}
	}
	im := s.images
	add := func(name, desc string) {
		names = append(names, name)
		entries = append(entries, imageEntry{name, desc})
	}
	if im.debianDir != "" {
		add(im.debian, "Debian "+strings.TrimPrefix(im.debian, "debian:")+" from Debian's packages (minbase, python3, ca-certificates, procps, iproute2), read-only below the sandbox's own writable layer")
		for _, alias := range debianAliases {
			add(alias, "the image "+im.debian)
		}
	}
	if im.host {
		add(hostImage, "the host's system directories, read-only, what is not world-readable on the host hidden")
	}
	if s.opts.RootfsDir != "" {
		dir, _ := os.ReadDir(s.opts.RootfsDir)
		for _, e := range dir {
			if e.IsDir() && validRootfsName(e.Name()) {
				add(e.Name(), "")
			}
		}
	}
	for _, t := range im.templates.list() {
		if meta := t.state(); meta.Status == templateReady {
			add(meta.Name, "template "+meta.ID+", built from "+meta.Base)
		}
	}
	return names, im.def, entries
}

// resolveImage is the image a create's rootfs names, by its canonical name;
// an unknown one is a 400 (docs/CREATEOS-API.md §3.2).
func (s *Server) resolveImage(name string) (string, error) {
	if s.images == nil || s.isolation != IsolationNamespaces {
		if name == "" || name == hostImage {
			return hostImage, nil
		}
		if err := desktopImage(name); err != nil {
			return "", err
		}
		return "", badRequest("unknown rootfs %q: a process-group server runs commands on the host and has no images (GET /v1/rootfs lists them)", name)
	}
	im := s.images
	switch {
	case name == "":
		return im.def, nil
	case (name == im.debian || slices.Contains(debianAliases, name)) && im.debianDir != "":
		return im.debian, nil
	case name == hostImage && im.host:
		return hostImage, nil
	case s.opts.RootfsDir != "" && validRootfsName(name):
		if fi, err := os.Stat(filepath.Join(s.opts.RootfsDir, name)); err == nil && fi.IsDir() {
			return name, nil
		}
	}
	if err := desktopImage(name); err != nil {
		return "", err
	}
	return im.templates.resolve(name)
}

// desktopImage is the 400 UNSUPPORTED of a create on the service's
// desktop images ("desktop:1", the vendor's desktop examples' rootfs), no
// images of this server (a template's name has no ':'): the flow they
// begin is the desktop API, which this server declines, and the answer
// says so rather than "unknown rootfs"; nil for any other name.
func desktopImage(name string) error {
	if !strings.HasPrefix(name, "desktop:") {
		return nil
	}
	return unsupported(fmt.Sprintf("rootfs %q", clip(name, maxEcho)), "desktop images, for "+declinedDesktop)
}

// resolve is the template a create's rootfs names by id or name: its id
// once it is ready; a deleted one is a 404 (docs/CREATEOS-API.md §3.2),
// one not ready (building, failed) a 409.
func (st *templateStore) resolve(name string) (string, error) {
	if t, ok := st.lookup(name); ok {
		meta := t.state()
		if meta.Status != templateReady {
			return "", conflict(fmt.Sprintf("template %s is %s, not ready", meta.ID, meta.Status))
		}
		return meta.ID, nil
	}
	st.mu.Lock()
	deleted := st.deleted[name]
	st.mu.Unlock()
	if deleted {
		return "", notFound("template")
	}
	return "", badRequest("unknown rootfs %q (GET /v1/rootfs lists them)", name)
}

// validRootfsName reports whether name can be a directory of
// Options.RootfsDir that a lease may use.
func validRootfsName(name string) bool {
	return name != "" && name != "." && name != ".." && name != hostImage && !strings.ContainsAny(name, "/\\,:\x00")
}

// imageLayers are the directories of the image name: the image's, "" for
// the host image, and for a template the build layers above it, bottom
// first.
func (s *Server) imageLayers(name string) (dir string, above []string) {
	if image, layers, ok := s.images.templates.layers(name); ok {
		dir, _ = s.imageLayers(image)
		return dir, layers
	}
	switch {
	case name == hostImage:
		return "", nil
	case name == "" || name == s.images.debian:
		if name == "" && s.images.def == hostImage {
			return "", nil
		}
		return s.images.debianDir, nil
	default:
		return filepath.Join(s.opts.RootfsDir, name), nil
	}
}

// hostMasks are the paths below dirs that are not world-readable on the
// host, which a lease on the host image must not read: a file or other
// non-directory without read permission for others, a directory without
// read and search permission for others (whose whole tree is masked then).
// Symlinks reveal only their target and are left alone; whatever the
// server itself cannot read is masked. It walks the directories at every
// create, so that a file made secret since is masked too.
func hostMasks(dirs []string) ([]string, error) {
	var masks []string
	for _, top := range dirs {
		fi, err := os.Lstat(top)
		if errors.Is(err, os.ErrNotExist) || err == nil && !fi.IsDir() {
			continue // missing, or a symlink recreated as such
		}
		if err != nil {
			return nil, err
		}
		err = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil // gone since it was listed
				}
				masks = append(masks, p)
				if d != nil && d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			if d.Type()&fs.ModeSymlink != 0 {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				masks = append(masks, p)
				return nil
			}
			perm := info.Mode().Perm()
			if d.IsDir() {
				if perm&0o005 != 0o005 {
					masks = append(masks, p)
					return fs.SkipDir
				}
				return nil
			}
			if perm&0o004 == 0 {
				masks = append(masks, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return masks, nil
}
