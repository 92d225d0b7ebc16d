package localsandbox

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The route index of docs/CREATEOS-API.md (§3.0) says in its last column
// which routes sandboxd serves. It says what routes() serves: every route
// served is in a row marked sandboxd, and every such row has a route.
func TestRouteIndexSaysWhatTheServerServes(t *testing.T) {
	var src []byte
	for _, file := range []string{"api_sandboxes.go", "api_templates.go"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	var served [][2]string // method, path with each {param} as {}
	param := regexp.MustCompile(`\{[a-z]+\}`)
	for _, m := range regexp.MustCompile(`"(GET|POST|PUT|PATCH|DELETE) (/[^"]*)":`).FindAllStringSubmatch(string(src), -1) {
		served = append(served, [2]string{m[1], param.ReplaceAllString(m[2], "{}")})
	}
	if len(served) < 20 {
		t.Fatalf("found %d routes in api_sandboxes.go: has routes() moved?", len(served))
	}

	doc, err := os.ReadFile("../docs/CREATEOS-API.md")
	if err != nil {
		t.Fatal(err)
	}
	_, index, ok := strings.Cut(string(doc), "### 3.0 Route index\n")
	if !ok {
		t.Fatal("docs/CREATEOS-API.md has no §3.0 Route index")
	}
	index, _, _ = strings.Cut(index, "\n### ")
	type row struct {
		methods  string
		patterns []string // paths with each :param as {}; a trailing "/..." matches the path and below
		line     string
		used     bool
	}
	var rows []*row
	colon := regexp.MustCompile(`:[A-Za-z]+`)
	for _, line := range strings.Split(index, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 7 || !strings.Contains(cells[6], "sandboxd") {
			continue
		}
		path := strings.Trim(strings.Fields(cells[1])[0], "`")
		path, _, _ = strings.Cut(path, "?")
		path = colon.ReplaceAllString(path, "{}")
		rows = append(rows, &row{methods: cells[0], patterns: expand(path), line: line})
	}
	for _, s := range served {
		found := false
		for _, r := range rows {
			if !strings.Contains(r.methods, s[0]) && r.methods != "*" {
				continue
			}
			for _, p := range r.patterns {
				base, below := strings.CutSuffix(p, "/...")
				if p == s[1] || below && (s[1] == base || strings.HasPrefix(s[1], base+"/")) {
					found, r.used = true, true
				}
			}
		}
		if !found {
			t.Errorf("sandboxd serves %s %s, which no row of the route index marks sandboxd", s[0], s[1])
		}
	}
	for _, r := range rows {
		if !r.used {
			t.Errorf("the route index marks sandboxd on a route it does not serve: %s", r.line)
		}
	}
}

// expand turns {a,b} into each alternative and [/x] into with and without.
func expand(path string) []string {
	if i := strings.Index(path, "["); i >= 0 {
		j := strings.Index(path, "]")
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
