package localsandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/machine"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
)

// The leases' networks, as the server sets them up: the operator's egress
// policy, what a create asks, and the view. Package network does the work
// (namespaces, slirp4netns, the nftables egress table, the preview proxy);
// NETWORK.md says what a lease gets.

// EgressPolicy is the operator's cap on the leases' outward network. A
// lease asking for everything (["*"], [], null or nothing: the CreateOS
// API's "allow all") gets all the cap allows; a rule beyond the cap is
// refused (403 EGRESS_NOT_ALLOWED), never stored as nothing:
//
//	off        no outward path at all: loopback only (the default); "all"
//	           is nothing, any rule is refused
//	allowlist  with Options.EgressAllow, "all" is those rules and a lease's
//	           rule must be within one of them; without, "all" is nothing
//	           and a lease may name any destination
//	any        whatever the lease asks; "all" is everything
type EgressPolicy string

const (
	// EgressOff gives leases no outward network (loopback only).
	EgressOff EgressPolicy = "off"
	// EgressAllowlist gives leases the destinations their rules name
	// (within Options.EgressAllow, when set), and never "*".
	EgressAllowlist EgressPolicy = "allowlist"
	// EgressAny gives leases what they ask for, "*" included.
	EgressAny EgressPolicy = "any"
)

// SplitList splits a flag's comma-separated list (--egress-allow,
// --dns-upstream) into its items, spaces around each and empty ones
// dropped: "a:443, b:443," is two rules.
func SplitList(v string) []string {
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// egressGrant is what the operator's options let a lease have.
func (o *Options) egressGrant() network.Grant {
	g := network.Grant{Policy: string(o.Egress)}
	switch o.Egress {
	case EgressAny:
		g.All, g.Rules = true, true
	case EgressAllowlist:
		g.Rules, g.Within = true, o.EgressAllow
	}
	return g
}

// compileEgress parses the rules a client asked for, checks them against
// the operator's policy and resolves the host names of what is granted.
// Bad rules are a 400 whatever the policy, rules beyond it a 403.
func (s *Server) compileEgress(ctx context.Context, requested []string) (network.Egress, error) {
	set, err := network.Compile(ctx, requested, s.opts.egressGrant())
	var (
		ie *network.InputError
		ce *network.CapError
	)
	switch {
	case errors.As(err, &ie):
		return network.Egress{}, badRequest(ie.Format, ie.Args...)
	case errors.As(err, &ce):
		return network.Egress{}, withCode(egressNotAllowed, &apiError{http.StatusForbidden, clipRule(ce)})
	}
	return set, err
}

// egressNotAllowed is the machine code of a rule beyond the operator's
// policy (data.code of the 403).
const egressNotAllowed = "EGRESS_NOT_ALLOWED"

// clipRule is ce's message with its rule cut to maxEcho bytes.
func clipRule(ce *network.CapError) string {
	c := *ce
	c.Rule = clip(c.Rule, maxEcho)
	return c.Error()
}

// netSpec is what a create asks of the network.
type netSpec struct {
	egress  network.Egress
	ingress bool
}

// networkDefaults checks the network options (called by withDefaults).
func (o *Options) networkDefaults() error {
	switch o.Egress {
	case "":
		o.Egress = EgressOff
	case EgressOff, EgressAllowlist, EgressAny:
	default:
		return fmt.Errorf("localsandbox: unknown egress policy %q (off, allowlist or any)", o.Egress)
	}
	// No domain: preview URLs are addresses (the lease's preview address),
	// and the host names under localhost are served too.
	o.previewByHost = o.IngressDomain != ""
	if o.IngressDomain == "" {
		o.IngressDomain = "localhost"
	}
	if o.MaxIngressRequests < 0 || o.MaxIngressRequestsPerLease < 0 || o.MaxEgressConnections < 0 {
		return errors.New("localsandbox: network limits must not be negative")
	}
	if o.MaxEgressConnections == 0 {
		o.MaxEgressConnections = DefaultMaxEgressConnections
	}
	if o.MaxIngressRequests == 0 {
		o.MaxIngressRequests = max(1, o.MaxConnectionsPerAddress/2)
	}
	if o.MaxIngressRequestsPerLease == 0 {
		o.MaxIngressRequestsPerLease = min(DefaultMaxIngressRequestsPerLease, o.MaxIngressRequests)
	}
	o.IngressDomain = strings.ToLower(strings.TrimSuffix(o.IngressDomain, "."))
	if !network.ValidHostName(o.IngressDomain) {
		return fmt.Errorf("localsandbox: ingress domain %q is not a host name", o.IngressDomain)
	}
	if len(o.EgressAllow) > 0 && o.Egress != EgressAllowlist {
		return fmt.Errorf("localsandbox: EgressAllow (--egress-allow) needs the allowlist policy, not %s", o.Egress)
	}
	if err := network.CheckRules(o.EgressAllow); err != nil {
		return fmt.Errorf("localsandbox: EgressAllow: %w", err)
	}
	if o.Egress == EgressOff {
		return nil
	}
	upstream, err := network.DNSUpstream(o.DNSUpstream)
	if err != nil {
		return fmt.Errorf("localsandbox: %w", err)
	}
	o.DNSUpstream = upstream
	if os.Geteuid() != 0 {
		return fmt.Errorf("localsandbox: egress %s needs a server running as root (it makes the leases' network namespaces)", o.Egress)
	}
	if o.Slirp4netns == "" {
		p, err := exec.LookPath("slirp4netns")
		if err != nil {
			return fmt.Errorf("localsandbox: egress %s needs slirp4netns (apt-get install slirp4netns): %w", o.Egress, err)
		}
		o.Slirp4netns = p
	}
	return nil
}

// networkAvailable reports whether this server makes its leases' network
// namespaces (and so can give them egress and ingress).
func (s *Server) networkAvailable() bool {
	return s.isolation == IsolationNamespaces && os.Geteuid() == 0
}

// netSpec checks the network fields of a create.
func (s *Server) netSpec(ctx context.Context, egress []string, ingress bool) (netSpec, error) {
	if ingress && !s.networkAvailable() {
		return netSpec{}, badRequest("ingress needs namespace isolation and a server running as root")
	}
	set, err := s.compileEgress(ctx, egress)
	if err != nil {
		return netSpec{}, err
	}
	return netSpec{egress: set, ingress: ingress}, nil
}

// newLeaseNet makes the network namespace of a lease (nil when the server
// cannot: the init then makes its own), with loopback up, the egress
// table in place and, unless egress is off, slirp4netns attached and in
// the lease's cgroup cg (when it has one).
func (s *Server) newLeaseNet(l *lease, spec netSpec, cg machine.Cgroup) (*network.Net, error) {
	if !s.networkAvailable() {
		return nil, nil
	}
	cfg := network.Config{HostLoopback: s.opts.EgressHostLoopback, MaxFlows: s.opts.MaxEgressConnections,
		Marker: rootMarkerEnv + "=" + s.opts.Root, Cgroup: cg, Agent: s.selfAPI(l)}
	if s.opts.Egress != EgressOff {
		cfg.Slirp4netns, cfg.DNSUpstream = s.opts.Slirp4netns, s.opts.DNSUpstream
	}
	n, err := network.New(cfg, spec.egress, spec.ingress)
	if err != nil {
		return nil, err
	}
	if spec.ingress {
		if err := s.setIngress(l, n, true); err != nil {
			n.Close()
			return nil, err
		}
	}
	if cfg.Slirp4netns == "" {
		return n, nil
	}
	// Name lookups go to the server's filter (network.DNSAddr), the only
	// resolver the lease can reach unless its egress is "*".
	if err := s.machineSpec(l).WriteRootFile("/etc/resolv.conf", []byte(network.ResolvConf)); err != nil {
		n.Close()
		return nil, fmt.Errorf("the lease's resolv.conf: %w", err)
	}
	return n, nil
}

// networkView is the [ext] network part of a sandbox view.
type networkView struct {
	// EgressPolicy is the operator's cap (off, allowlist, any).
	EgressPolicy EgressPolicy `json:"egress_policy"`
	// Path is the outward path: "slirp4netns", "host" (process-group
	// isolation: no network isolation at all) or "none".
	Path string `json:"path"`
	// BytesOut and BytesIn count what crossed the outward interface.
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
}

// network returns the lease's network, or nil. A fork is viewed (and its
// egress set) while it starts, so the field is read under the lease's lock.
func (l *lease) network() *network.Net {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.net
}

// networkView describes l's network; egress is the list in force.
func (s *Server) networkView(l *lease) (egress []string, ingress bool, v *networkView) {
	v = &networkView{EgressPolicy: s.opts.Egress, Path: "none"}
	n := l.network()
	switch {
	case l.isolation != IsolationNamespaces:
		v.Path = "host"
		return []string{network.EgressAll}, false, v
	case n == nil:
		return []string{network.EgressNone}, false, v
	}
	set, ingress, outward := n.State()
	egress = set.List()
	if outward {
		v.Path = "slirp4netns"
		if m, _ := l.parts(); m != nil {
			if c, ok := network.ReadCounters(m.Pid()); ok {
				v.BytesIn, v.BytesOut = c.Rx, c.Tx
			}
		}
	}
	return egress, ingress, v
}

// addNetworkView fills the network fields of l's view.
func (s *Server) addNetworkView(l *lease, v *sandboxView) {
	egress, ingress, network := s.networkView(l)
	v.Egress, v.IngressEnabled, v.Network = &egress, ingress, network
	if ingress {
		v.IngressURLTemplate = s.ingressTemplate(l)
	}
}
