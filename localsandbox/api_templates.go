package localsandbox

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// The templates API (docs/CREATEOS-API.md §3.11; templates.go builds and
// keeps them).
//
//	POST   /v1/templates                 {"name", "dockerfile", "base"?} → TemplateView, pending
//	POST   /v1/templates                 {"name", "from_sandbox"} [ext] → TemplateView, ready (templates.go, Snapshots)
//	GET    /v1/templates                 paginated
//	GET    /v1/templates/{id}[?include=dockerfile]   by id or name
//	DELETE /v1/templates/{id}            {"ok": true}
//	GET    /v1/templates/{id}/logs       the build's log, plain text
//	GET    /v1/templates/{id}/logs?follow=true       NDJSON, ending {"final": true, "status"}
//
// base names the image or template a Dockerfile without FROM builds on
// (the server's default when neither says). What is wrong with the
// Dockerfile fails the build, with the line in its log; what is wrong
// with the request is a 400 before anything is made.

// templateView is the official TemplateView.
type templateView struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Base       string    `json:"base"`
	Status     string    `json:"status"`
	Size       int64     `json:"ext4_size_bytes"`
	CreatedAt  time.Time `json:"created_at"`
	BuiltAt    time.Time `json:"built_at,omitzero"`
	Dockerfile string    `json:"dockerfile,omitempty"`
	// FromSandbox is the sandbox a snapshot copied [ext].
	FromSandbox string `json:"from_sandbox,omitempty"`
}

func (t *tmpl) view(dockerfile bool) templateView {
	m := t.state()
	v := templateView{ID: m.ID, Name: m.Name, Base: m.Base, Status: m.Status, Size: m.SizeBytes, CreatedAt: m.CreatedAt, BuiltAt: m.BuiltAt, FromSandbox: m.FromSandbox}
	if dockerfile {
		v.Dockerfile = t.dockerfile
	}
	return v
}

// maxDockerfileBytes bounds a Dockerfile.
const maxDockerfileBytes = 64 << 10

type createTemplateRequest struct {
	Name       string `json:"name"`
	Dockerfile string `json:"dockerfile"`
	Base       string `json:"base,omitempty"`
	// FromSandbox makes the template of a live sandbox [ext].
	FromSandbox string `json:"from_sandbox,omitempty"`
}

// templates returns the store, or the 400 of a server without images.
func (s *Server) templates() (*templateStore, error) {
	if s.images == nil || s.isolation != IsolationNamespaces {
		return nil, unsupported("templates", "a process-group server runs commands on the host and has no images")
	}
	return s.images.templates, nil
}

func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) error {
	st, err := s.templates()
	if err != nil {
		return err
	}
	var req createTemplateRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	// The rule is the library's, which checks a name before anything is
	// sent: one rule, held to this server's reserved names by
	// TestTemplateNamesAreTheLibrarysRule.
	var invalid *sandbox.InvalidInputError
	if err := sandbox.CheckTemplateName("name", req.Name); errors.As(err, &invalid) {
		return &apiError{http.StatusBadRequest, "name " + invalid.Reason}
	}
	switch {
	case req.FromSandbox != "" && (req.Dockerfile != "" || req.Base != ""):
		return badRequest("from_sandbox makes a template of a sandbox: dockerfile and base must be left out")
	case req.FromSandbox == "" && strings.TrimSpace(req.Dockerfile) == "":
		return badRequest("dockerfile is required")
	case len(req.Dockerfile) > maxDockerfileBytes:
		return badRequest("dockerfile must be at most %d bytes", maxDockerfileBytes)
	case len(req.Base) > 200:
		return badRequest("base must be at most 200 bytes")
	}
	if _, isTemplate := st.lookup(req.Name); !isTemplate {
		if _, err := s.resolveImage(req.Name); err == nil {
			return badRequest("name %q is an image's", req.Name) // which a create's rootfs would name
		}
	}
	s.reapTemplates()
	if req.FromSandbox != "" {
		t, err := s.snapshotLease(req.Name, req.FromSandbox)
		if err != nil {
			return err
		}
		return writeData(w, t.view(false))
	}
	t, err := s.newTemplate(req.Name, req.Base, req.Dockerfile)
	if err != nil {
		return err
	}
	s.log.Info("template building", "template", t.meta.ID, "name", req.Name)
	v := t.view(false) // pending, however fast the build fails
	s.workers.Go(func() { s.buildTemplate(t) })
	return writeData(w, v)
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	st, err := s.templates()
	if err != nil {
		return err
	}
	limit, offset, err := pageOf(r)
	if err != nil {
		return err
	}
	s.reapTemplates()
	return writePage(w, st.list(), limit, offset, func(t *tmpl) templateView { return t.view(false) })
}

// lookupTemplate finds the request's template by id or name.
func (s *Server) lookupTemplate(r *http.Request) (*tmpl, error) {
	st, err := s.templates()
	if err != nil {
		return nil, err
	}
	id, err := pathID(r, "id")
	if err != nil {
		return nil, err
	}
	t, ok := st.lookup(id)
	if !ok {
		return nil, notFound("template")
	}
	return t, nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := s.lookupTemplate(r)
	if err != nil {
		return err
	}
	return writeData(w, t.view(r.URL.Query().Get("include") == "dockerfile"))
}

func (s *Server) deleteTemplateRoute(w http.ResponseWriter, r *http.Request) error {
	t, err := s.lookupTemplate(r)
	if err != nil {
		return err
	}
	if err := s.deleteTemplate(t); err != nil {
		return err
	}
	s.reapTemplates()
	return writeData(w, map[string]any{"id": t.meta.ID, "ok": true})
}

// templateFinal is the last event of a followed log.
type templateFinal struct {
	Final  bool   `json:"final"`
	Status string `json:"status"`
}

// templateLogs answers the build's log: plain text, or with follow=true
// NDJSON events, one per line, flushed each, until the final one once the
// build has ended (or the client goes away).
func (s *Server) templateLogs(w http.ResponseWriter, r *http.Request) error {
	t, err := s.lookupTemplate(r)
	if err != nil {
		return err
	}
	if r.URL.Query().Get("follow") != "true" {
		_, lines, _ := t.snapshot(0)
		var b strings.Builder
		for _, e := range lines {
			b.WriteString(e.Line)
			b.WriteByte('\n')
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(b.String()))
		return nil
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	next := 0
	for {
		meta, lines, changed := t.snapshot(next)
		for _, e := range lines {
			if err := enc.Encode(e); err != nil {
				return nil // the client is gone
			}
		}
		next += len(lines)
		if meta.Status == templateReady || meta.Status == templateFailed {
			enc.Encode(templateFinal{Final: true, Status: meta.Status})
			if flusher != nil {
				flusher.Flush()
			}
			return nil
		}
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return nil
		case <-s.done:
			return nil
		}
	}
}
