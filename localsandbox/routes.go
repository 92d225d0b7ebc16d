package localsandbox

import (
	"net/http"
	"strings"
)

// apiRoute is one route of the official API (docs/CREATEOS-API.md §3.0) or
// of the project's extensions: served by a handler, or declined by name.
//
// A route this server does not serve is still answered plainly: 400 with
// the machine code UNSUPPORTED and the feature it lacks, in the JSend fail
// envelope that create uses for a field it does not serve. A 404 would
// read, in every SDK, as "that sandbox does not exist" (NotFoundError),
// which is false and sends a client looking for the wrong fault.
type apiRoute struct {
	// method is an HTTP method, or "*" for every method (declined routes
	// only).
	method string
	// path uses {name} for a segment; a declined route's path may end in
	// "/..." for the path and everything below it.
	path string
	// serve answers the route; nil when it is declined.
	serve func(*Server, http.ResponseWriter, *http.Request) error
	// declined names the feature this server lacks, and why.
	declined string
	// ext marks a route of the project's own (PROTOCOL.md), not in the
	// official API's index.
	ext bool
	// first marks a served route whose literal segment stands where other
	// routes have a sandbox id (by-ip): one ServeMux refuses both, as
	// neither pattern is more specific, so it is matched before the
	// others. Sandbox ids are "sb-…", never such a literal.
	first bool
}

// apiRoutes is every route the server knows: the one table of what it
// serves and what it declines, held to docs/CREATEOS-API.md §3.0 by
// TestRouteIndexSaysWhatTheServerServes.
var apiRoutes = []apiRoute{
	{method: "GET", path: "/healthz", serve: (*Server).healthz},
	{method: "GET", path: "/readyz", serve: (*Server).readyz},
	{method: "GET", path: "/v1/shapes", serve: (*Server).getShapes},
	{method: "GET", path: "/v1/rootfs", serve: (*Server).getRootfs},
	{method: "GET", path: "/v1/whoami", serve: (*Server).whoami},
	{method: "GET", path: "/v1/hosts", declined: "the host list: this server is one host"},

	{method: "POST", path: "/v1/sandboxes", serve: (*Server).createSandbox},
	{method: "GET", path: "/v1/sandboxes", serve: (*Server).listSandboxes},
	{method: "GET", path: "/v1/sandboxes/{id}", serve: (*Server).getSandbox},
	{method: "PATCH", path: "/v1/sandboxes/{id}", serve: (*Server).patchSandbox},
	{method: "DELETE", path: "/v1/sandboxes/{id}", serve: (*Server).deleteSandbox},
	{method: "GET", path: "/v1/sandboxes/by-ip/{ip}", serve: (*Server).getSandboxByIP, first: true},
	{method: "POST", path: "/v1/sandboxes/{id}/pause", serve: (*Server).pauseSandbox},
	{method: "POST", path: "/v1/sandboxes/{id}/resume", serve: (*Server).resumeSandbox},
	{method: "POST", path: "/v1/sandboxes/{id}/fork", serve: (*Server).forkSandbox},
	{method: "POST", path: "/v1/sandboxes/{id}/resize", serve: (*Server).resizeSandbox},

	{method: "POST", path: "/v1/sandboxes/{id}/exec", serve: (*Server).exec},
	{method: "PUT", path: "/v1/sandboxes/{id}/files", serve: (*Server).putFile},
	{method: "GET", path: "/v1/sandboxes/{id}/files", serve: (*Server).getFile},

	{method: "GET", path: "/v1/sandboxes/{id}/egress", serve: (*Server).getEgress},
	{method: "PUT", path: "/v1/sandboxes/{id}/egress", serve: (*Server).putEgress},
	{method: "GET", path: "/v1/sandboxes/{id}/bandwidth", serve: (*Server).getBandwidth},
	{method: "POST", path: "/v1/sandboxes/{id}/bandwidth/recharge", serve: (*Server).rechargeBandwidth},

	{method: "POST", path: "/v1/sandboxes/{id}/ssh-pubkeys", serve: (*Server).addSSHPubkeys},
	{method: "GET", path: "/v1/sandboxes/{id}/ssh-pubkeys", serve: (*Server).listSSHPubkeys, ext: true},
	{method: "DELETE", path: "/v1/sandboxes/{id}/ssh-pubkeys", serve: (*Server).deleteSSHPubkeys, ext: true},

	{method: "POST", path: "/v1/sandboxes/{id}/processes", serve: (*Server).createProcess},
	{method: "GET", path: "/v1/sandboxes/{id}/processes", serve: (*Server).listProcesses},
	{method: "GET", path: "/v1/sandboxes/{id}/processes/{pid}", serve: (*Server).getProcess},
	{method: "DELETE", path: "/v1/sandboxes/{id}/processes/{pid}", serve: (*Server).deleteProcess},
	{method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/stdin/close", serve: (*Server).closeStdin},
	{method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/input", serve: (*Server).input},
	{method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/signal", serve: (*Server).signal},
	{method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/resize", serve: (*Server).resize},
	{method: "GET", path: "/v1/sandboxes/{id}/processes/{pid}/connect", serve: (*Server).connect},
	{method: "GET", path: "/v1/sandboxes/{id}/processes/{pid}/wait", serve: (*Server).wait},

	{method: "GET", path: "/v1/sandboxes/{id}/metrics", serve: (*Server).sandboxMetrics},
	{method: "GET", path: "/v1/metrics", declined: "per-user metrics: this server has one user; GET /v1/sandboxes/{id}/metrics gives each sandbox's"},
	{method: "GET", path: "/v1/metrics/timeseries", declined: "metrics over time: this server keeps no history of them"},

	{method: "*", path: "/v1/sandboxes/{id}/networks/...", declined: "overlay networks: each sandbox has a network of its own"},
	{method: "*", path: "/v1/sandboxes/{id}/disks/...", declined: "S3 disks"},
	{method: "*", path: "/v1/sandboxes/{id}/access-token/...", declined: "delegated access tokens: this server has one key"},
	{method: "*", path: "/v1/sandboxes/{id}/computer/...", declined: declinedDesktop},
	{method: "*", path: "/v1/sandboxes/{id}/tunnel/...", declined: "tunnels: use the preview URL (ingress_enabled)"},
	{method: "*", path: "/v1/sandboxes/{id}/shell", declined: "shells over an upgraded connection: use a managed process with a pty"},
	{method: "*", path: "/v1/sandboxes/{id}/shell-ws", declined: "shells over an upgraded connection: use a managed process with a pty"},
	{method: "*", path: "/v1/networks/...", declined: "overlay networks: each sandbox has a network of its own"},
	{method: "*", path: "/v1/disks/...", declined: "S3 disks"},

	{method: "POST", path: "/v1/templates", serve: (*Server).createTemplate},
	{method: "GET", path: "/v1/templates", serve: (*Server).listTemplates},
	{method: "GET", path: "/v1/templates/{id}", serve: (*Server).getTemplate},
	{method: "DELETE", path: "/v1/templates/{id}", serve: (*Server).deleteTemplateRoute},
	{method: "GET", path: "/v1/templates/{id}/logs", serve: (*Server).templateLogs},
}

// declinedDesktop names the desktop API, declined by its routes and by a
// create on a desktop image (desktopImage).
const declinedDesktop = "the desktop (computer-use) API"

// routes maps the API's endpoints: the served routes of apiRoutes to their
// handlers; any other request to the declined route it names (400
// UNSUPPORTED), or 404 "no such endpoint".
func (s *Server) routes() http.Handler {
	first, mux := http.NewServeMux(), http.NewServeMux()
	for _, rt := range apiRoutes {
		if rt.serve == nil {
			continue
		}
		serve := rt.serve
		m := mux
		if rt.first {
			m = first
		}
		m.Handle(rt.method+" "+rt.path, s.endpoint(func(w http.ResponseWriter, r *http.Request) error {
			return serve(s, w, r)
		}))
	}
	mux.Handle("/", s.endpoint(func(w http.ResponseWriter, r *http.Request) error {
		if rt, ok := declinedRoute(r.Method, r.URL.EscapedPath()); ok {
			// The request's method and the route's own path: "POST
			// /v1/sandboxes/{id}/networks", not the table's "* …/...".
			return unsupported(r.Method+" "+strings.TrimSuffix(rt.path, "/..."), rt.declined)
		}
		return &apiError{http.StatusNotFound, "no such endpoint"}
	}))
	first.Handle("/", mux)
	return s.withRecover(s.withIngress(withRequestID(s.withAuth(s.withOpen(first)))))
}

// declinedRoute finds the declined route that method and path (escaped:
// a segment is what lies between slashes on the wire) ask for.
func declinedRoute(method, path string) (apiRoute, bool) {
	got := strings.Split(strings.TrimSuffix(path, "/"), "/")
	for _, rt := range apiRoutes {
		if rt.serve != nil || rt.method != "*" && rt.method != method {
			continue
		}
		want, below := strings.CutSuffix(rt.path, "/...")
		if routeMatches(strings.Split(want, "/"), got, below) {
			return rt, true
		}
	}
	return apiRoute{}, false
}

// routeMatches reports whether the segments got match the route's want
// ({name} is any one non-empty segment); below lets got go on past want.
func routeMatches(want, got []string, below bool) bool {
	if len(got) < len(want) || len(got) > len(want) && !below {
		return false
	}
	for i, w := range want {
		if strings.HasPrefix(w, "{") {
			if got[i] == "" {
				return false
			}
		} else if got[i] != w {
			return false
		}
	}
	return true
}
