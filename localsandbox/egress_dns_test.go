package localsandbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandboxflow/sandboxflow/localsandbox/internal/network"
)

// dnsQuerier sends one DNS query (name, type, over udp or tcp) to the
// first nameserver of the lease's /etc/resolv.conf (or the server named
// by a fourth argument) and prints "rcode N
// answers M", or "timeout". It builds the packet itself: the lease image
// has no dig.
const dnsQuerier = `
import random, socket, struct, sys
name, qtype, proto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
if len(sys.argv) > 4:
    ns = sys.argv[4]
q = struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", qtype, 1)
try:
    if proto == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
        s.sendto(q, (ns, 53)); r = s.recv(65535)
    else:
        s = socket.create_connection((ns, 53), timeout=3)
        s.sendall(struct.pack(">H", len(q)) + q)
        r = b""
        while len(r) < 2 or len(r) < 2 + struct.unpack(">H", r[:2])[0]:
            b = s.recv(65535)
            if not b:
                raise EOFError
            r += b
        r = r[2:]
    print("rcode", r[3] & 15, "answers", struct.unpack(">H", r[6:8])[0])
except (OSError, EOFError) as e:
    print("error", type(e).__name__)
`

// dnsQuery runs dnsQuerier in lease, with server, if any, as its fourth
// argument.
func (ts *testServer) dnsQuery(lease, name string, qtype int, proto string, server ...string) string {
	ts.t.Helper()
	if status := ts.putFile(lease, "/workspace/dnsq.py", dnsQuerier); status != http.StatusOK {
		ts.t.Fatalf("putting the querier: %d", status)
	}
	args := append([]string{name, strconv.Itoa(qtype), proto}, server...)
	return strings.TrimSpace(ts.exec(lease, "python3 /workspace/dnsq.py "+strings.Join(args, " ")).Stdout)
}

// fakeUpstream is a DNS server on the host's loopback (UDP and TCP, one
// port) that answers every A query with 192.0.2.99 and records the names
// it was asked.
type fakeUpstream struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func startFakeUpstream(t *testing.T) *fakeUpstream {
	t.Helper()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	uc, err := net.ListenPacket("udp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl.Close(); uc.Close() })
	f := &fakeUpstream{addr: tl.Addr().String()}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			if answer := f.answer(buf[:n]); answer != nil {
				uc.WriteTo(answer, from)
			}
		}
	}()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var size [2]byte
				if _, err := io.ReadFull(c, size[:]); err != nil {
					return
				}
				query := make([]byte, binary.BigEndian.Uint16(size[:]))
				if _, err := io.ReadFull(c, query); err != nil {
					return
				}
				if answer := f.answer(query); answer != nil {
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(answer))), answer...))
				}
			}()
		}
	}()
	return f
}

func (f *fakeUpstream) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	f.mu.Lock()
	f.seen = append(f.seen, strings.ToLower(q.Name.String()))
	f.mu.Unlock()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true})
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	if q.Type == dnsmessage.TypeA {
		b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{192, 0, 2, 99}})
	}
	out, _ := b.Finish()
	return out
}

// asked reports the names the upstream was asked, in order.
func (f *fakeUpstream) asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// resolveScript prints the addresses getaddrinfo finds for name in the
// lease, sorted, or "ERR <error>".
func resolveScript(name string) string {
	return fmt.Sprintf(`python3 -c '
import socket
try:
    print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo("%s", 443, type=socket.SOCK_STREAM)})))
except Exception as e:
    print("ERR", type(e).__name__, e)
'`, name)
}

// pinNames replaces the server's resolver of rule names with a table.
func pinNames(t *testing.T, names map[string][]string) {
	orig := network.Resolver
	t.Cleanup(func() { network.Resolver = orig })
	network.Resolver = func(ctx context.Context, host string) ([]netip.Addr, error) {
		var addrs []netip.Addr
		for _, a := range names[host] {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
		if addrs == nil {
			return nil, errors.New("no such host")
		}
		return addrs, nil
	}
}

// A lease allowed one name resolves that name, to the addresses its rule
// pinned, and nothing else: a query for another name gets REFUSED from
// the server's filter, and no packet of it leaves the host (before: the
// lease's resolver, slirp4netns's, forwarded any query to the host's, so
// an allowlist leaked data as DNS labels).
func TestDNSResolvesOnlyTheRulesNames(t *testing.T) {
	needNetwork(t)
	pinNames(t, map[string][]string{"allowed.test": {"192.0.2.10", "2001:db8::10"}})
	upstream := startFakeUpstream(t)
	ts := startServer(t, Options{Egress: EgressAllowlist, DNSUpstream: []string{upstream.addr}})
	sb := ts.createWith(map[string]any{"egress": []string{"allowed.test:443"}})
	if got := ts.exec(sb.ID, resolveScript("ALLOWED.Test.")).Stdout; strings.TrimSpace(got) != "192.0.2.10 2001:db8::10" {
		t.Errorf("the ruled name resolves to %q, want its pinned addresses", got)
	}
	for _, proto := range []string{"udp", "tcp"} {
		if got := ts.dnsQuery(sb.ID, "secret-data.exfil.test", 1, proto); got != "rcode 5 answers 0" {
			t.Errorf("%s: a name outside the rules: %q, want REFUSED from the filter", proto, got)
		}
	}
	// Another type of the ruled name: an empty answer, not a lookup.
	if got := ts.dnsQuery(sb.ID, "allowed.test", 16, "udp"); got != "rcode 0 answers 0" {
		t.Errorf("TXT of the ruled name: %q, want NODATA", got)
	}
	// No other resolver is reachable: the table refuses slirp4netns's
	// (10.0.2.3, the one it admitted before) like any destination no rule
	// names.
	if got := ts.dnsQuery(sb.ID, "secret-data.exfil.test", 1, "udp", "10.0.2.3"); got != "error PermissionError" {
		t.Errorf("slirp4netns's resolver: %q, want refused by the table", got)
	}
	if asked := upstream.asked(); len(asked) != 0 {
		t.Errorf("the upstream was asked %q: the allowlist leaked names", asked)
	}
	// No rule any more: nothing resolves.
	ts.mustCall("PUT", "/sandboxes/"+sb.ID+"/egress", map[string]any{"egress": []string{"192.0.2.1:443"}}, nil)
	if got := ts.dnsQuery(sb.ID, "allowed.test", 1, "udp"); got != "rcode 5 answers 0" {
		t.Errorf("the name after its rule went: %q, want REFUSED", got)
	}
}

// A lease whose egress is "*" resolves any name through the upstream
// resolver, over UDP and TCP.
func TestDNSAllForwardsToTheUpstream(t *testing.T) {
	needNetwork(t)
	upstream := startFakeUpstream(t)
	ts := startServer(t, Options{Egress: EgressAny, DNSUpstream: []string{upstream.addr}})
	sb := ts.createWith(map[string]any{"egress": []string{"*"}})
	if got := strings.TrimSpace(ts.exec(sb.ID, resolveScript("anything.test")).Stdout); got != "192.0.2.99" {
		t.Errorf("a name under *: %q, want the upstream's answer", got)
	}
	if got := ts.dnsQuery(sb.ID, "over-tcp.test", 1, "tcp"); got != "rcode 0 answers 1" {
		t.Errorf("over TCP: %q", got)
	}
	if asked := upstream.asked(); !slices.Contains(asked, "anything.test.") || !slices.Contains(asked, "over-tcp.test.") {
		t.Errorf("the upstream was asked %q", asked)
	}
}
