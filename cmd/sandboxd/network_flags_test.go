package main

import (
	"io"
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
	if o.Egress != localsandbox.EgressOff || o.IngressPublic || o.IngressDomain != "localhost" {
		t.Errorf("defaults %+v", o)
	}
	c, err = parseFlags([]string{"--insecure-no-auth", "--egress", "allowlist", "--ingress-public", "--ingress-domain", "preview.test"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c.network.apply(&o)
	if o.Egress != localsandbox.EgressAllowlist || !o.IngressPublic || o.IngressDomain != "preview.test" {
		t.Errorf("flags %+v", o)
	}
}
