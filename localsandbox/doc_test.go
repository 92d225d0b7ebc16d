package localsandbox

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The package map ("Where things are" in doc.go) is the one map of the
// server and its rooms: it names every room under internal/, and every
// file it points to exists, so that a room added, moved or renamed cannot
// leave the map behind unseen.
func TestPackageMapNamesEveryRoom(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "// # Where things are\n")
	if !ok {
		t.Fatal(`doc.go has no section "Where things are"`)
	}
	section, _, _ = strings.Cut(section, "\n// # ")

	rooms, err := os.ReadDir("internal")
	if err != nil {
		t.Fatal(err)
	}
	for _, room := range rooms {
		if room.IsDir() && !strings.Contains(section, "internal/"+room.Name()+" ") {
			t.Errorf("the package map does not name the room internal/%s", room.Name())
		}
	}
	for _, file := range regexp.MustCompile(`[A-Za-z0-9_/]+\.go\b`).FindAllString(section, -1) {
		if _, err := os.Stat(filepath.FromSlash(file)); err != nil {
			t.Errorf("the package map names %s, which does not exist", file)
		}
	}
}
