package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/time/rate"
)

// A lease's name lookups.
//
// DNS is an outward channel of its own: a resolver that forwards any query
// carries data out as the labels of the names asked, past any allowlist.
// So slirp4netns runs without its resolver (--disable-dns), and a lease's
// only resolver is the server's filter: a UDP socket and a TCP listener
// at DNSAddr (127.0.0.53:53), made inside the lease's network
// namespace by the server, owned by the host's root (the lease's root may
// not bind a port below 1024 there, nor change the namespace), served by
// goroutines of the server and closed with the lease. Its loopback is the
// only path from the lease to it, and the egress table admits no other
// resolver unless everything is admitted.
//
// The policy is the egress in force at the time of the query:
//
//	"*"        a standard query (opcode QUERY) is forwarded as it is to
//	           the upstream resolvers (the host's /etc/resolv.conf by
//	           default) and the answer passed back: everything is
//	           reachable anyway; another opcode gets NOTIMP, since the
//	           upstream sees the server ask (perhaps on the host's
//	           loopback, which the lease cannot reach)
//	rules      an A or AAAA query for the name of a rule is answered from
//	           the addresses the server pinned for it when the rules were
//	           set, the same the egress table admits; another type for
//	           that name gets an empty answer (NODATA); any other name,
//	           class or question gets REFUSED. Nothing leaves the host:
//	           no forwarding, no CNAME, no lookup
//	nothing    REFUSED
//
// REFUSED rather than NXDOMAIN: the name may well exist, the lease is just
// not allowed to ask (RFC 1035's "refuses … for policy reasons"), and a
// refusal is never cached as the name's absence.
//
// A lease cannot flood the server or the upstream: a lease's queries are
// rate-limited (dnsRate, dnsBurst; past it a UDP query is dropped and a
// TCP connection closed), at most dnsInFlight are forwarded at once, at
// most dnsTCPConns TCP connections are open, each waits at most dnsIdle
// for its next query, and a query is at most dnsMaxQuery bytes.

// DNSAddr is where a lease's resolver listens, inside its namespace.
var DNSAddr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.53"), 53)

// ResolvConf sends the lease's name lookups to the server's filter. The
// server writes it into the lease's root when the lease has an outward
// path.
const ResolvConf = "# written by sandboxd: the server's filtering resolver\nnameserver 127.0.0.53\n"

// The filter's limits, per lease.
const (
	dnsRate      = 200 // queries a second
	dnsBurst     = 400
	dnsInFlight  = 32 // forwarded at once
	dnsTCPConns  = 8
	dnsIdle      = 10 * time.Second
	dnsMaxQuery  = 4096
	dnsForward   = 5 * time.Second // an upstream's time to answer
	dnsAnswerTTL = 10              // seconds: rules change
)

// DNSUpstream returns the resolvers a lease whose egress is "*" is
// forwarded to: upstream (each an IP address, with or without a port), or
// the nameservers of the host's /etc/resolv.conf when it is empty (none
// when it names none: such queries then get SERVFAIL).
func DNSUpstream(upstream []string) ([]string, error) {
	if len(upstream) == 0 {
		return hostNameservers("/etc/resolv.conf"), nil
	}
	out := make([]string, 0, len(upstream))
	for _, u := range upstream {
		if a, err := netip.ParseAddr(u); err == nil {
			out = append(out, netip.AddrPortFrom(a, 53).String())
		} else if ap, err := netip.ParseAddrPort(u); err == nil {
			out = append(out, ap.String())
		} else {
			return nil, fmt.Errorf("DNS upstream %q: not an IP address with or without a port", u)
		}
	}
	return out, nil
}

// hostNameservers reads the nameservers of a resolv.conf, as addr:53.
func hostNameservers(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(fields[1]); err == nil {
			out = append(out, netip.AddrPortFrom(a, 53).String())
		}
	}
	return out
}

// dnsDecision is what the filter does with a query.
type dnsDecision struct {
	answer  []byte // the answer to send back, or
	forward bool   // forward the query upstream ("*"); neither: drop it
}

// decideDNS applies the egress in force, set, to query; limit is the size
// an answer must fit in (past it, answers are cut and the answer marked
// truncated).
func decideDNS(query []byte, set Egress, limit int) dnsDecision {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return dnsDecision{}
	}
	if set.all && h.OpCode == 0 {
		// A standard query only: the upstream may be the host's own
		// resolver on its loopback, which sees the server ask, not the
		// lease, and may take an UPDATE or NOTIFY from there.
		return dnsDecision{forward: true}
	}
	reply := func(rcode dnsmessage.RCode, q *dnsmessage.Question, addrs []netip.Addr) dnsDecision {
		return dnsDecision{answer: buildDNSAnswer(h, rcode, q, addrs, limit)}
	}
	qs, err := p.AllQuestions()
	switch {
	case err != nil || len(qs) != 1:
		return reply(dnsmessage.RCodeFormatError, nil, nil)
	case h.OpCode != 0:
		return reply(dnsmessage.RCodeNotImplemented, &qs[0], nil)
	}
	q := qs[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	var pinned []netip.Addr
	known := false
	for _, r := range set.rules {
		if r.host == "" || r.host != name {
			continue
		}
		known = true
		for _, p := range r.prefixes {
			pinned = append(pinned, p.Addr())
		}
	}
	if !known || q.Class != dnsmessage.ClassINET {
		return reply(dnsmessage.RCodeRefused, &q, nil)
	}
	var addrs []netip.Addr
	for _, a := range pinned {
		if (q.Type == dnsmessage.TypeA && a.Is4() || q.Type == dnsmessage.TypeAAAA && a.Is6()) && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return reply(dnsmessage.RCodeSuccess, &q, addrs)
}

// buildDNSAnswer answers query header h with rcode, echoing q and giving
// addrs as its A or AAAA records, as many as fit in limit bytes.
func buildDNSAnswer(h dnsmessage.Header, rcode dnsmessage.RCode, q *dnsmessage.Question, addrs []netip.Addr, limit int) []byte {
	for n := len(addrs); ; n-- {
		rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired,
			RecursionAvailable: true, RCode: rcode, Truncated: n < len(addrs)}
		b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
		b.EnableCompression()
		if q != nil {
			b.StartQuestions()
			b.Question(*q)
			b.StartAnswers()
			for _, a := range addrs[:n] {
				res := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: dnsAnswerTTL}
				if a.Is4() {
					b.AResource(res, dnsmessage.AResource{A: a.As4()})
				} else {
					b.AAAAResource(res, dnsmessage.AAAAResource{AAAA: a.As16()})
				}
			}
		}
		out, err := b.Finish()
		if err != nil {
			return nil // a name the parser took and the builder refuses: dropped
		}
		if len(out) <= limit || n == 0 {
			return out
		}
	}
}

// udpLimit is the size a UDP answer to query may have: 512 bytes, or what
// its EDNS record offers, up to dnsMaxQuery.
func udpLimit(query []byte) int {
	var p dnsmessage.Parser
	if _, err := p.Start(query); err != nil {
		return 512
	}
	if p.SkipAllQuestions() != nil || p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return 512
	}
	for {
		rh, err := p.AdditionalHeader()
		if err != nil {
			return 512
		}
		if rh.Type == dnsmessage.TypeOPT {
			return min(max(int(rh.Class), 512), dnsMaxQuery)
		}
		if p.SkipAdditional() != nil {
			return 512
		}
	}
}

// leaseDNS is the filter's sockets of one lease and what serves them.
type leaseDNS struct {
	upstream []string      // for "*" (DNSUpstream)
	egress   func() Egress // the egress in force
	udp      *net.UDPConn
	tcp      *net.TCPListener
	limit    *rate.Limiter
	inFlight chan struct{} // a place per query forwarded
	tcpConns chan struct{} // a place per TCP connection
	ctx      context.Context
	cancel   context.CancelFunc // by close
	wg       sync.WaitGroup
}

// serveDNS opens the filter's sockets in the namespace ns (at DNSAddr)
// and serves them until close.
func serveDNS(ns *os.File, upstream []string, egress func() Egress) (*leaseDNS, error) {
	d := &leaseDNS{upstream: upstream, egress: egress, limit: rate.NewLimiter(dnsRate, dnsBurst),
		inFlight: make(chan struct{}, dnsInFlight), tcpConns: make(chan struct{}, dnsTCPConns)}
	err := inNetns(ns, func() error {
		var err error
		if d.udp, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(DNSAddr)); err != nil {
			return err
		}
		d.tcp, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(DNSAddr))
		return err
	})
	if err != nil {
		if d.udp != nil {
			d.udp.Close()
		}
		return nil, fmt.Errorf("the lease's resolver: %w", err)
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(2)
	go d.serveUDP()
	go d.serveTCP()
	return d, nil
}

// close closes the sockets and waits for what serves them (forwarded
// queries are cut short). Safe on nil.
func (d *leaseDNS) close() {
	if d == nil {
		return
	}
	d.cancel()
	d.udp.Close()
	d.tcp.Close()
	d.wg.Wait()
}

func (d *leaseDNS) serveUDP() {
	defer d.wg.Done()
	buf := make([]byte, dnsMaxQuery)
	for {
		n, from, err := d.udp.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil || !d.limit.Allow() {
			continue
		}
		query := buf[:n]
		dec := decideDNS(query, d.egress(), udpLimit(query))
		switch {
		case dec.answer != nil:
			d.udp.WriteToUDPAddrPort(dec.answer, from)
		case dec.forward:
			query := append([]byte(nil), query...)
			d.spawn(d.inFlight, func() {
				if answer := d.forward("udp", query); answer != nil {
					d.udp.WriteToUDPAddrPort(answer, from)
				}
			})
		}
	}
}

func (d *leaseDNS) serveTCP() {
	defer d.wg.Done()
	for {
		c, err := d.tcp.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, most likely: wait for some to close
			// rather than spin.
			select {
			case <-d.ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if !d.spawn(d.tcpConns, func() { d.serveConn(c) }) {
			c.Close()
		}
	}
}

// spawn runs fn on a goroutine of its own holding a place in slots, or
// reports false when there is none.
func (d *leaseDNS) spawn(slots chan struct{}, fn func()) bool {
	select {
	case slots <- struct{}{}:
	default:
		return false
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer func() { <-slots }()
		fn()
	}()
	return true
}

// serveConn answers the queries of one TCP connection, one at a time.
// A forwarded query holds a place in inFlight too.
func (d *leaseDNS) serveConn(c *net.TCPConn) {
	defer c.Close()
	stop := context.AfterFunc(d.ctx, func() { c.Close() })
	defer stop()
	for {
		c.SetDeadline(time.Now().Add(dnsIdle))
		query, err := readTCPMessage(c, dnsMaxQuery)
		if err != nil || !d.limit.Allow() {
			return
		}
		dec := decideDNS(query, d.egress(), 65535)
		answer := dec.answer
		if dec.forward {
			select {
			case d.inFlight <- struct{}{}:
			default:
				return
			}
			answer = d.forward("tcp", query)
			<-d.inFlight
		}
		if answer == nil || writeTCPMessage(c, answer) != nil {
			return
		}
	}
}

// forward sends query to the upstream resolvers in turn, over network
// (udp or tcp), and returns the first answer with the query's id; if none
// answers, SERVFAIL (nil once the lease's resolver is closing).
func (d *leaseDNS) forward(network string, query []byte) []byte {
	id := binary.BigEndian.Uint16(query) // decideDNS parsed its header
	for _, up := range d.upstream {
		ctx, cancel := context.WithTimeout(d.ctx, dnsForward)
		answer := exchange(ctx, network, up, query)
		cancel()
		if len(answer) >= 12 && binary.BigEndian.Uint16(answer) == id {
			return answer
		}
	}
	if d.ctx.Err() != nil {
		return nil
	}
	return serverFailure(query)
}

// serverFailure is the SERVFAIL answer to query.
func serverFailure(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return buildDNSAnswer(h, dnsmessage.RCodeServerFailure, nil, nil, 512)
	}
	return buildDNSAnswer(h, dnsmessage.RCodeServerFailure, &q, nil, 512)
}

// exchange sends query to addr over network and reads the answer, within
// ctx; nil if there is none.
func exchange(ctx context.Context, network, addr string, query []byte) []byte {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if network == "tcp" {
		if writeTCPMessage(c, query) != nil {
			return nil
		}
		answer, _ := readTCPMessage(c, 65535)
		return answer
	}
	if _, err := c.Write(query); err != nil {
		return nil
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// readTCPMessage reads one length-prefixed DNS message of at most max
// bytes.
func readTCPMessage(r io.Reader, max int) ([]byte, error) {
	var size [2]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(size[:]))
	if n < 12 || n > max {
		return nil, errors.New("DNS message size out of bounds")
	}
	msg := make([]byte, n)
	_, err := io.ReadFull(r, msg)
	return msg, err
}

func writeTCPMessage(w io.Writer, msg []byte) error {
	_, err := w.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...))
	return err
}
