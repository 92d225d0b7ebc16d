package network

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Egress: which outward connections a lease may open.
//
//	PUT /v1/sandboxes/{id}/egress {"egress": ["pypi.org:443", "10.0.0.0/8", "github.com"]}
//	GET /v1/sandboxes/{id}/egress → {"id": "sb-…", "egress": [...in force...]}
//
// A rule is "*" (everything), "host:port", a bare "host" (every port), an
// IP literal with or without a port ("[::1]:443" for IPv6 with a port), or
// a CIDR with or without a port ("10.0.0.0/8", "10.0.0.0/8:443"). Host
// names are resolved when the rules are set (at create or PUT), not when a
// connection is made: a rule follows its name only when it is set again.
// A port rule admits TCP and UDP.
//
// The rules are enforced by the kernel: an nftables table in the lease's
// network namespace (table inet sandboxd, chain egress on the output hook)
// accepts loopback (where the lease's resolver, the server's filter,
// listens: dns.go), the replies of established connections and the
// destinations of the rules; everything else is rejected at once (a TCP
// reset, ICMP administratively prohibited), so a refused connect fails
// fast rather than timing out. A new rule set replaces the table in one
// netlink transaction: it applies to the next connection, while
// established ones keep their state. The namespace is owned by the host's
// user namespace (network.go), so the lease's root has no CAP_NET_ADMIN
// over it and cannot change the table.
//
// The operator's policy (localsandbox.Options.Egress, sandboxd --egress)
// caps what a lease gets: Compile grants it what the policy's Grant says.
//
// Views report the egress in force, which is explicit: ["*"] is
// everything, [] nothing (never the API's "empty means all").

// Egress rule limits.
const (
	maxEgressRules     = 256
	maxEgressRuleBytes = 300
	resolveTimeout     = 5 * time.Second
)

// EgressAll is the rule that admits everything.
const EgressAll = "*"

// EgressNone is what a list with nothing in force reads as, and the rule
// that asks for nothing. In the SDKs' vocabulary an empty list means
// "allow all", so a lease with no egress (a server whose policy gives
// nothing) must not be shown as [] ([ext]: the hosted service has no
// word for it). Asking for nothing is within every policy.
const EgressNone = "none"

// rule is one parsed rule: a set of destination prefixes and a port (0 =
// every port).
type rule struct {
	text     string
	host     string // a name to resolve, or ""
	prefixes []netip.Prefix
	port     uint16
}

// InputError is a request the API refuses (400): its message is Format
// with Args, values of the request among them (which the API clips when it
// quotes them).
type InputError struct {
	Format string
	Args   []any
}

func (e *InputError) Error() string { return fmt.Sprintf(e.Format, e.Args...) }

func badRequest(format string, args ...any) *InputError { return &InputError{format, args} }

// parseRule parses one rule (not "*").
func parseRule(text string) (rule, error) {
	r := rule{text: text}
	bad := func(why string) (rule, error) {
		return rule{}, badRequest("egress rule %q: %s", text, why)
	}
	if text == "" || len(text) > maxEgressRuleBytes {
		return bad(fmt.Sprintf("must be 1 to %d bytes", maxEgressRuleBytes))
	}
	hostPart, portPart := text, ""
	if slash := strings.IndexByte(text, '/'); slash >= 0 {
		if c := strings.IndexByte(text[slash:], ':'); c >= 0 {
			hostPart, portPart = text[:slash+c], text[slash+c+1:]
		}
		p, err := netip.ParsePrefix(hostPart)
		if err != nil {
			return bad("not a CIDR")
		}
		r.prefixes = []netip.Prefix{p.Masked()}
	} else {
		if h, p, err := net.SplitHostPort(text); err == nil {
			hostPart, portPart = h, p
		} else if strings.Count(text, ":") == 1 {
			return bad("port missing or malformed")
		}
		hostPart = strings.TrimSuffix(strings.TrimPrefix(hostPart, "["), "]")
		if ip, err := netip.ParseAddr(hostPart); err == nil {
			if ip.Zone() != "" {
				return bad("zones are not allowed")
			}
			r.prefixes = []netip.Prefix{netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())}
		} else if ValidHostName(hostPart) {
			r.host = strings.ToLower(strings.TrimSuffix(hostPart, "."))
		} else {
			return bad("not a host name, an IP address or a CIDR")
		}
	}
	if portPart != "" || strings.HasSuffix(text, ":") {
		port, err := strconv.ParseUint(portPart, 10, 16)
		if err != nil || port == 0 {
			return bad("the port must be 1 to 65535")
		}
		r.port = uint16(port)
	}
	return r, nil
}

// ValidHostName reports whether h is a DNS name (letters, digits, '-' and
// '_', dot-separated labels of at most 63 bytes).
func ValidHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Egress is a lease's egress in force: every destination ("*"), or the
// rules, resolved. The zero value is nothing.
type Egress struct {
	all   bool
	rules []rule
}

// List is the egress in force as the API reports it.
func (e Egress) List() []string {
	if e.all {
		return []string{EgressAll}
	}
	if e.none() {
		return []string{EgressNone}
	}
	out := make([]string, 0, len(e.rules))
	for _, r := range e.rules {
		out = append(out, r.text)
	}
	return out
}

// All reports whether every destination may be reached.
func (e Egress) All() bool { return e.all }

// none reports whether nothing may go out.
func (e Egress) none() bool { return !e.all && len(e.rules) == 0 }

// Resolver resolves the host names of rules; tests replace it.
var Resolver = func(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// Grant is what the operator's policy lets a lease have, and what asking
// for everything ("*", or no rule at all, as the API reads it) gives:
//
//	All     everything
//	Rules   the destinations the lease names; with Within, only those
//	        within the operator's rules, and "*" gives those rules
//	neither nothing; a rule is refused
//
// Policy names the operator's policy in refusals.
type Grant struct {
	Policy     string
	All, Rules bool
	Within     []string
}

// CapError is a rule the operator's policy does not allow (403 at the
// API): refused, never stored as nothing.
type CapError struct {
	Rule, Policy string
	Within       bool // the policy has rules of its own (Grant.Within)
}

func (e *CapError) Error() string {
	switch {
	case e.Within:
		return fmt.Sprintf("egress rule %q is not within this server's egress allowlist (--egress allowlist --egress-allow …)", e.Rule)
	case e.Policy == "off" || e.Policy == "":
		return fmt.Sprintf("egress rule %q: this server's egress policy is off (--egress off): sandboxes have no outward network", e.Rule)
	}
	return fmt.Sprintf("egress rule %q is not allowed by this server's egress policy (--egress %s)", e.Rule, e.Policy)
}

// CheckRules checks the operator's own rules (Grant.Within): each a rule
// as a lease's, "*" excluded.
func CheckRules(rules []string) error {
	if len(rules) > maxEgressRules {
		return badRequest("at most %d egress rules", maxEgressRules)
	}
	for _, text := range rules {
		if text == EgressAll || text == EgressNone {
			return badRequest("%q is not a rule of an allowlist", text)
		}
		if _, err := parseRule(text); err != nil {
			return err
		}
	}
	return nil
}

// within reports whether every destination of r is one of c's: the same
// name, or addresses inside c's prefix; c's port or every port.
func (r rule) within(c rule) bool {
	if c.port != 0 && c.port != r.port {
		return false
	}
	if r.host != "" || c.host != "" {
		return r.host == c.host
	}
	for _, p := range r.prefixes {
		if p.Bits() < c.prefixes[0].Bits() || !c.prefixes[0].Contains(p.Addr()) {
			return false
		}
	}
	return true
}

// Compile parses the rules a client asked for, checks them against what g
// grants and resolves the host names of what is granted. Bad rules are an
// *InputError, rules beyond g a *CapError; asking for everything gets all
// that g grants (g.Within under an allowlist of the operator's, nothing
// under one without). Nothing asked for is ever silently dropped.
func Compile(ctx context.Context, requested []string, g Grant) (Egress, error) {
	if len(requested) > maxEgressRules {
		return Egress{}, badRequest("at most %d egress rules", maxEgressRules)
	}
	var (
		set  Egress
		seen = map[string]bool{}
	)
	add := func(r rule) {
		if !seen[r.text] {
			seen[r.text] = true
			set.rules = append(set.rules, r)
		}
	}
	if len(requested) == 1 && requested[0] == EgressNone {
		return Egress{}, nil
	}
	wantAll := len(requested) == 0
	var asked []rule
	for _, text := range requested {
		if text == EgressAll {
			wantAll = true
			continue
		}
		r, err := parseRule(text)
		if err != nil {
			return Egress{}, err
		}
		asked = append(asked, r)
	}
	var within []rule
	for _, text := range g.Within {
		r, err := parseRule(text)
		if err != nil {
			return Egress{}, err
		}
		within = append(within, r)
	}
	for _, r := range asked {
		allowed := g.All || g.Rules && len(within) == 0
		for _, c := range within {
			allowed = allowed || r.within(c)
		}
		if !allowed {
			return Egress{}, &CapError{Rule: r.text, Policy: g.Policy, Within: len(within) > 0}
		}
	}
	if wantAll && g.All {
		return Egress{all: true}, nil
	}
	if wantAll {
		for _, c := range within {
			add(c)
		}
	}
	for _, r := range asked {
		add(r)
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	for i := range set.rules {
		r := &set.rules[i]
		if r.host == "" {
			continue
		}
		addrs, err := Resolver(ctx, r.host)
		if err != nil || len(addrs) == 0 {
			return Egress{}, badRequest("egress rule %q: %s does not resolve", r.text, r.host)
		}
		for _, a := range addrs {
			a = a.Unmap()
			r.prefixes = append(r.prefixes, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return set, nil
}

// The nftables objects of a lease's egress.
const (
	egressTable = "sandboxd"
	egressChain = "egress"
)

// applyEgress replaces the egress table of the network namespace netns
// with set, and a cap of maxFlows flows, in one transaction.
func applyEgress(netns int, set Egress, maxFlows int) error {
	c, err := nftables.New(nftables.WithNetNSFd(netns))
	if err != nil {
		return fmt.Errorf("egress rules: %w", err)
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: egressTable}
	// Add then delete: the delete cannot fail on a missing table, and the
	// new table replaces the old one atomically.
	c.AddTable(table)
	c.DelTable(table)
	c.AddTable(table)
	drop := nftables.ChainPolicyDrop
	chain := c.AddChain(&nftables.Chain{
		Name: egressChain, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop,
	})
	add := func(exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: exprs})
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	// Loopback, and the replies of what was allowed.
	add(&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")}, accept)
	add(&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
			Xor:  make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)}, accept)
	// A new flow past the cap is refused: conntrack counts the namespace's
	// flows (a closed TCP connection drops out at once, UDP when it times
	// out). Each is a socket of slirp4netns on the host. Only new flows
	// count: the kernel's own untracked packets (IPv6 neighbour discovery
	// on tap0) neither hold a place nor get refused.
	newFlowOver := func(then ...expr.Any) []expr.Any {
		return append([]expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			&expr.Connlimit{Count: uint32(maxFlows), Flags: expr.NFT_CONNLIMIT_F_INV},
		}, then...)
	}
	add(newFlowOver(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})...)
	add(newFlowOver(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})...)
	switch {
	case set.all:
		add(accept)
	case !set.none():
		for _, r := range set.rules {
			for _, p := range r.prefixes {
				if r.port == 0 {
					add(append(matchDest(p, 0, 0), accept)...)
					continue
				}
				for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
					add(append(matchDest(p, proto, r.port), accept)...)
				}
			}
		}
	}
	// The rest is refused at once, not dropped: a connect fails fast.
	add(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	add(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress rules: %w", err)
	}
	return nil
}

// matchDest matches packets to prefix p and, with proto, to port.
func matchDest(p netip.Prefix, proto byte, port uint16) []expr.Any {
	family, offset := byte(unix.NFPROTO_IPV4), uint32(16)
	if p.Addr().Is6() {
		family, offset = unix.NFPROTO_IPV6, 24
	}
	size := uint32(p.Addr().BitLen() / 8)
	mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{family}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: mask, Xor: make([]byte, size)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
	}
	if proto != 0 {
		out = append(out,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
		)
	}
	return out
}

// ifname is an interface name as nftables compares it.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}
