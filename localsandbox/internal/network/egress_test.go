package network

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseEgressRule(t *testing.T) {
	for _, c := range []struct {
		in     string
		host   string
		prefix string
		port   uint16
	}{
		{"api.openai.com:443", "api.openai.com", "", 443},
		{"API.Anthropic.com", "api.anthropic.com", "", 0},
		{"10.1.2.3:80", "", "10.1.2.3/32", 80},
		{"10.1.2.3", "", "10.1.2.3/32", 0},
		{"10.0.0.0/8", "", "10.0.0.0/8", 0},
		{"10.9.9.9/8:53", "", "10.0.0.0/8", 53},
		{"[2001:db8::1]:443", "", "2001:db8::1/128", 443},
		{"2001:db8::/32", "", "2001:db8::/32", 0},
	} {
		r, err := parseRule(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		prefix := ""
		if len(r.prefixes) == 1 {
			prefix = r.prefixes[0].String()
		}
		if r.host != c.host || prefix != c.prefix || r.port != c.port {
			t.Errorf("%q: host %q prefix %q port %d", c.in, r.host, prefix, r.port)
		}
	}
}

// The grants of the server's policies (localsandbox.EgressPolicy).
var (
	grantOff       = Grant{Policy: "off"}
	grantAllowlist = Grant{Policy: "allowlist", Rules: true}
	grantAny       = Grant{Policy: "any", All: true, Rules: true}
	grantWithin    = Grant{Policy: "allowlist", Rules: true, Within: []string{"pypi.example", "10.0.0.0/8:443", "[2001:db8::1]:53"}}
)

// Asking for everything ("*", [] or nil) gets all the policy allows; a
// rule beyond it is a *CapError, never dropped (before: a rule under
// "off" and "*" under "allowlist" became nothing, answered 200 []).
func TestCompileGrantsAndResolves(t *testing.T) {
	orig := Resolver
	t.Cleanup(func() { Resolver = orig })
	Resolver = func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host == "pypi.example" {
			return []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")}, nil
		}
		return nil, errors.New("no such host")
	}
	ctx := context.Background()
	none := []string{EgressNone} // nothing in force, never [] ("allow all" to the SDKs)
	for _, c := range []struct {
		grant     Grant
		requested []string
		want      []string // nil: refused, a *CapError
	}{
		{grantOff, nil, none},
		{grantOff, []string{}, none},
		{grantOff, []string{"*"}, none},
		{grantOff, none, none}, // asking for nothing is within every policy
		{grantOff, []string{"pypi.example:443"}, nil},
		{grantOff, []string{"*", "10.9.8.7:443"}, nil},
		{grantAllowlist, nil, none},
		{grantAllowlist, []string{"*"}, none},
		{grantAllowlist, []string{"*", "pypi.example:443"}, []string{"pypi.example:443"}},
		{grantAllowlist, []string{"192.0.2.1:22"}, []string{"192.0.2.1:22"}},
		{grantWithin, nil, grantWithin.Within},
		{grantWithin, []string{"*"}, grantWithin.Within},
		{grantWithin, []string{"PyPI.example.:443", "10.1.2.0/24:443", "10.3.4.5:443", "[2001:db8::1]:53"},
			[]string{"PyPI.example.:443", "10.1.2.0/24:443", "10.3.4.5:443", "[2001:db8::1]:53"}},
		{grantWithin, []string{"*", "10.3.4.5:443"}, append(slices.Clone(grantWithin.Within), "10.3.4.5:443")},
		{grantWithin, []string{"other.example:443"}, nil},
		{grantWithin, []string{"10.3.4.5:80"}, nil},    // another port
		{grantWithin, []string{"10.3.4.5"}, nil},       // every port, wider than 443
		{grantWithin, []string{"10.0.0.0/7:443"}, nil}, // a wider prefix
		{grantWithin, []string{"192.0.2.7:443"}, nil},  // pypi.example's address, not its name
		{grantAny, none, none},
		{grantAny, nil, []string{"*"}},
		{grantAny, []string{}, []string{"*"}},
		{grantAny, []string{"pypi.example:443", "*"}, []string{"*"}},
		{grantAny, []string{"pypi.example:443", "pypi.example:443"}, []string{"pypi.example:443"}},
	} {
		set, err := Compile(ctx, c.requested, c.grant)
		if c.want == nil {
			var ce *CapError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.grant.Policy) && !ce.Within {
				t.Errorf("%+v %q: %q, %v; want a *CapError naming the policy", c.grant, c.requested, set.List(), err)
			}
			continue
		}
		if err != nil || !slices.Equal(set.List(), c.want) {
			t.Errorf("%+v %q: %q, %v; want %q", c.grant, c.requested, set.List(), err, c.want)
		}
	}
	set, err := Compile(ctx, []string{"pypi.example:443"}, grantAllowlist)
	if err != nil || len(set.rules) != 1 || len(set.rules[0].prefixes) != 2 {
		t.Fatalf("resolved %+v, %v", set, err)
	}
	var ie *InputError
	if _, err := Compile(ctx, []string{"nowhere.example:443"}, grantAllowlist); !errors.As(err, &ie) {
		t.Errorf("an unresolvable host: %v", err)
	}
	if _, err := Compile(ctx, []string{"not a rule"}, grantOff); !errors.As(err, &ie) {
		t.Errorf("a bad rule under off: %v, want an *InputError first", err)
	}
	if err := CheckRules([]string{"pypi.example", "*"}); err == nil {
		t.Error("an operator's allowlist holding *")
	}
}
