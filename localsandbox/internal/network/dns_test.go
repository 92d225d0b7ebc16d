package network

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandboxflow/sandboxflow/internal/testenv"
	"github.com/sandboxflow/sandboxflow/localsandbox/internal/leaseinit"
)

// dnsQuery is a query for name of type qtype (class IN, unless class is
// given), built with the library.
func dnsQuery(t *testing.T, name string, qtype dnsmessage.Type, class ...dnsmessage.Class) []byte {
	t.Helper()
	c := dnsmessage.ClassINET
	if len(class) > 0 {
		c = class[0]
	}
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: 0x4242, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: qtype, Class: c}},
	}
	b, err := msg.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dnsReply is an answer as the tests read it: its rcode, whether it is
// truncated, and its A and AAAA addresses.
type dnsReply struct {
	rcode     dnsmessage.RCode
	truncated bool
	addrs     []string
}

func parseReply(t *testing.T, b []byte) dnsReply {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		t.Fatalf("unpacking the answer: %v", err)
	}
	if m.ID != 0x4242 || !m.Response {
		t.Fatalf("header %+v", m.Header)
	}
	r := dnsReply{rcode: m.RCode, truncated: m.Truncated}
	for _, a := range m.Answers {
		switch body := a.Body.(type) {
		case *dnsmessage.AResource:
			r.addrs = append(r.addrs, netip.AddrFrom4(body.A).String())
		case *dnsmessage.AAAAResource:
			r.addrs = append(r.addrs, netip.AddrFrom16(body.AAAA).String())
		}
	}
	return r
}

// compileWith compiles rules under the allowlist policy with names
// resolved by table.
func compileWith(t *testing.T, table map[string][]string, rules ...string) Egress {
	t.Helper()
	orig := Resolver
	t.Cleanup(func() { Resolver = orig })
	Resolver = func(ctx context.Context, host string) ([]netip.Addr, error) {
		var out []netip.Addr
		for _, a := range table[host] {
			out = append(out, netip.MustParseAddr(a))
		}
		if out == nil {
			return nil, errors.New("no such host")
		}
		return out, nil
	}
	set, err := Compile(context.Background(), rules, Grant{Rules: true})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func TestDNSPolicy(t *testing.T) {
	set := compileWith(t, map[string][]string{
		"api.example": {"192.0.2.1", "192.0.2.2", "2001:db8::1"},
	}, "api.example:443", "API.example:80", "10.0.0.0/8")
	refused := dnsReply{rcode: dnsmessage.RCodeRefused}
	for _, c := range []struct {
		name  string
		query []byte
		want  dnsReply
	}{
		{"A of a ruled name: its pinned addresses, once each", dnsQuery(t, "api.example.", dnsmessage.TypeA),
			dnsReply{addrs: []string{"192.0.2.1", "192.0.2.2"}}},
		{"AAAA", dnsQuery(t, "api.example.", dnsmessage.TypeAAAA), dnsReply{addrs: []string{"2001:db8::1"}}},
		{"names compare without case", dnsQuery(t, "Api.EXAMPLE.", dnsmessage.TypeA), dnsReply{addrs: []string{"192.0.2.1", "192.0.2.2"}}},
		{"another type of a ruled name: NODATA", dnsQuery(t, "api.example.", dnsmessage.TypeTXT), dnsReply{}},
		{"CNAME: NODATA, not followed", dnsQuery(t, "api.example.", dnsmessage.TypeCNAME), dnsReply{}},
		{"a name outside the rules", dnsQuery(t, "secret.leak.example.", dnsmessage.TypeA), refused},
		{"a name below a ruled name", dnsQuery(t, "x.api.example.", dnsmessage.TypeA), refused},
		{"a TXT outside the rules", dnsQuery(t, "c2.example.", dnsmessage.TypeTXT), refused},
		{"a CIDR rule names no name", dnsQuery(t, "10.in-addr.arpa.", dnsmessage.TypePTR), refused},
		{"another class", dnsQuery(t, "api.example.", dnsmessage.TypeA, dnsmessage.ClassCHAOS), refused},
	} {
		dec := decideDNS(c.query, set, 512)
		if dec.forward || dec.answer == nil {
			t.Errorf("%s: %+v, want an answer", c.name, dec)
			continue
		}
		if got := parseReply(t, dec.answer); got.rcode != c.want.rcode || got.truncated || !slices.Equal(got.addrs, c.want.addrs) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}

	// Not one question, or not a query: FORMERR, NOTIMP.
	two, _ := (&dnsmessage.Message{Header: dnsmessage.Header{ID: 0x4242}, Questions: []dnsmessage.Question{
		{Name: dnsmessage.MustNewName("api.example."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET},
		{Name: dnsmessage.MustNewName("leak.example."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET},
	}}).Pack()
	if got := parseReply(t, decideDNS(two, set, 512).answer); got.rcode != dnsmessage.RCodeFormatError || got.addrs != nil {
		t.Errorf("two questions: %+v", got)
	}
	update := dnsQuery(t, "api.example.", dnsmessage.TypeA)
	update[2] |= 5 << 3 // opcode UPDATE
	for _, e := range []Egress{set, {all: true}} {
		// Not forwarded under * either: the upstream may be the host's
		// resolver on its loopback, taking updates from there.
		if dec := decideDNS(update, e, 512); dec.forward || parseReply(t, dec.answer).rcode != dnsmessage.RCodeNotImplemented {
			t.Errorf("an UPDATE under %q: %+v, want NOTIMP", e.List(), dec)
		}
	}
	// Garbage and answers are dropped, whatever the egress.
	answer := decideDNS(dnsQuery(t, "api.example.", dnsmessage.TypeA), set, 512).answer
	for _, b := range [][]byte{nil, []byte("short"), answer} {
		for _, e := range []Egress{set, {all: true}} {
			if dec := decideDNS(b, e, 512); dec.forward || dec.answer != nil {
				t.Errorf("%q: %+v, want dropped", b, dec)
			}
		}
	}

	// Everything: forwarded as it is. Nothing: REFUSED, the ruled name too.
	if dec := decideDNS(dnsQuery(t, "anything.example.", dnsmessage.TypeTXT), Egress{all: true}, 512); !dec.forward {
		t.Errorf("under *: %+v, want forwarded", dec)
	}
	if got := parseReply(t, decideDNS(dnsQuery(t, "api.example.", dnsmessage.TypeA), Egress{}, 512).answer); got.rcode != dnsmessage.RCodeRefused {
		t.Errorf("with nothing in force: %+v", got)
	}
}

func TestDNSAnswerFitsTheLimit(t *testing.T) {
	var many []string
	for i := range 100 {
		many = append(many, netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}).String())
	}
	set := compileWith(t, map[string][]string{"big.example": many}, "big.example")
	query := dnsQuery(t, "big.example.", dnsmessage.TypeA)
	dec := decideDNS(query, set, udpLimit(query))
	if got := parseReply(t, dec.answer); len(dec.answer) > 512 || !got.truncated || len(got.addrs) == 0 || len(got.addrs) >= 100 {
		t.Errorf("over UDP without EDNS: %d bytes, %+v; want at most 512, truncated", len(dec.answer), got)
	}
	if got := parseReply(t, decideDNS(query, set, 65535).answer); got.truncated || len(got.addrs) != 100 {
		t.Errorf("over TCP: %+v, want all 100", got)
	}
	// EDNS offers more room over UDP.
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x4242})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("big.example."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	b.StartAdditionals()
	var opt dnsmessage.ResourceHeader
	opt.SetEDNS0(4096, dnsmessage.RCodeSuccess, false)
	b.OPTResource(opt, dnsmessage.OPTResource{})
	edns, _ := b.Finish()
	if got := udpLimit(edns); got != 4096 {
		t.Errorf("the UDP limit with EDNS 4096: %d", got)
	}
}

func TestDNSUpstream(t *testing.T) {
	got, err := DNSUpstream([]string{"192.0.2.53", "127.0.0.1:5353", "2001:db8::53"})
	if err != nil || !slices.Equal(got, []string{"192.0.2.53:53", "127.0.0.1:5353", "[2001:db8::53]:53"}) {
		t.Errorf("DNSUpstream: %q, %v", got, err)
	}
	if _, err := DNSUpstream([]string{"dns.example"}); err == nil {
		t.Error("a name as upstream was accepted: the resolver of the resolver would be needed")
	}
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(conf, []byte("# comment\nsearch example\nnameserver 10.255.255.53\nnameserver ::1\nnameserver bogus\noptions ndots:2\n"), 0o644)
	if got := hostNameservers(conf); !slices.Equal(got, []string{"10.255.255.53:53", "[::1]:53"}) {
		t.Errorf("hostNameservers: %q", got)
	}
}

// The lease's resolver, in a namespace of the test's own: queries past
// the rate are dropped, TCP connections past the cap closed, a forwarded
// query whose upstream does not answer gets SERVFAIL, and close ends
// every goroutine.
func TestDNSLeaseResolverIsBounded(t *testing.T) {
	testenv.RequireRoot(t, "the resolver's sockets are made in a network namespace")
	ns := testNetns(t)
	// An upstream that never answers (a bound socket nobody reads).
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var egress atomic.Pointer[Egress]
	set := compileWith(t, map[string][]string{"api.example": {"192.0.2.1"}}, "api.example")
	egress.Store(&set)
	d, err := serveDNS(ns, []string{silent.LocalAddr().String()}, func() Egress { return *egress.Load() })
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			d.close()
		}
	}()
	var udp, conns []net.Conn
	dial := func(network string) net.Conn {
		var c net.Conn
		if err := inNetns(ns, func() (err error) {
			c, err = net.Dial(network, DNSAddr.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The rate: queries one after the other are answered until the burst
	// and what refilled meanwhile are spent; the next is dropped.
	c := dial("udp")
	udp = append(udp, c)
	query := dnsQuery(t, "api.example.", dnsmessage.TypeA)
	buf := make([]byte, 512)
	answered, start := 0, time.Now()
	for answered <= 4*dnsBurst {
		c.Write(query)
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break
		}
		answered++
	}
	if refilled := int(time.Since(start).Seconds()*dnsRate) + 1; answered < dnsBurst || answered > dnsBurst+refilled {
		t.Errorf("%d queries answered in a row; the burst is %d, %d refilled meanwhile", answered, dnsBurst, refilled)
	}
	// TCP: dnsTCPConns connections are served, the next is closed at once.
	d.limit.SetLimit(1e6)
	d.limit.SetBurst(1e6)
	for range dnsTCPConns {
		c := dial("tcp")
		conns = append(conns, c)
		if err := writeTCPMessage(c, query); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := readTCPMessage(c, 65535); err != nil {
			t.Fatalf("a TCP query within the cap: %v", err)
		}
	}
	extra := dial("tcp")
	extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := extra.Read(buf); err == nil || n != 0 || strings.Contains(err.Error(), "timeout") {
		t.Errorf("a connection past the cap: %d bytes, %v; want closed", n, err)
	}
	extra.Close()
	// Under "*" a query goes upstream; one that never answers: SERVFAIL.
	egress.Store(&Egress{all: true})
	start = time.Now()
	c.Write(dnsQuery(t, "anything.example.", dnsmessage.TypeA))
	c.SetReadDeadline(time.Now().Add(2 * dnsForward))
	n, err := c.Read(buf)
	if err != nil || parseReply(t, buf[:n]).rcode != dnsmessage.RCodeServerFailure {
		t.Errorf("an upstream that does not answer: %v", err)
	}
	if elapsed := time.Since(start); elapsed < dnsForward {
		t.Errorf("SERVFAIL after %v, before the upstream's time was up", elapsed)
	}
	// close ends everything, the open TCP connections too, at once: not
	// when their idle deadline comes (a read's timeout is not an end).
	start = time.Now()
	d.close()
	closed = true
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("close took %v: it waited for the TCP connections' idle deadline", elapsed)
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a TCP connection outlived the resolver: %v", err)
		}
		c.Close()
	}
	for _, c := range udp {
		c.Close()
	}
}

// testNetns is a network namespace of the test's own, its loopback up, as
// a lease's is; it is closed when the test ends.
func testNetns(t *testing.T) *os.File {
	t.Helper()
	ns, err := newNetns()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := inNetns(ns, leaseinit.LoopbackUp); err != nil {
		t.Fatal(err)
	}
	return ns
}
