package localsandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
)

// needNetwork skips a test that needs a root server with slirp4netns,
// unless under CI, where their absence is a failure (.ci/run installs
// slirp4netns).
func needNetwork(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "lease networks need a server running as root")
	testenv.RequireCommand(t, "slirp4netns")
}

// hostServer serves body on the host's 127.0.0.1 and returns its port,
// which a lease reaches as 10.0.2.2:<port> with EgressHostLoopback.
func hostServer(t *testing.T, body string) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// fetchScript prints the body of http://host:port/ fetched inside the
// lease, or "ERR <exception>".
func fetchScript(host string, port int) string {
	return fmt.Sprintf(`python3 -c '
import urllib.request, sys
try:
    print(urllib.request.urlopen("http://%s:%d/", timeout=10).read().decode())
except Exception as e:
    print("ERR", type(e).__name__, e)
'`, host, port)
}

type networkData struct {
	ID      string   `json:"id"`
	Egress  []string `json:"egress"`
	Network struct {
		EgressPolicy string `json:"egress_policy"`
		Path         string `json:"path"`
		BytesOut     int64  `json:"bytes_out"`
		BytesIn      int64  `json:"bytes_in"`
	} `json:"network"`
	IngressEnabled     bool   `json:"ingress_enabled"`
	IngressURLTemplate string `json:"ingress_url_template"`
}

// createWith creates a sandbox with the given extra fields.
func (ts *testServer) createWith(fields map[string]any) networkData {
	ts.t.Helper()
	body := map[string]any{"shape": "s-1vcpu-1gb"}
	for k, v := range fields {
		body[k] = v
	}
	var sb networkData
	ts.mustCall("POST", "/sandboxes", body, &sb)
	return sb
}

func (ts *testServer) fetch(lease, host string, port int) string {
	ts.t.Helper()
	return strings.TrimSpace(ts.exec(lease, fetchScript(host, port)).Stdout)
}

func TestEgressAnyReachesTheHost(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAny, EgressHostLoopback: true})
	port := hostServer(t, "hello from the host")
	sb := ts.createWith(map[string]any{"egress": []string{"*"}})
	if !slices.Equal(sb.Egress, []string{"*"}) || sb.Network.Path != "slirp4netns" || sb.Network.EgressPolicy != "any" {
		t.Fatalf("view %+v", sb)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", port); got != "hello from the host" {
		t.Fatalf("fetch: %q", got)
	}
	if got := ts.exec(sb.ID, "cat /etc/resolv.conf").Stdout; got != network.ResolvConf {
		t.Errorf("resolv.conf: %q", got)
	}
	var after networkData
	ts.mustCall("GET", "/sandboxes/"+sb.ID, nil, &after)
	if after.Network.BytesOut == 0 || after.Network.BytesIn < int64(len("hello from the host")) {
		t.Errorf("counters %+v", after.Network)
	}
	var bw bandwidthView
	ts.mustCall("GET", "/sandboxes/"+sb.ID+"/bandwidth", nil, &bw)
	if bw.ID != sb.ID || bw.QuotaBytes != -1 || bw.UsedBytes < after.Network.BytesOut || bw.IngressBytes < after.Network.BytesIn || bw.Capped {
		t.Errorf("bandwidth %+v after %+v", bw, after.Network)
	}
	if status := ts.call("POST", "/sandboxes/"+sb.ID+"/bandwidth/recharge", map[string]any{"add_bytes": 0}, nil); status != http.StatusBadRequest {
		t.Errorf("recharge of 0 bytes: %d", status)
	}
	ts.mustCall("POST", "/sandboxes/"+sb.ID+"/bandwidth/recharge", map[string]any{"add_bytes": 1 << 20}, &bw)
	if bw.QuotaBytes != -1 {
		t.Errorf("recharge: %+v", bw)
	}
}

func TestEgressAllowsTheRulePortOnly(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAllowlist, EgressHostLoopback: true})
	allowed, other := hostServer(t, "allowed"), hostServer(t, "other")
	sb := ts.createWith(map[string]any{"egress": []string{fmt.Sprintf("10.0.2.2:%d", allowed)}})
	if !slices.Equal(sb.Egress, []string{fmt.Sprintf("10.0.2.2:%d", allowed)}) {
		t.Fatalf("egress in force %q", sb.Egress)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", allowed); got != "allowed" {
		t.Errorf("allowed port: %q", got)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", other); !strings.Contains(got, "ERR") || !strings.Contains(got, "refused") {
		t.Errorf("other port of the same host: %q, want a refused connection", got)
	}
}

func TestEgressChangeAppliesToTheNextConnection(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAny, EgressHostLoopback: true})
	first, second := hostServer(t, "first"), hostServer(t, "second")
	sb := ts.createWith(map[string]any{"egress": []string{fmt.Sprintf("10.0.2.2:%d", first)}})
	if got := ts.fetch(sb.ID, "10.0.2.2", second); !strings.Contains(got, "ERR") {
		t.Fatalf("second before the change: %q", got)
	}
	rule := fmt.Sprintf("10.0.2.2:%d", second)
	var ev egressView
	ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", map[string]any{"egress": []string{rule}}, &ev)
	if ev.ID != sb.ID || !slices.Equal(ev.Egress, []string{rule}) {
		t.Fatalf("PUT egress: %+v", ev)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", second); got != "second" {
		t.Errorf("second after the change: %q", got)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", first); !strings.Contains(got, "ERR") {
		t.Errorf("first after the change: %q", got)
	}
	ts.mustCall("GET", "/sandboxes/"+sb.ID+"/egress", nil, &ev)
	if !slices.Equal(ev.Egress, []string{rule}) {
		t.Errorf("GET egress: %+v", ev)
	}
	// null asks for everything, which the policy "any" grants.
	ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", `{"egress": null}`, &ev)
	if !slices.Equal(ev.Egress, []string{"*"}) {
		t.Errorf("PUT null: %+v", ev)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", first); got != "first" {
		t.Errorf("first with *: %q", got)
	}
}

func TestEgressOffHasNoPath(t *testing.T) {
	ts := startServer(t, Options{Isolation: IsolationNamespaces})
	// Everything, asked for, is all that "off" allows: nothing.
	sb := ts.createWith(map[string]any{"egress": []string{"*"}})
	if !slices.Equal(sb.Egress, []string{"none"}) || sb.Network.EgressPolicy != "off" || sb.Network.Path != "none" {
		t.Fatalf("view %+v", sb)
	}
	var ev egressView
	ts.mustCall("GET", "/sandboxes/"+sb.ID+"/egress", nil, &ev)
	if !slices.Equal(ev.Egress, []string{"none"}) {
		t.Errorf("GET egress: %+v, want [none]: nothing in force", ev)
	}
	out := ts.exec(sb.ID, `ip -o link | awk -F': ' '{print $2}' | sort | tr '\n' ' '; `+fetchScript("10.0.2.2", 80))
	if !strings.HasPrefix(out.Stdout, "lo \n") && !strings.HasPrefix(out.Stdout, "lo ") {
		t.Errorf("interfaces: %q", out.Stdout)
	}
	if !strings.Contains(out.Stdout, "ERR") || !strings.Contains(out.Stdout, "unreachable") {
		t.Errorf("fetch with egress off: %q", out.Stdout)
	}
}

// failureBody is a fail envelope's data.
type failureBody struct {
	Status string `json:"status"`
	Data   struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
}

// refusedBeyondThePolicy checks that a call answered 403 EGRESS_NOT_ALLOWED
// naming the policy.
func refusedBeyondThePolicy(t *testing.T, what string, status int, body, policy string) {
	t.Helper()
	var f failureBody
	json.Unmarshal([]byte(body), &f)
	if status != http.StatusForbidden || f.Status != "fail" || f.Data.Code != "EGRESS_NOT_ALLOWED" || !strings.Contains(f.Data.Message, policy) {
		t.Errorf("%s: %d %s; want 403 EGRESS_NOT_ALLOWED naming %q", what, status, body, policy)
	}
}

// A rule the operator's policy does not allow is refused, at create and
// at PUT, and nothing changes: before, it answered 200 with "egress": []
// (with "off", any rule; with "allowlist", "*"), which every SDK reads as
// "allow all".
func TestEgressBeyondThePolicyIsRefused(t *testing.T) {
	ts := startServer(t, Options{Isolation: IsolationNamespaces})
	status, body := ts.rawCall("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "egress": []string{"*", "192.0.2.10:443"}})
	refusedBeyondThePolicy(t, "create with a rule under off", status, body, "off")
	if st, _ := ts.srv.Stats(); st.Leases != 0 {
		t.Errorf("%d leases after a refused create", st.Leases)
	}
	sb := ts.createWith(nil)
	status, body = ts.rawCall("PUT", "/sandboxes/"+sb.ID+"/egress", map[string]any{"egress": []string{"192.0.2.10:443"}})
	refusedBeyondThePolicy(t, "PUT a rule under off", status, body, "off")
	// Nothing is in force, and the view says so: not [], which every SDK
	// reads as "allow all", but ["none"], which may be asked for too.
	if !slices.Equal(sb.Egress, []string{"none"}) {
		t.Errorf("created under off: egress %q, want [none]", sb.Egress)
	}
	for _, all := range []string{`{"egress": null}`, `{"egress": []}`, `{"egress": ["*"]}`, `{}`, `{"egress": ["none"]}`} {
		var ev egressView
		ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", all, &ev)
		if !slices.Equal(ev.Egress, []string{"none"}) {
			t.Errorf("PUT %s under off: %+v, want [none]: nothing in force", all, ev)
		}
	}
}

// Under an allowlist of the operator's, asking for everything gets that
// allowlist, reported rule by rule; a lease's rule must stay within it.
func TestEgressAllowlistOfTheOperator(t *testing.T) {
	needNetwork(t)
	pinNames(t, map[string][]string{"gateway.test": {"10.0.2.2"}})
	named, cidr, other := hostServer(t, "named"), hostServer(t, "cidr"), hostServer(t, "other")
	within := []string{fmt.Sprintf("gateway.test:%d", named), fmt.Sprintf("10.0.2.0/24:%d", cidr)}
	ts := startServer(t, Options{Egress: EgressAllowlist, EgressAllow: within, EgressHostLoopback: true})
	sb := ts.createWith(map[string]any{"egress": []string{"*"}})
	if !slices.Equal(sb.Egress, within) {
		t.Fatalf("egress in force %q, want the operator's allowlist %q", sb.Egress, within)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", cidr); got != "cidr" {
		t.Errorf("within the allowlist: %q", got)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", other); !strings.Contains(got, "ERR") {
		t.Errorf("outside the allowlist: %q", got)
	}
	for _, all := range []string{`{"egress": null}`, `{"egress": []}`, `{}`} {
		var ev egressView
		ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", all, &ev)
		if !slices.Equal(ev.Egress, within) {
			t.Errorf("PUT %s: %q, want the operator's allowlist", all, ev.Egress)
		}
	}
	narrower := fmt.Sprintf("10.0.2.2:%d", cidr)
	var ev egressView
	ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", map[string]any{"egress": []string{narrower}}, &ev)
	if !slices.Equal(ev.Egress, []string{narrower}) {
		t.Errorf("a rule within: %q", ev.Egress)
	}
	for _, rule := range []string{fmt.Sprintf("10.0.2.2:%d", other), "10.0.2.2", "192.0.2.10:443"} {
		status, body := ts.rawCall("PUT", "/sandboxes/"+sb.ID+"/egress", map[string]any{"egress": []string{rule}})
		refusedBeyondThePolicy(t, "PUT "+rule, status, body, "allowlist")
	}
	ts.mustCall("GET", "/sandboxes/"+sb.ID+"/egress", nil, &ev)
	if !slices.Equal(ev.Egress, []string{narrower}) {
		t.Errorf("after refused PUTs: %q, want the rule last granted", ev.Egress)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", other); !strings.Contains(got, "ERR") {
		t.Errorf("a refused rule is in force: %q", got)
	}
	if _, err := New(Options{InsecureNoAuth: true, Root: t.TempDir(), Egress: EgressAny, EgressAllow: within}); err == nil {
		t.Error("an operator's allowlist under the policy any was accepted")
	}
}

func TestEgressAllowlistPolicyGivesNothingForAll(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAllowlist, EgressHostLoopback: true})
	port := hostServer(t, "hello")
	sb := ts.createWith(map[string]any{"egress": []string{"*"}})
	if !slices.Equal(sb.Egress, []string{"none"}) || sb.Network.Path != "slirp4netns" {
		t.Fatalf("view %+v, want egress [none]", sb)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", port); !strings.Contains(got, "ERR") {
		t.Errorf("fetch: %q", got)
	}
}

// ["none"] asks for nothing, under a policy that would give everything.
func TestEgressNoneGivesNothing(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAny, EgressHostLoopback: true})
	port := hostServer(t, "hello")
	sb := ts.createWith(map[string]any{"egress": []string{"*"}})
	if got := ts.fetch(sb.ID, "10.0.2.2", port); got != "hello" {
		t.Fatalf("with *: %q", got)
	}
	var ev egressView
	ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", map[string]any{"egress": []string{"none"}}, &ev)
	if !slices.Equal(ev.Egress, []string{"none"}) {
		t.Errorf("PUT [none]: %q", ev.Egress)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", port); !strings.Contains(got, "ERR") {
		t.Errorf("with none: %q", got)
	}
}

func TestEgressHostLoopbackIsClosedByDefault(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAny})
	port := hostServer(t, "hello")
	sb := ts.createWith(nil)
	if !slices.Equal(sb.Egress, []string{"*"}) {
		t.Fatalf("egress %q", sb.Egress)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", port); !strings.Contains(got, "ERR") {
		t.Errorf("the host's loopback is reachable: %q", got)
	}
}

func TestLeaseCannotChangeItsNetwork(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAllowlist})
	sb := ts.createWith(map[string]any{"egress": []string{"192.0.2.1:443"}})
	out := ts.exec(sb.ID, `ip link set lo up; echo "rc=$?"; ip link set tap0 down; echo "rc=$?"`)
	if strings.Contains(out.Stdout, "rc=0") {
		t.Errorf("the lease changed its network: %q %q", out.Stdout, out.Stderr)
	}
}

func TestEgressBadRulesAreRefusedBeforeCreate(t *testing.T) {
	ts := startServer(t, Options{})
	for _, rule := range []string{"", "host:", "host:0", "host:65536", "10.0.0.0/33", "a b", "fe80::1%eth0", strings.Repeat("a", 400)} {
		if status := ts.call("POST", "/sandboxes", map[string]any{"shape": "s-1vcpu-1gb", "egress": []string{rule}}, nil); status != http.StatusBadRequest {
			t.Errorf("rule %q: %d, want 400", rule, status)
		}
	}
	if st, _ := ts.srv.Stats(); st.Leases != 0 {
		t.Errorf("%d leases after bad creates", st.Leases)
	}
}

func TestEgressPolicyIsChecked(t *testing.T) {
	_, err := New(Options{InsecureNoAuth: true, Root: t.TempDir(), Egress: "some"})
	if err == nil || !strings.Contains(err.Error(), "unknown egress policy") {
		t.Errorf("unknown policy: %v", err)
	}
	_, err = New(Options{InsecureNoAuth: true, Root: t.TempDir(), Egress: EgressAny, Slirp4netns: "", IngressDomain: "bad domain"})
	if err == nil || !strings.Contains(err.Error(), "ingress domain") {
		t.Errorf("bad ingress domain: %v", err)
	}
}

func TestEgressHostAndCIDRRules(t *testing.T) {
	needNetwork(t)
	orig := network.Resolver
	t.Cleanup(func() { network.Resolver = orig })
	network.Resolver = func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host == "gateway.test" {
			return []netip.Addr{netip.MustParseAddr("10.0.2.2")}, nil
		}
		return nil, errors.New("no such host")
	}
	ts := startServer(t, Options{Egress: EgressAllowlist, EgressHostLoopback: true})
	named, cidr, other := hostServer(t, "named"), hostServer(t, "cidr"), hostServer(t, "other")
	sb := ts.createWith(map[string]any{"egress": []string{fmt.Sprintf("gateway.test:%d", named), fmt.Sprintf("10.0.2.0/24:%d", cidr)}})
	if got := ts.fetch(sb.ID, "10.0.2.2", named); got != "named" {
		t.Errorf("the resolved host's port: %q", got)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", cidr); got != "cidr" {
		t.Errorf("the CIDR's port: %q", got)
	}
	if got := ts.fetch(sb.ID, "10.0.2.2", other); !strings.Contains(got, "ERR") {
		t.Errorf("a port no rule names: %q", got)
	}
}

// An established connection keeps going when its rule goes; a new one
// follows the new rules.
func TestEgressChangeSparesEstablishedConnections(t *testing.T) {
	needNetwork(t)
	ts := startServer(t, Options{Egress: EgressAllowlist, EgressHostLoopback: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // a line echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	sb := ts.createWith(map[string]any{"egress": []string{fmt.Sprintf("10.0.2.2:%d", port)}})
	pid := ts.startProcess(sb.ID, fmt.Sprintf(`exec python3 -c '
import os, socket, time
s = socket.create_connection(("10.0.2.2", %d), timeout=10)
s.sendall(b"before\n"); print(s.recv(100).decode().strip(), flush=True)
while not os.path.exists("/workspace/gate"):
    time.sleep(0.005)
s.sendall(b"after\n"); print(s.recv(100).decode().strip(), flush=True)
try:
    socket.create_connection(("10.0.2.2", %d), timeout=10); print("new: connected")
except Exception as e:
    print("new:", type(e).__name__)
'`, port, port))
	st := ts.connect(sb.ID, pid, 0)
	if ev, ok := st.next(false); !ok || ev.Type != "data" {
		t.Fatalf("first frame %+v", ev)
	}
	ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", map[string]any{"egress": []string{"10.0.2.2:1"}}, nil)
	ts.openGate(sb.ID)
	out := st.drain(1)
	if got := out.stdout.String(); got != "after\nnew: ConnectionRefusedError\n" {
		t.Errorf("after the change: %q (stderr %q)", got, out.stderr.String())
	}
}
