// Package docs holds the project's documents; its test holds them to the
// repository: every link resolves, every test a document names exists, and
// every citation of the wire reference points into the repository at a
// section that exists.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoFiles returns the files under the repository root (the parent of
// this directory) whose names end in one of exts, leaving out .git and
// node_modules.
func repoFiles(t *testing.T, exts ...string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		for _, ext := range exts {
			if !d.IsDir() && strings.HasSuffix(path, ext) {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				files[path] = string(b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// Every relative link of every Markdown file resolves to a file or
// directory of the repository, and to a heading of it where it names one.
func TestLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	for path, text := range repoFiles(t, ".md") {
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file := filepath.Join(filepath.Dir(path), target)
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s links to %s, which does not exist", path, target)
				continue
			}
			if anchor := strings.TrimPrefix(m[2], "#"); anchor != "" && !slices.Contains(anchors(t, file), anchor) {
				t.Errorf("%s links to %s#%s, which has no such heading", path, target, anchor)
			}
		}
	}
}

// anchors returns the anchors GitHub gives the headings of a Markdown
// file: lower case, punctuation dropped, spaces as hyphens.
func anchors(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, m := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-"))
	}
	return out
}

// Every test or fuzz target a document names (the threat model's rows,
// the reliability table) is a function of some test file.
func TestNamedTestsExist(t *testing.T) {
	defined := map[string]bool{}
	fn := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`)
	for _, text := range repoFiles(t, "_test.go") {
		for _, m := range fn.FindAllStringSubmatch(text, -1) {
			defined[m[1]] = true
		}
	}
	named := regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Z]\\w*)`")
	for path, text := range repoFiles(t, ".md") {
		for _, m := range named.FindAllStringSubmatch(text, -1) {
			if !defined[m[1]] {
				t.Errorf("%s names %s, which no test file defines", path, m[1])
			}
		}
	}
}

// The wire reference is cited as docs/CREATEOS-API.md in code (Markdown
// links to it), never as a document outside the repository, and every
// section cited exists.
func TestCitationsStayInTheRepository(t *testing.T) {
	ref, err := os.ReadFile("CREATEOS-API.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{2,3} (\d+(?:\.\d+)?)[. ]`).FindAllStringSubmatch(string(ref), -1) {
		sections[m[1]] = true
	}
	outside := regexp.MustCompile(`\.\./shared/|/work/shared|[^/\w]shared/CREATEOS-API`)
	bare := regexp.MustCompile(`(^|[^/\w])CREATEOS-API(\.md)?`)
	cited := regexp.MustCompile(`CREATEOS-API\.md\s+§(\d+(?:\.\d+)?)`)
	for path, text := range repoFiles(t, ".go", ".md", "Makefile") {
		if strings.HasSuffix(path, "docs_test.go") {
			continue // this file names what it looks for
		}
		if loc := outside.FindStringIndex(text); loc != nil {
			t.Errorf("%s cites a document outside the repository: %q", path, text[loc[0]:loc[1]])
		}
		// Markdown cites through links, which TestLinksResolve checks;
		// code comments by path from the repository's root.
		if !strings.HasSuffix(path, ".md") {
			for _, m := range bare.FindAllStringIndex(text, -1) {
				t.Errorf("%s cites the wire reference without its path docs/: %q", path, text[m[0]:min(m[1]+8, len(text))])
			}
		}
		for _, m := range cited.FindAllStringSubmatch(text, -1) {
			if !sections[m[1]] {
				t.Errorf("%s cites CREATEOS-API.md §%s, which has no such section", path, m[1])
			}
		}
	}
}
