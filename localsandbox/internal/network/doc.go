// Package network is a lease's network: the namespace the server makes for
// it, its outward path (slirp4netns), the kernel's egress rules (an
// nftables table in that namespace), its resolver (the server's filter of
// its name lookups), its counters, and the proxy of preview requests into
// it. NETWORK.md says what a lease gets.
//
//	set, err := network.Compile(ctx, []string{"pypi.org:443"}, network.Grant{Rules: true}) // *InputError: 400
//	n, err := network.New(network.Config{Slirp4netns: "/usr/bin/slirp4netns", MaxFlows: 1024, Marker: "SANDBOXFLOW_ROOT=/…", Cgroup: cg}, set, true)
//	m, err := machine.Start(spec, cg, spawner, n.Namespace()) // the lease init, in n's namespace
//	err = n.SetEgress(other)                            // the next connection follows the new rules
//	n.Proxy(8000, answerFailure).ServeHTTP(w, r)        // a preview request, to 127.0.0.1:8000 in the lease
//	n.Close()
//
// Only a server running as root makes its leases' network namespaces
// (New); the namespace then belongs to the host's user namespace, so the
// lease's root has no CAP_NET_ADMIN over it and cannot change its
// interfaces or its firewall. A server that is not root leaves the
// namespace to the lease init: loopback only.
//
// # Where each mechanism is applied
//
//   - The namespace: network.go, New (newNetns: unshare(CLONE_NEWNET) on a
//     thread of its own), loopback up (leaseinit.LoopbackUp, inNetns),
//     and Start, which clones the lease init into it.
//   - The egress rule: egress.go, applyEgress — table inet sandboxd, chain
//     egress on the output hook of the lease's namespace: loopback,
//     established and related traffic and the rules' destinations
//     accepted (no resolver but the lease's own, on loopback), a new flow
//     past MaxFlows refused (conntrack's count, connlimit), everything
//     else rejected at once (TCP reset, ICMP administratively
//     prohibited). New applies it before
//     slirp4netns starts; SetEgress replaces the table in one netlink
//     transaction. Compile parses the rules (parseRule) and resolves their
//     host names (Resolver).
//   - The lease's resolver: dns.go — serveDNS opens a UDP socket and a TCP
//     listener at DNSAddr (127.0.0.53:53) inside the namespace, served by
//     the server's goroutines until Close; decideDNS answers a query from
//     the egress in force (the rules' pinned addresses, REFUSED for other
//     names, forwarded to Config.DNSUpstream only under "*"); rate, in
//     flight, TCP connection and size caps per lease. The server writes
//     ResolvConf, which names it, into the lease's root.
//   - The outward path: network.go, startSlirp — slirp4netns attached to
//     the namespace (tap0 10.0.2.100/24, gateway 10.0.2.2, its resolver
//     disabled), sandboxed, without the host's loopback unless
//     HostLoopback, its descriptors bounded to MaxFlows + SlirpOwnFiles,
//     in the lease's cgroup (its CPU and memory count against the lease's
//     shape, and a pause freezes it).
//   - Counters: ReadCounters, tap0's bytes from /proc/<pid>/net/dev.
//   - Preview requests: ingress.go, Proxy — a reverse proxy (WebSockets
//     too) whose connections are dialled from inside the namespace, at
//     most MaxIdlePerLease kept idle. Which requests are preview requests,
//     and their caps, are the server's (localsandbox's ingress.go).
//     Never to the self API's port (Previewable).
//   - Preview addresses: publish.go, Publish — the ports the lease listens
//     on (asked every publishEvery over a sock_diag netlink socket made in
//     the namespace) each served by a listener of the server at the
//     lease's own loopback address and port, at most MaxPublishedPorts.
//   - The self API: agent.go — serveAgent opens a TCP listener at
//     AgentAddr (127.0.0.1:1029) inside the namespace before the lease
//     init starts, served with Config.Agent, the server's handler bound to
//     the lease, until Close.
package network
