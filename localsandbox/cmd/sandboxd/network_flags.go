package main

import (
	"flag"

	"github.com/sandboxflow/sandboxflow/localsandbox"
)

// networkFlags configure the leases' network (localsandbox/network.go).
//
//	sandboxd --egress allowlist      # leases reach what their egress rules name
//	sandboxd --egress any            # leases reach anything (rules still apply)
//	sandboxd --ingress-public        # preview URLs on a non-loopback --listen too
type networkFlags struct {
	egress        string
	ingressPublic bool
	ingressDomain string
	egressAllow   string
	dnsUpstream   string

	maxIngress, maxIngressPerSandbox, maxEgressConnections int
}

func (n *networkFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.egress, "egress", "off", "the leases' outward network: off (loopback only), allowlist (only explicit egress rules) or any; other than off needs root and slirp4netns")
	fs.StringVar(&n.egressAllow, "egress-allow", "", "with --egress allowlist: comma-separated rules a sandbox's rules must stay within; a sandbox asking for everything gets them (default: none, a sandbox may name any destination and everything gives nothing)")
	fs.StringVar(&n.dnsUpstream, "dns-upstream", "", "comma-separated resolvers (IP[:port]) a sandbox whose egress is * sends its name lookups to (default: the host's /etc/resolv.conf nameservers); a sandbox with rules resolves only their names, answered by sandboxd")
	fs.BoolVar(&n.ingressPublic, "ingress-public", false, "serve preview URLs, which carry no API key, on a non-loopback listener too")
	fs.StringVar(&n.ingressDomain, "ingress-domain", "", "make preview URLs host names, http://<port>-<sandbox id>.DOMAIN:<listen port> (default: the sandbox's preview address, http://127.100.x.y:<port>, which needs no DNS)")
	fs.IntVar(&n.maxIngress, "max-ingress-requests", 0, "preview requests proxied at once, open WebSockets included; past it 503 (default half of --max-connections-per-address)")
	fs.IntVar(&n.maxIngressPerSandbox, "max-ingress-requests-per-sandbox", 0, "preview requests proxied at once to one sandbox (default 64, at most --max-ingress-requests)")
	fs.IntVar(&n.maxEgressConnections, "max-egress-connections", localsandbox.DefaultMaxEgressConnections, "outward connections (TCP, UDP flows) a sandbox holds at once; past it the kernel refuses a new one")
}

func (n *networkFlags) apply(o *localsandbox.Options) {
	o.Egress = localsandbox.EgressPolicy(n.egress)
	o.EgressAllow = localsandbox.SplitList(n.egressAllow)
	o.DNSUpstream = localsandbox.SplitList(n.dnsUpstream)
	o.IngressPublic = n.ingressPublic
	o.IngressDomain = n.ingressDomain
	o.MaxIngressRequests = n.maxIngress
	o.MaxIngressRequestsPerLease = n.maxIngressPerSandbox
	o.MaxEgressConnections = n.maxEgressConnections
}
