package createos

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/sandboxflow/sandboxflow/sandbox"
)

// Templates (docs/CREATEOS-API.md §3.11): EnsureTemplate builds a template
// from a Dockerfile once, by content, and follows its build log.

// TemplateLogTailBytes bounds the end of a failed build's log that a
// *sandbox.TemplateBuildError carries: enough for the failing step and
// its output, small enough for workflow history.
const TemplateLogTailBytes = 4 << 10

// templatePollInterval paces the GETs between two follows of a build log
// that closed before its final event.
const templatePollInterval = time.Second

// Template statuses (TemplateView.status).
const (
	templatePending  = "pending"
	templateBuilding = "building"
	templateReady    = "ready"
	templateFailed   = "failed"
)

func templatePath(idOrName string) string { return "/templates/" + url.PathEscape(idOrName) }

// templateData is a template as the server reports it (TemplateView).
type templateData struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
	// Dockerfile is what the template was built from (with
	// ?include=dockerfile), FromSandbox the sandbox a snapshot copied.
	Dockerfile  string `json:"dockerfile,omitempty"`
	FromSandbox string `json:"from_sandbox,omitempty"`
}

// templateEvent is one NDJSON event of a followed build log.
type templateEvent struct {
	Line   string `json:"line"`
	Final  bool   `json:"final"`
	Status string `json:"status"`
}

// EnsureTemplate returns the ready template of spec, named spec.Name(),
// building it first when no template has that name (sandbox.TemplateBuilder).
// Nothing but the name makes it idempotent, as the API has no idempotency
// key: a template of that name that is pending or building is followed, not
// built again; a create answered 409 (another caller made it first, or an
// earlier attempt whose answer was lost) is followed the same way; a create
// whose answer was lost otherwise is an error that a retry resolves by
// finding the name. A template of that name that failed fails again, the
// same way, without a rebuild: its Dockerfile is what failed, so a rebuild
// would too (delete the template to try again, after fixing what it
// needed from outside). A template of that name not built from spec's
// Dockerfile (a snapshot, say) is refused (templateOf).
//
// The build log's lines go to onLog as they come; a follow that the
// server ends before the build does (the hosted service may) is resumed
// after a GET, its lines already seen skipped.
func (c *Client) EnsureTemplate(ctx context.Context, spec sandbox.TemplateSpec, onLog func(line string)) (sandbox.Template, error) {
	if err := spec.Validate(); err != nil {
		return sandbox.Template{}, err
	}
	name := spec.Name()
	data, err := c.templateOf(ctx, spec)
	if statusOf(err) == http.StatusNotFound {
		data, err = c.createTemplate(ctx, name, spec)
		if statusOf(err) == http.StatusConflict {
			data, err = c.templateOf(ctx, spec)
		}
	}
	if err != nil {
		return sandbox.Template{}, err
	}
	if data.Status == templateReady {
		return sandbox.Template{ID: data.ID, Name: name}, nil
	}
	return c.followTemplate(ctx, data, onLog)
}

// templateOf reads the template named spec.Name(), which must be a build
// of spec's Dockerfile: the name is all that EnsureTemplate finds it by, and
// anyone who can make templates can take a name (a session's snapshot, a
// build of another Dockerfile), so a template of that name made otherwise
// would give every run of spec files that its Dockerfile never made. Such a
// template is a *sandbox.InvalidInputError naming "dockerfile". (A server
// that does not echo the Dockerfile is trusted with the name.)
func (c *Client) templateOf(ctx context.Context, spec sandbox.TemplateSpec) (templateData, error) {
	data, err := c.getTemplate(ctx, spec.Name())
	if err == nil && (data.FromSandbox != "" || data.Dockerfile != "" && data.Dockerfile != spec.Dockerfile) {
		return templateData{}, &sandbox.InvalidInputError{Field: "dockerfile",
			Reason: "the template named " + spec.Name() + " is not a build of this Dockerfile (a snapshot, or another build under its name): delete it"}
	}
	return data, err
}

// getTemplate reads a template by id or name, its Dockerfile included; a
// missing one is the *sandbox.APIError of a 404.
func (c *Client) getTemplate(ctx context.Context, idOrName string) (templateData, error) {
	rq := request{op: "get template", method: http.MethodGet, path: templatePath(idOrName), query: url.Values{"include": {"dockerfile"}}}
	var data templateData
	if err := c.call(ctx, rq, &data); err != nil {
		return templateData{}, err
	}
	return data, checkTemplate(rq.op, data, idOrName)
}

// createTemplate asks for a build. 409 means the name is taken.
func (c *Client) createTemplate(ctx context.Context, name string, spec sandbox.TemplateSpec) (templateData, error) {
	rq := request{op: "create template", method: http.MethodPost, path: "/templates", own: []int{http.StatusConflict},
		json: struct {
			Name       string `json:"name"`
			Dockerfile string `json:"dockerfile"`
			Base       string `json:"base,omitempty"`
		}{name, spec.Dockerfile, spec.Base}}
	var data templateData
	if err := c.call(ctx, rq, &data); err != nil {
		return templateData{}, err
	}
	return data, checkTemplate(rq.op, data, name)
}

// checkTemplate checks that a TemplateView is about the template asked
// for, with a status known.
func checkTemplate(op string, data templateData, idOrName string) error {
	switch {
	case !sandbox.ValidID(data.ID):
		return invalidResponse(op, "the template id is missing or not a valid id")
	case data.ID != idOrName && data.Name != idOrName:
		return invalidResponse(op, "the answer is about another template")
	}
	switch data.Status {
	case templatePending, templateBuilding, templateReady, templateFailed:
		return nil
	}
	return invalidResponse(op, "unknown template status "+quoteIfSafe(data.Status))
}

// followTemplate follows the build log of a template until the build
// ends: the template when it is ready, a *sandbox.TemplateBuildError with
// the log's tail when it failed.
func (c *Client) followTemplate(ctx context.Context, data templateData, onLog func(string)) (sandbox.Template, error) {
	seen := 0 // lines of the log passed on: a new follow starts from the first
	logTail := newTail(TemplateLogTailBytes)
	for {
		status, err := c.followTemplateLog(ctx, data.ID, func(line string) {
			logTail.write(line + "\n")
			if onLog != nil {
				onLog(line)
			}
		}, &seen)
		if err != nil {
			return sandbox.Template{}, err
		}
		if status == "" { // the stream closed before the final event
			if data, err = c.getTemplate(ctx, data.ID); err != nil {
				return sandbox.Template{}, err
			}
			if data.Status == templatePending || data.Status == templateBuilding {
				if err := sleep(ctx, templatePollInterval); err != nil {
					return sandbox.Template{}, err
				}
				continue
			}
			status = data.Status
			if status == templateFailed {
				continue // once more, for the whole log of the failure
			}
		}
		if status == templateReady {
			return sandbox.Template{ID: data.ID, Name: data.Name}, nil
		}
		return sandbox.Template{}, &sandbox.TemplateBuildError{TemplateID: data.ID, Name: data.Name, LogTail: logTail.String()}
	}
}

// followTemplateLog reads one follow of a build log, passing on the lines
// past *seen. It returns the final event's status ("ready", "failed",
// "cancelled"), or "" when the stream ended without one.
func (c *Client) followTemplateLog(ctx context.Context, id string, onLine func(string), seen *int) (string, error) {
	rq := request{op: "follow template log", method: http.MethodGet, path: templatePath(id) + "/logs", query: url.Values{"follow": {"true"}}}
	s, err := c.openStream(ctx, rq)
	if err != nil {
		return "", err
	}
	defer s.Close()
	for n := 0; ; {
		line, err := s.next()
		if errors.Is(err, errStreamEnded) || errors.Is(err, errStreamIdle) {
			return "", nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			return "", nil // a broken stream: the caller looks, and follows again
		}
		var ev templateEvent
		if json.Unmarshal(line, &ev) != nil {
			return "", invalidResponse(rq.op, "an event is not a JSON object")
		}
		if ev.Final {
			if ev.Status == "" {
				return "", invalidResponse(rq.op, "the final event has no status")
			}
			return ev.Status, nil
		}
		if n++; n > *seen {
			*seen = n
			onLine(ev.Line)
		}
	}
}

var _ sandbox.TemplateBuilder = (*Client)(nil)
