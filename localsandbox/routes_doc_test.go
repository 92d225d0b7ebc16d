package localsandbox

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The route index of docs/CREATEOS-API.md (§3.0) says in its last column
// which routes sandboxd serves and which it declines; it says what
// apiRoutes, the server's one table of routes, holds. Every route of a row
// marked "sandboxd" is served, every route of a row marked "sandboxd
// declines" is declined, every row is one or the other (but the in-guest
// API, which is no route of the server), and every route of the table that
// is not an extension of the project's has its row.
func TestRouteIndexSaysWhatTheServerServes(t *testing.T) {
	doc, err := os.ReadFile("../docs/CREATEOS-API.md")
	if err != nil {
		t.Fatal(err)
	}
	_, index, ok := strings.Cut(string(doc), "### 3.0 Route index\n")
	if !ok {
		t.Fatal("docs/CREATEOS-API.md has no §3.0 Route index")
	}
	index, _, _ = strings.Cut(index, "\n### ")
	colon := regexp.MustCompile(`:[A-Za-z]+`)
	used := make([]bool, len(apiRoutes))
	rows := 0
	for _, line := range strings.Split(index, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 7 || cells[0] == "Method" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows++
		path := strings.Trim(strings.Fields(cells[1])[0], "`")
		if !strings.HasPrefix(path, "/") {
			continue // the in-guest API: no route of the server
		}
		path, _, _ = strings.Cut(path, "?")
		path = colon.ReplaceAllString(path, "{}")
		declined := strings.Contains(cells[6], "sandboxd declines")
		if !declined && !strings.Contains(cells[6], "sandboxd") {
			t.Errorf("a row says neither that sandboxd serves its route nor that it declines it: %s", line)
			continue
		}
		for _, method := range strings.Split(cells[0], " / ") {
			for _, p := range expand(path) {
				found := false
				for i, rt := range apiRoutes {
					if (rt.serve == nil) != declined || !routeCovers(rt, method, p) {
						continue
					}
					found, used[i] = true, true
				}
				if !found {
					t.Errorf("the route index says sandboxd %s %s %s, which apiRoutes does not", map[bool]string{true: "declines", false: "serves"}[declined], method, p)
				}
			}
		}
	}
	if rows < 25 {
		t.Fatalf("read %d rows of the route index: has its table changed shape?", rows)
	}
	for i, rt := range apiRoutes {
		if !used[i] && !rt.ext {
			t.Errorf("apiRoutes has %s %s, which no row of the route index names (an extension? mark it ext)", rt.method, rt.path)
		}
	}
}

// routeCovers reports whether rt is a route the index names as method and
// path (each parameter {}; "/..." the path and below).
func routeCovers(rt apiRoute, method, path string) bool {
	if method != "*" && rt.method != method && rt.method != "*" || method == "*" && rt.serve == nil && rt.method != "*" {
		return false
	}
	norm := regexp.MustCompile(`\{[a-z]+\}`).ReplaceAllString(rt.path, "{}")
	base, below := strings.CutSuffix(path, "/...")
	rtBase, rtBelow := strings.CutSuffix(norm, "/...")
	switch {
	case below: // the index's row covers everything below base
		return norm == base || strings.HasPrefix(norm, base+"/")
	case rtBelow: // the table's route covers everything below rtBase
		return path == rtBase || strings.HasPrefix(path, rtBase+"/")
	}
	return norm == path
}

// expand turns {a,b} into each alternative and [/x] (nested, too) into
// with and without.
func expand(path string) []string {
	if i := strings.Index(path, "["); i >= 0 {
		depth, j := 0, i
		for ; j < len(path); j++ {
			if path[j] == '[' {
				depth++
			} else if path[j] == ']' {
				if depth--; depth == 0 {
					break
				}
			}
		}
		return append(expand(path[:i]+path[j+1:]), expand(path[:i]+path[i+1:j]+path[j+1:])...)
	}
	if i := strings.Index(path, "{"); i >= 0 {
		j := strings.Index(path[i:], "}") + i
		if inner := path[i+1 : j]; strings.Contains(inner, ",") {
			var out []string
			for _, alt := range strings.Split(inner, ",") {
				out = append(out, expand(path[:i]+alt+path[j+1:])...)
			}
			return out
		}
		rest := expand(path[j+1:])
		for k := range rest {
			rest[k] = path[:j+1] + rest[k]
		}
		return rest
	}
	return []string{path}
}

// Every declined route answers 400 UNSUPPORTED naming what the server
// lacks, in the fail envelope, for any sandbox id and before looking the
// sandbox up; a path that is no route of the API is 404 "no such
// endpoint". Before, each of these routes was a 404, which the SDKs report
// as "sandbox not found".
func TestDeclinedRoutesAnswerUnsupported(t *testing.T) {
	ts := startServer(t, Options{})
	lease := ts.createLease()
	param := regexp.MustCompile(`\{[a-z]+\}`)
	for _, rt := range apiRoutes {
		if rt.serve != nil {
			continue
		}
		base, below := strings.CutSuffix(param.ReplaceAllString(rt.path, lease), "/...")
		paths := []string{base}
		if below {
			paths = append(paths, base+"/x", base+"/x/y")
		}
		methods := []string{rt.method}
		if rt.method == "*" {
			methods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
		}
		for _, p := range paths {
			for _, m := range methods {
				status, body := ts.rawCall(m, strings.TrimPrefix(p, "/v1"), nil)
				if status != http.StatusBadRequest || !strings.Contains(body, `"status":"fail"`) ||
					!strings.Contains(body, `"code":"UNSUPPORTED"`) || !strings.Contains(body, jsonEscape(rt.declined)) {
					t.Errorf("%s %s: %d %s", m, p, status, body)
				}
			}
		}
	}
	// A client that shows only the status line and headers (the Jenkins
	// plugin's tunnel) sees why too.
	resp := ts.request("POST", "/sandboxes/"+lease+"/tunnel/22", nil, nil)
	resp.Body.Close()
	if got := resp.Header.Get(unsupportedHeader); !strings.Contains(got, "is not supported by this server") {
		t.Errorf("the tunnel's %s header: %q", unsupportedHeader, got)
	}
	for _, p := range []string{"/nowhere", "/sandboxes/" + lease + "/nothing", "/networksx"} {
		if status, body := ts.rawCall("GET", p, nil); status != http.StatusNotFound || !strings.Contains(body, "no such endpoint") {
			t.Errorf("GET %s: %d %s", p, status, body)
		}
	}
	// A declined route with a method it does not decline is no route.
	if status, _ := ts.rawCall("GET", "/sandboxes/"+lease+"/resize", nil); status != http.StatusNotFound {
		t.Errorf("GET …/resize: %d, want 404", status)
	}
}

// jsonEscape is s as encoding/json writes it inside a string.
func jsonEscape(s string) string {
	return strings.NewReplacer(`"`, `\"`, "<", `\u003c`, ">", `\u003e`, "&", `\u0026`).Replace(s)
}
