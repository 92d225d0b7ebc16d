package localsandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/hostfs"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/journal"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/template"
	"golang.org/x/sys/unix"
)

// Templates: images a Dockerfile builds (docs/CREATEOS-API.md §3.11; the
// API is api_templates.go).
//
// A template is its base image plus read-only build layers: a create whose
// rootfs names the template (by id or name) mounts the image, the build
// layers of the templates it was built from and its own, as lower layers of
// the lease's overlay — nothing is copied — and starts with the template's
// Config (the final ENV and WORKDIR of its Dockerfile over its base's, kept
// in meta.json; lease.env, lease.resolveCwd). The build of a template runs
// each step of its Dockerfile (package template) in a build lease started
// from its FROM, with the operator's egress cap like any lease; the lease
// is then frozen and what it wrote over its image, its root's upper layer,
// is copied (machine.CopyRootLayer: cp -a, never following what the build
// planted) into the template's directory, its owners moved from the build
// lease's id range to the image's, and the lease destroyed. A layer
// cannot be renamed out of the lease: it lives on the lease's own disk.
//
// A template is a directory of <Root>/templates: <id>/{meta.json,
// dockerfile, log.ndjson, layer/}. Templates are the server's, as its leases are,
// not the machine's as the recipe-built images of the image cache are:
// another server does not see them. A restarted server loads them; a build
// that a restart interrupted is failed. A deleted template leaves the
// catalog at once (later creates naming it answer 404); its directory is
// renamed to .deleted-<id> and removed once no live lease runs on it (at
// the next template request or server start), since the overlays of
// running leases still read its layer.

// Template states.
const (
	templatePending  = "pending"
	templateBuilding = "building"
	templateReady    = "ready"
	templateFailed   = "failed"
)

const (
	templatesDir = "templates"  // in Options.Root
	layerDir     = "layer"      // a template's build layer, in its directory
	workspaceDir = "workspace"  // a snapshot's /workspace, in its directory
	logFile      = "log.ndjson" // its build's log, the events of the follow stream
	deletedDir   = ".deleted-"  // prefix of a deleted template's directory
	// templateBuildTimeout bounds one build.
	templateBuildTimeout = 30 * time.Minute
	// maxTemplateBuilds is how many builds run at once; the others stay
	// pending until one ends. Each holds a build lease, outside
	// Options.MaxLeases.
	maxTemplateBuilds = 2
	// maxTemplateLogLine is the longest line of a build's log: longer
	// output is cut into lines of that length.
	maxTemplateLogLine = 16 << 10
	// maxTemplateDepth bounds the build layers of a lease's root (one per
	// template of a chain of FROMs), well below the overlay's limit of
	// lower layers and the page of its mount options.
	maxTemplateDepth = 16
	// maxTemplateOutputBytes is the most of its steps' output a build's
	// log keeps; the rest is dropped, and the log says so.
	maxTemplateOutputBytes = 4 << 20
)

// tmpl is one template.
type tmpl struct {
	meta templateMeta // guarded by mu, but for the fixed fields
	dir  string       // <Root>/templates/<id>
	// dockerfile is the Dockerfile as posted.
	dockerfile string

	mu      sync.Mutex
	log     []logEvent
	changed chan struct{} // closed and replaced at each log line and state change
	// outputBytes counts the steps' output in the log, at most
	// maxTemplateOutputBytes.
	outputBytes int
}

// templateMeta is what meta.json keeps of a template.
type templateMeta struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Base      string    `json:"base"` // what the build started from, as named
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
	BuiltAt   time.Time `json:"built_at,omitzero"`
	SizeBytes int64     `json:"size_bytes"`
	// Image is the canonical name of the image at the bottom; Chain the
	// ids of the templates whose build layers lie above it, bottom first,
	// the template's own last (ready templates only).
	Image string   `json:"image,omitempty"`
	Chain []string `json:"chain,omitempty"`
	// FromSandbox is the sandbox a snapshot copied ([ext]); such a
	// template keeps that sandbox's /workspace too (workspaceDir).
	FromSandbox string `json:"from_sandbox,omitempty"`
	// Config is what the leases started from the template, and the
	// templates built FROM it, start with [ext]: the final ENV and
	// WORKDIR of its Dockerfile over its base's, or a snapshot's
	// sandbox's own (ready templates only).
	Config template.Config `json:"config,omitzero"`
}

// logEvent is a line of a build's log, as the follow stream sends it.
type logEvent struct {
	TS    time.Time `json:"ts,omitzero"`
	Level string    `json:"level,omitempty"`
	Line  string    `json:"line"`
}

// templateStore is the server's templates.
type templateStore struct {
	dir string // <Root>/templates

	mu   sync.Mutex
	byID map[string]*tmpl
	// deleted are the ids and names of the templates deleted since the
	// server started: a create naming one is a 404.
	deleted map[string]bool
	// retired are deleted templates whose directories are kept for the
	// leases still running on them: id → their metadata.
	retired map[string]templateMeta
	// bases counts the running builds on each template id.
	bases map[string]int
	// slots holds a token for each running build (maxTemplateBuilds).
	slots chan struct{}
}

// loadTemplates opens <Root>/templates, loading the templates a previous
// server left and failing its interrupted builds.
func (s *Server) loadTemplates() (*templateStore, error) {
	root, err := hostfs.Open(s.opts.Root)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if _, err := root.Mkdir(templatesDir, 0o700, nil); err != nil {
		return nil, fmt.Errorf("localsandbox: templates: %w", err)
	}
	st := &templateStore{dir: filepath.Join(s.opts.Root, templatesDir), byID: map[string]*tmpl{},
		deleted: map[string]bool{}, retired: map[string]templateMeta{}, bases: map[string]int{},
		slots: make(chan struct{}, maxTemplateBuilds)}
	entries, err := os.ReadDir(st.dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		dir := filepath.Join(st.dir, e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			// A deleted template: no lease runs on it any more.
			if err := hostfs.RemoveAll(dir); err != nil {
				return nil, err
			}
			continue
		}
		t, err := loadTemplate(dir)
		if err != nil {
			s.log.Warn("a template could not be loaded; it is left as it is", "dir", dir, "err", err)
			continue
		}
		if t.meta.Status == templatePending || t.meta.Status == templateBuilding {
			t.logf("error", "the build was interrupted by a restart of the server")
			t.meta.Status = templateFailed
			for _, kept := range []string{layerDir, workspaceDir} {
				if err := hostfs.RemoveAll(filepath.Join(dir, kept)); err != nil {
					return nil, err
				}
			}
			if err := t.save(); err != nil {
				return nil, err
			}
		}
		st.byID[t.meta.ID] = t
	}
	return st, nil
}

// loadTemplate reads a template's directory.
func loadTemplate(dir string) (*tmpl, error) {
	t := &tmpl{dir: dir, changed: make(chan struct{})}
	data, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &t.meta); err != nil {
		return nil, err
	}
	if t.meta.ID != filepath.Base(dir) {
		return nil, fmt.Errorf("meta.json names template %q", t.meta.ID)
	}
	df, err := os.ReadFile(filepath.Join(dir, "dockerfile"))
	if err != nil {
		return nil, err
	}
	t.dockerfile = string(df)
	logData, _ := os.ReadFile(filepath.Join(dir, logFile))
	sc := bufio.NewScanner(bytes.NewReader(logData))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e logEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			t.log = append(t.log, e)
		}
	}
	return t, nil
}

// save writes the template's meta.json and log.
func (t *tmpl) save() error {
	t.mu.Lock()
	meta, _ := json.Marshal(t.meta)
	var logData bytes.Buffer
	enc := json.NewEncoder(&logData)
	for _, e := range t.log {
		enc.Encode(e)
	}
	t.mu.Unlock()
	dir, err := hostfs.Open(t.dir)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := dir.WriteFile(logFile, logData.Bytes(), 0o600, nil); err != nil {
		return err
	}
	return dir.WriteFile("meta.json", meta, 0o600, nil)
}

// logf appends a line to the build's log.
func (t *tmpl) logf(level, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = append(t.log, logEvent{TS: time.Now().UTC(), Level: level, Line: fmt.Sprintf(format, args...)})
	t.changedLocked()
}

// output appends a line of a step's output to the log, unless the log
// holds maxTemplateOutputBytes of output already.
func (t *tmpl) output(line []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.outputBytes > maxTemplateOutputBytes:
		return
	case t.outputBytes+len(line) > maxTemplateOutputBytes:
		t.outputBytes = maxTemplateOutputBytes + 1
		line = fmt.Appendf(nil, "(the rest of the build's output is not kept: the log keeps %d MiB of it)", maxTemplateOutputBytes>>20)
	default:
		t.outputBytes += len(line)
	}
	t.log = append(t.log, logEvent{TS: time.Now().UTC(), Level: "info", Line: string(line)})
	t.changedLocked()
}

func (t *tmpl) changedLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// setStatus moves the template to status and saves it.
func (t *tmpl) setStatus(status string) error {
	t.mu.Lock()
	t.meta.Status = status
	t.changedLocked()
	t.mu.Unlock()
	return t.save()
}

// snapshot returns the template's metadata, and its log from line from on,
// and what is closed at its next change.
func (t *tmpl) snapshot(from int) (templateMeta, []logEvent, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []logEvent
	if from < len(t.log) {
		lines = slices.Clone(t.log[from:])
	}
	return t.meta, lines, t.changed
}

// state returns the template's metadata.
func (t *tmpl) state() templateMeta {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta
}

// lookup finds a live template by id or name.
func (st *templateStore) lookup(idOrName string) (*tmpl, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if t, ok := st.byID[idOrName]; ok {
		return t, true
	}
	for _, t := range st.byID {
		if t.meta.Name == idOrName {
			return t, true
		}
	}
	return nil, false
}

// list returns the live templates, oldest first.
func (st *templateStore) list() []*tmpl {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]*tmpl, 0, len(st.byID))
	for _, t := range st.byID {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *tmpl) int {
		if c := a.meta.CreatedAt.Compare(b.meta.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.meta.ID, b.meta.ID)
	})
	return out
}

// ready returns the metadata of the ready template id, live or retired.
func (st *templateStore) ready(id string) (templateMeta, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.readyLocked(id)
}

func (st *templateStore) readyLocked(id string) (templateMeta, bool) {
	if t, live := st.byID[id]; live {
		meta := t.state()
		return meta, meta.Status == templateReady
	}
	meta, ok := st.retired[id]
	return meta, ok
}

// config is what a lease on rootfs starts with: the Config of the ready
// template rootfs (live or retired), or none for an image.
func (st *templateStore) config(rootfs string) template.Config {
	st.mu.Lock()
	defer st.mu.Unlock()
	meta, _ := st.readyLocked(rootfs)
	return meta.Config
}

// layers are the host directories of the build layers of the ready
// template id (live or retired), bottom first, and its image.
func (st *templateStore) layers(id string) (image string, dirs []string, ok bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	meta, ok := st.readyLocked(id)
	if !ok {
		return "", nil, false
	}
	for _, cid := range meta.Chain {
		dirs = append(dirs, filepath.Join(st.dirLocked(cid), layerDir))
	}
	return meta.Image, dirs, true
}

// dirLocked is the directory of template id: its own while it is live,
// its renamed one once it was deleted (retired).
func (st *templateStore) dirLocked(id string) string {
	if _, live := st.byID[id]; live {
		return filepath.Join(st.dir, id)
	}
	return filepath.Join(st.dir, deletedDir+id)
}

// newTemplate registers a pending template and makes its directory.
func (s *Server) newTemplate(name, base, dockerfile string) (*tmpl, error) {
	st := s.images.templates
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, t := range st.byID {
		if t.meta.Name == name {
			return nil, withCode("NAME_TAKEN", conflict("a template already has this name"))
		}
	}
	id := newID("tpl-")
	dir, err := hostfs.Open(st.dir)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	if _, err := dir.Mkdir(id, 0o700, nil); err != nil {
		return nil, err
	}
	t := &tmpl{dir: filepath.Join(st.dir, id), dockerfile: dockerfile, changed: make(chan struct{}),
		meta: templateMeta{ID: id, Name: name, Base: base, Status: templatePending, CreatedAt: time.Now().UTC()}}
	if err := dir.WriteFile(id+"/dockerfile", []byte(dockerfile), 0o600, nil); err == nil {
		err = t.save()
	}
	if err != nil {
		hostfs.RemoveAll(t.dir)
		return nil, err
	}
	delete(st.deleted, id)
	delete(st.deleted, name)
	st.byID[id] = t
	return t, nil
}

// deleteTemplate takes t out of the catalog and removes its directory, or
// keeps it, renamed, while leases run on it.
func (s *Server) deleteTemplate(t *tmpl) error {
	st := s.images.templates
	st.mu.Lock()
	defer st.mu.Unlock()
	meta := t.state()
	if meta.Status == templatePending || meta.Status == templateBuilding {
		return conflict("the template is being built; delete it once its build has ended")
	}
	for _, other := range st.byID {
		if om := other.state(); other != t && slices.Contains(om.Chain, meta.ID) {
			return conflict(fmt.Sprintf("template %s is built on this template; delete it first", other.meta.ID))
		}
	}
	// Renaming a directory the server made in its own templates directory:
	// nothing of a lease is walked or followed.
	root, err := hostfs.Open(st.dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := unix.Renameat(root.FD(), meta.ID, root.FD(), deletedDir+meta.ID); err != nil {
		return fmt.Errorf("retiring template %s: %w", meta.ID, err)
	}
	delete(st.byID, meta.ID)
	st.deleted[meta.ID], st.deleted[meta.Name] = true, true
	st.retired[meta.ID] = meta
	s.log.Info("template deleted", "template", meta.ID, "name", meta.Name)
	return nil
}

// reapTemplates removes the directories of deleted templates on which no
// lease runs any more, nor a build, nor a template a lease runs on is
// built. It waits for a quiet moment: while a create is in flight, the
// template it resolved may be one just deleted.
func (s *Server) reapTemplates() {
	st := s.images.templates
	s.mu.Lock()
	if s.creating > 0 {
		s.mu.Unlock()
		return
	}
	var rootfs []string
	for _, l := range s.leases {
		rootfs = append(rootfs, l.rootfs)
	}
	s.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, n := range st.bases {
		if n > 0 {
			rootfs = append(rootfs, id)
		}
	}
	inUse := map[string]bool{}
	for _, id := range rootfs {
		if meta, ok := st.readyLocked(id); ok {
			for _, layer := range meta.Chain {
				inUse[layer] = true
			}
		}
	}
	for id := range st.retired {
		if inUse[id] {
			continue
		}
		if err := hostfs.RemoveAll(filepath.Join(st.dir, deletedDir+id)); err != nil {
			s.log.Warn("removing a deleted template failed", "template", id, "err", err)
			continue
		}
		delete(st.retired, id)
	}
}

// buildTemplate builds t, in a worker of the server: a shutdown ends it.
func (s *Server) buildTemplate(t *tmpl) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ctx, cancelTimeout := context.WithTimeoutCause(ctx, templateBuildTimeout, fmt.Errorf("it took longer than %s", templateBuildTimeout))
	defer cancelTimeout()
	go func() {
		select {
		case <-s.done:
			cancel(errors.New("the server shut down"))
		case <-ctx.Done():
		}
	}()
	slots := s.images.templates.slots
	var err error
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
		if err := t.setStatus(templateBuilding); err != nil {
			s.log.Warn("saving a template failed", "template", t.meta.ID, "err", err)
		}
		err = s.runBuild(ctx, t)
	case <-ctx.Done():
		err = ctx.Err()
	}
	status := templateReady
	if err != nil {
		status = templateFailed
		if ctx.Err() != nil {
			err = fmt.Errorf("the build was stopped: %w", context.Cause(ctx))
		}
		t.logf("error", "build failed: %v", err)
		hostfs.RemoveAll(filepath.Join(t.dir, layerDir))
	} else {
		t.mu.Lock()
		t.meta.BuiltAt = time.Now().UTC()
		t.mu.Unlock()
		t.logf("info", "built template %s (%s)", t.meta.ID, t.meta.Name)
	}
	if err := t.setStatus(status); err != nil {
		s.log.Warn("saving a template failed", "template", t.meta.ID, "err", err)
	}
	s.log.Info("template built", "template", t.meta.ID, "status", status)
}

// runBuild runs the Dockerfile of t in a build lease and keeps what it
// wrote as t's layer.
func (s *Server) runBuild(ctx context.Context, t *tmpl) error {
	df, err := template.Parse(t.dockerfile)
	if err != nil {
		return err
	}
	from := df.From
	if from == "" {
		from = t.meta.Base
	}
	rootfs, image, chain, base, err := s.resolveBuildBase(from)
	if err != nil {
		return err
	}
	// Held from here: a template deleted meanwhile keeps its layers for
	// this build (reapTemplates).
	st := s.images.templates
	st.mu.Lock()
	if _, live := st.byID[rootfs]; chain != nil && !live {
		st.mu.Unlock()
		return fmt.Errorf("FROM %s: the template was deleted", clip(from, maxEcho))
	}
	st.bases[rootfs]++
	st.mu.Unlock()
	defer func() {
		st.mu.Lock()
		if st.bases[rootfs]--; st.bases[rootfs] == 0 {
			delete(st.bases, rootfs)
		}
		st.mu.Unlock()
	}()
	sh, _ := lookupShape(defaultShape)
	net, err := s.netSpec(ctx, nil, false) // the operator's egress cap, no more
	if err != nil {
		return err
	}
	spec := leaseSpec{shape: sh, labels: map[string]string{}, rootfs: rootfs, disk: int64(s.opts.DefaultDiskMiB) * mib,
		net: net, name: "template-build-" + t.meta.ID}
	t.logf("info", "FROM %s: starting the build sandbox", from)
	l, err := s.newLease(newID("sb-"), spec)
	if err != nil {
		return fmt.Errorf("starting the build sandbox: %w", err)
	}
	defer func() {
		if err := l.destroy(); err != nil {
			s.log.Warn("destroying a template's build sandbox failed", "template", t.meta.ID, "sandbox", l.id, "err", err)
		}
	}()
	// The build lease has no defaults of its own: each step carries the
	// variables, directory and user of the instructions before it, over
	// the base's Config.
	plan, err := df.Plan(base, l.standardEnv())
	if err != nil {
		return err
	}
	for i, step := range plan.Steps {
		t.logf("info", "Step %d/%d (line %d): %s", i+1, len(plan.Steps), step.Line, step.Text)
		code, err := s.runStep(ctx, t, l, step)
		if err != nil {
			return fmt.Errorf("line %d: %s: %w", step.Line, clip(step.Text, 200), err)
		}
		if code != 0 {
			return fmt.Errorf("line %d: %s: exited with code %d", step.Line, clip(step.Text, 200), code)
		}
	}
	// Frozen, as a fork's source: nothing writes while the layer is copied.
	if _, ok := l.transition([]string{stateRunning}, statePausing); ok {
		l.pause()
	}
	if got := l.status(); got != statePaused {
		return fmt.Errorf("the build sandbox could not be frozen (it is %s)", got)
	}
	size, err := machine.CopyRootLayer(l.dir, filepath.Join(t.dir, layerDir), l.owner(), s.imageOwner())
	if err != nil {
		return fmt.Errorf("keeping the build's layer: %w", err)
	}
	t.mu.Lock()
	t.meta.SizeBytes, t.meta.Image, t.meta.Chain = size, image, append(slices.Clone(chain), t.meta.ID)
	t.meta.Config = plan.Config
	t.mu.Unlock()
	return nil
}

// imageOwner owns the files of the images: host root for a root server,
// whose leases see them through idmapped mounts; else the server's user,
// which is each lease's root.
func (s *Server) imageOwner() machine.Owner {
	if os.Geteuid() == 0 {
		return machine.Owner{}
	}
	return machine.Owner{UID: s.hostUID, GID: s.hostGID}
}

// resolveBuildBase is what a build starts from: an image of the server's
// (not the host image: a template is an image of its own) or a ready
// template; rootfs is the build lease's, image and chain the new
// template's bottom and the layers below its own, base the Config it
// inherits.
func (s *Server) resolveBuildBase(from string) (rootfs, image string, chain []string, base template.Config, err error) {
	if from == hostImage {
		return "", "", nil, base, errors.New("FROM host is not supported: a template builds on an image or another template")
	}
	rootfs, err = s.resolveImage(from)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			err = errors.New(ae.msg)
		}
		return "", "", nil, base, fmt.Errorf("FROM %s: %w", clip(from, maxEcho), err)
	}
	if meta, ok := s.images.templates.ready(rootfs); ok {
		if len(meta.Chain) >= maxTemplateDepth {
			return "", "", nil, base, fmt.Errorf("FROM %s: a template is at most %d templates deep", clip(from, maxEcho), maxTemplateDepth)
		}
		return rootfs, meta.Image, meta.Chain, meta.Config, nil
	}
	if rootfs == hostImage { // the default image is the host's
		return "", "", nil, base, errors.New("FROM: the server's default image is the host image: a template builds on an image or another template")
	}
	return rootfs, rootfs, nil, base, nil
}

// runStep runs one step in the build lease, its output into the log, and
// returns its exit code.
func (s *Server) runStep(ctx context.Context, t *tmpl, l *lease, step template.Step) (int, error) {
	argv := step.Argv
	if step.User != "" {
		// As the user, with its groups, the way su would, without PAM.
		argv = append([]string{"/bin/sh", "-c", `u=$1; shift; exec setpriv --reuid="$u" --regid="$(id -g -- "$u")" --init-groups -- "$@"`, "sh", step.User}, argv...)
	}
	p, err := l.start(argv, step.Dir, step.Env, true, nil)
	var se *startError
	if errors.As(err, &se) {
		return 0, errors.New(se.msg)
	}
	if err != nil {
		return 0, err
	}
	defer p.terminate(0)
	p.closeStdin()
	c, err := p.journal.Attach(0)
	if err != nil {
		return 0, err
	}
	defer p.journal.Detach(c)
	var partial [2][]byte
	flush := func(stream journal.Stream, all bool) {
		for {
			i := bytes.IndexByte(partial[stream], '\n')
			if i < 0 {
				break
			}
			t.output(partial[stream][:i])
			partial[stream] = partial[stream][i+1:]
		}
		if len(partial[stream]) > maxTemplateLogLine || all && len(partial[stream]) > 0 {
			t.output(partial[stream])
			partial[stream] = nil
		}
	}
	entries := make([]journal.Entry, 0, 16)
	for {
		b := p.journal.Take(c, entries, streamBatchBytes)
		switch {
		case b.Err != nil:
			return 0, fmt.Errorf("output was lost: %w", b.Err)
		case b.Exit != nil:
			flush(journal.Stdout, true)
			flush(journal.Stderr, true)
			return exitCode(*b.Exit), nil
		case len(b.Entries) > 0:
			for _, e := range b.Entries {
				partial[e.Stream] = append(partial[e.Stream], e.Data...)
				flush(e.Stream, false)
			}
			clear(b.Entries)
		default:
			select {
			case <-b.Wait:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
	}
}

// Snapshots [ext]: a template made from a live sandbox (POST /v1/templates
// {"name", "from_sandbox"}). The sandbox is frozen, held as a fork's
// source is (it cannot resume nor be destroyed meanwhile), its root's
// upper layer copied as a build's is (machine.CopyRootLayer) and its
// /workspace beside it (machine.CopyWorkspace): a session's work lives in
// /workspace, a mount of its own outside the upper layer, and a template
// of it without its work would be of little use. /tmp is not kept, as a
// machine's image keeps no tmpfs. The sandbox is then thawed if it was
// running; what it writes later is not the template's. The template's base
// is the sandbox's rootfs, its layers that rootfs's and its own; it is
// ready when the answer comes. A lease created from it (or from a
// template built on it) starts with a copy of the kept /workspace
// (seedWorkspace).

// snapshotLease makes the ready template name from the sandbox id.
func (s *Server) snapshotLease(name, id string) (*tmpl, error) {
	s.mu.Lock()
	l := s.leases[id]
	s.mu.Unlock()
	if l == nil {
		return nil, notFound("sandbox")
	}
	if l.isolation != IsolationNamespaces {
		return nil, conflict("a snapshot needs namespace isolation")
	}
	st := s.images.templates
	image, chain := l.rootfs, []string(nil)
	if meta, ok := st.ready(l.rootfs); ok {
		if len(meta.Chain) >= maxTemplateDepth {
			return nil, conflict(fmt.Sprintf("a template is at most %d templates deep", maxTemplateDepth))
		}
		image, chain = meta.Image, meta.Chain
	} else if l.rootfs == hostImage || l.rootfs == "" {
		return nil, conflict("the sandbox runs on the host image: a template is made of an image or another template")
	}
	release, err := l.holdForSnapshot()
	if err != nil {
		return nil, err
	}
	defer release()
	t, err := s.newTemplate(name, l.rootfs, "")
	if err != nil {
		return nil, err
	}
	// Its chain is set at once: from now on, the template it is made on
	// cannot be deleted (deleteTemplate); if it was meanwhile, the
	// snapshot is not made.
	t.mu.Lock()
	t.meta.Image, t.meta.Chain, t.meta.FromSandbox = image, append(slices.Clone(chain), t.meta.ID), l.id
	t.meta.Config = l.defaults // its template's, not its envs: those are the create's, and may be secrets
	t.mu.Unlock()
	st.mu.Lock()
	_, baseLive := st.byID[l.rootfs]
	st.mu.Unlock()
	var size int64
	switch {
	case chain != nil && !baseLive:
		err = conflict("the sandbox's template was deleted; a snapshot of it cannot be kept")
	default:
		size, err = machine.CopyRootLayer(l.dir, filepath.Join(t.dir, layerDir), l.owner(), s.imageOwner())
		if err == nil {
			err = machine.CopyWorkspace(l.dir, filepath.Join(t.dir, workspaceDir), l.owner(), s.imageOwner())
		}
		if err != nil {
			err = fmt.Errorf("snapshot of sandbox %s: %w", l.id, err)
		}
	}
	if err != nil {
		// Nothing of it is kept: the name is free again.
		st.mu.Lock()
		delete(st.byID, t.meta.ID)
		st.mu.Unlock()
		hostfs.RemoveAll(t.dir)
		return nil, err
	}
	t.mu.Lock()
	t.meta.SizeBytes, t.meta.BuiltAt = size, time.Now().UTC()
	t.mu.Unlock()
	t.logf("info", "snapshot of sandbox %s", l.id)
	if err := t.setStatus(templateReady); err != nil {
		return nil, err
	}
	s.log.Info("template made from a sandbox", "template", t.meta.ID, "name", name, "sandbox", l.id)
	return t, nil
}

// holdForSnapshot freezes l if it runs and holds it as a fork's source
// (beginFork); release lets it go, thawing it if it was running.
func (l *lease) holdForSnapshot() (release func(), err error) {
	state, froze := l.transition([]string{stateRunning}, statePausing)
	if froze {
		l.pause()
	} else if state != statePaused {
		return nil, conflict("only a running or paused sandbox can be kept as a template; the sandbox is " + state)
	}
	if err := l.beginFork(); err != nil {
		// The freeze failed, or the sandbox was resumed or destroyed
		// meanwhile.
		return nil, conflict("the sandbox could not be held frozen for the snapshot; it is " + l.status())
	}
	return func() {
		l.endFork()
		if !froze {
			return
		}
		if _, ok := l.transition([]string{statePaused}, stateResuming); ok {
			l.resume()
		}
	}, nil
}

// seedWorkspace gives the new lease l the /workspace its template (or the
// nearest template below it) kept from a snapshot, before l runs.
func (s *Server) seedWorkspace(l *lease) error {
	if s.images == nil || l.isolation != IsolationNamespaces {
		return nil
	}
	ws, ok := s.images.templates.workspace(l.rootfs)
	if !ok {
		return nil
	}
	return machine.SeedWorkspace(ws, l.dir, s.imageOwner(), l.owner())
}

// workspace is the host directory of the /workspace kept by the ready
// template id or the nearest template of its chain that keeps one.
func (st *templateStore) workspace(id string) (string, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	meta, ok := st.readyLocked(id)
	if !ok {
		return "", false
	}
	for _, cid := range slices.Backward(meta.Chain) {
		dir := filepath.Join(st.dirLocked(cid), workspaceDir)
		if _, err := os.Lstat(dir); err == nil {
			return dir, true
		}
	}
	return "", false
}
