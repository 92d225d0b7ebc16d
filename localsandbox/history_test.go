package localsandbox

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestBoundArgv(t *testing.T) {
	many := make([]string, 100)
	for i := range many {
		many[i] = "a"
	}
	for _, tc := range []struct {
		name string
		argv []string
		want []string
	}{
		{"short", []string{"/bin/true", "x"}, []string{"/bin/true", "x"}},
		{"many args", many, append(slices.Clone(many[:maxHistoryArgs]), "…(+36 more args)")},
		{"one long arg", []string{strings.Repeat("b", 5000)}, []string{strings.Repeat("b", headBytes) + "…(+904 bytes)"}},
		{"cut in the middle", []string{strings.Repeat("c", 4000), strings.Repeat("d", 200), "e"},
			[]string{strings.Repeat("c", 4000), strings.Repeat("d", 96) + "…(+104 bytes)", "…(+1 more args)"}},
		{"character boundary", []string{strings.Repeat("f", headBytes-1) + "é"}, []string{strings.Repeat("f", headBytes-1) + "…(+2 bytes)"}},
	} {
		if got := boundArgv(tc.argv); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %s", tc.name, fmt.Sprintf("%.200q", got))
		}
	}
}
