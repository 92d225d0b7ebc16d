package main

import (
	"io"
	"slices"
	"testing"

	"github.com/sandboxflow/sandboxflow/localsandbox"
)

func TestNetworkFlagsDefaultToNoEgressAndLoopbackPreviews(t *testing.T) {
	c, err := parseFlags([]string{"--insecure-no-auth"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var o localsandbox.Options
	c.network.apply(&o)
	if o.Egress != localsandbox.EgressOff || o.IngressPublic || o.DNSUpstream != nil || o.EgressAllow != nil || o.IngressDomain != "" ||
		o.MaxIngressRequests != 0 || o.MaxIngressRequestsPerLease != 0 || o.MaxEgressConnections != localsandbox.DefaultMaxEgressConnections {
		t.Errorf("defaults %+v", o)
	}
	c, err = parseFlags([]string{"--insecure-no-auth", "--egress", "allowlist", "--ingress-public", "--ingress-domain", "preview.test",
		"--max-ingress-requests", "100", "--max-ingress-requests-per-sandbox", "10", "--max-egress-connections", "50",
		"--dns-upstream", "192.0.2.53,127.0.0.1:5353", "--egress-allow", "pypi.org:443, 10.0.0.0/8,"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c.network.apply(&o)
	if o.Egress != localsandbox.EgressAllowlist || !o.IngressPublic || o.IngressDomain != "preview.test" ||
		o.MaxIngressRequests != 100 || o.MaxIngressRequestsPerLease != 10 || o.MaxEgressConnections != 50 ||
		!slices.Equal(o.DNSUpstream, []string{"192.0.2.53", "127.0.0.1:5353"}) || !slices.Equal(o.EgressAllow, []string{"pypi.org:443", "10.0.0.0/8"}) {
		t.Errorf("flags %+v", o)
	}
}
