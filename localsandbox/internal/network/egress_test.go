package network

import (
	"context"
	"errors"
	"net/netip"
	"slices"
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
	grantOff       = Grant{}
	grantAllowlist = Grant{Rules: true}
	grantAny       = Grant{All: true, Rules: true}
)

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
	for _, c := range []struct {
		grant     Grant
		requested []string
		want      []string
	}{
		{grantOff, []string{"*"}, []string{}},
		{grantOff, []string{"pypi.example:443"}, []string{}},
		{grantAllowlist, nil, []string{}},
		{grantAllowlist, []string{"*", "pypi.example:443"}, []string{"pypi.example:443"}},
		{grantAny, nil, []string{"*"}},
		{grantAny, []string{"pypi.example:443", "*"}, []string{"*"}},
		{grantAny, []string{"pypi.example:443", "pypi.example:443"}, []string{"pypi.example:443"}},
	} {
		set, err := Compile(ctx, c.requested, c.grant)
		if err != nil || !slices.Equal(set.List(), c.want) {
			t.Errorf("%+v %q: %q, %v; want %q", c.grant, c.requested, set.List(), err, c.want)
		}
	}
	set, err := Compile(ctx, []string{"pypi.example:443"}, grantAllowlist)
	if err != nil || len(set.rules) != 1 || len(set.rules[0].prefixes) != 2 {
		t.Fatalf("resolved %+v, %v", set, err)
	}
	if _, err := Compile(ctx, []string{"nowhere.example:443"}, grantAllowlist); err == nil {
		t.Error("an unresolvable host was accepted")
	}
}
