package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The helper's two outcomes, each seen from outside: a child test process
// runs Missing with CI unset and with CI=true.
func TestMissingSkipsOrFailsUnderCI(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		Missing(t, "the machine lacks it")
		t.Fatal("Missing returned")
	}
	for _, tc := range []struct {
		ci   string
		want string
		fail bool
	}{
		{ci: "", want: "--- SKIP", fail: false},
		{ci: "false", want: "--- SKIP", fail: false},
		{ci: "true", want: "--- FAIL", fail: true},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingSkipsOrFailsUnderCI$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.fail || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "the machine lacks it") {
			t.Errorf("CI=%q: err %v, output:\n%s", tc.ci, err, out)
		}
	}
}

func TestRequireCommandFindsPrograms(t *testing.T) {
	if path := RequireCommand(t, "sh"); path == "" {
		t.Error("no path for sh")
	}
}
