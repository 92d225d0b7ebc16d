package localsandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
)

// officialSDK is the vendor's TypeScript SDK, pinned: the client this
// server must serve unchanged (docs/CREATEOS-API.md §0).
const officialSDK = "@nodeops-createos/sandbox@0.7.1"

// TestOfficialTypeScriptSDK drives the real server with the official
// TypeScript SDK through its public flows (testdata/officialsdk/flows.mjs):
// each flow is a check that fails here by its name. The SDK does not model
// managed processes; the createos client's tests prove those routes.
//
// It needs node and npm, and the npm registry (or the npm cache) for the
// SDK: without them it skips, and under CI=true it fails, with one line
// naming what is missing.
func TestOfficialTypeScriptSDK(t *testing.T) {
	node, npm := lookTool(t, "node"), lookTool(t, "npm")
	dir := t.TempDir()
	installSDK(t, npm, dir)
	script, err := os.ReadFile(filepath.Join("testdata", "officialsdk", "flows.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	// Next to node_modules, where node resolves the package from.
	if err := os.WriteFile(filepath.Join(dir, "flows.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}

	// Egress as the SDK sees it under the policy off (a rule is refused)
	// and, where it can be enforced, allowlist (rules are in force).
	policies := []EgressPolicy{EgressOff}
	if _, err := exec.LookPath("slirp4netns"); os.Geteuid() == 0 && err == nil {
		policies = append(policies, EgressAllowlist)
	}
	for _, policy := range policies {
		t.Run("egress="+string(policy), func(t *testing.T) { runSDKFlows(t, node, dir, policy) })
	}
}

// runSDKFlows runs flows.mjs in dir against a server whose egress policy
// is policy.
func runSDKFlows(t *testing.T, node, dir string, policy EgressPolicy) {
	ts := startServer(t, Options{Egress: policy})
	egressEnforced := policy != EgressOff
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "flows.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"SDK_BASE_URL="+strings.TrimSuffix(ts.base, "/v1"),
		"SDK_API_KEY="+testKey,
		"SDK_CAN_INGRESS="+flag(ts.srv.networkAvailable()),
		"SDK_CAN_FORK="+flag(ts.srv.Isolation() == IsolationNamespaces),
		"SDK_EGRESS_ENFORCED="+flag(egressEnforced),
		"SDK_CAN_RESIZE="+flag(ts.srv.resizeErr == nil),
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()

	type result struct {
		Check string `json:"check"`
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Done  bool   `json:"done"`
	}
	passed, total, done := 0, 0, false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Errorf("the script wrote a line that is not a result: %q", sc.Bytes())
			continue
		}
		if r.Done {
			done = true
			continue
		}
		total++
		if r.OK {
			passed++
			continue
		}
		t.Errorf("SDK flow %q failed: %s", r.Check, r.Error)
	}
	t.Logf("official SDK %s: %d of %d flows passed", officialSDK, passed, total)
	if runErr != nil || !done {
		t.Fatalf("the SDK script did not finish (%v): %s", runErr, lastLines(stderr.String(), 20))
	}
	if total == 0 {
		t.Fatal("the SDK script ran no flow")
	}
}

// lookTool returns the path of a program the test needs, or skips the
// test (fails it under CI=true) with one line naming what is missing.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" is not installed (the official SDK test needs node 20 and npm)")
	}
	return path
}

// installSDK installs the pinned SDK into dir with npm (its cache is npm's
// own), or skips the test (fails it under CI=true) when npm cannot.
func installSDK(t *testing.T, npm, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "install", "--prefix", dir, "--no-audit", "--no-fund",
		"--prefer-offline", "--loglevel=error", officialSDK)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		missing(t, "npm could not install "+officialSDK+" (is the npm registry reachable?): "+lastLines(string(out), 1))
	}
}

// missing skips the test with why, or fails it under CI=true.
func missing(t *testing.T, why string) {
	t.Helper()
	testenv.Missing(t, why)
}

// lastLines returns the last n non-empty lines of s, joined by " | ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
