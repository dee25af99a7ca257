package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

// FakeUpstream is a DNS server on loopback answering A queries for name
// with addr and everything else NXDOMAIN: the upstream of a network whose
// resolver a benchmark measures, so nothing leaves the host. stop ends it.
func FakeUpstream(name string, addr netip.Addr) (at netip.AddrPort, stop func(), err error) {
	want, err := dnsmessage.NewName(strings.TrimSuffix(name, ".") + ".")
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := answer(buf[:n], want, addr); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return netip.MustParseAddrPort(pc.LocalAddr().String()), func() { _ = pc.Close() }, nil
}

// answer is FakeUpstream's reply to msg, nil for what is not a query.
func answer(msg []byte, want dnsmessage.Name, addr netip.Addr) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	match := strings.EqualFold(q.Name.String(), want.String())
	if !match {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil
	}
	if match && q.Type == dnsmessage.TypeA && addr.Is4() {
		rr := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 300}
		if b.AResource(rr, dnsmessage.AResource{A: addr.As4()}) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// dnsProbe, run by python3 in a sandbox with the server, the name and n as
// arguments, sends n+1 A queries one after another over UDP (the first
// fills the resolver's cache), checks each answer (its id, NOERROR, an
// answer record) and prints the median of the last n round trips in
// nanoseconds: what a stub resolver in the sandbox waits.
const dnsProbe = `
import socket, struct, sys, time
srv, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
qname = b''.join(bytes([len(l)]) + l.encode() for l in name.split('.') if l) + b'\0'
qs = [struct.pack('>HHHHHH', i, 0x0100, 1, 0, 0, 0) + qname + struct.pack('>HH', 1, 1) for i in range(n + 1)]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect((srv, 53))
ds = []
for i, q in enumerate(qs):
    t = time.perf_counter_ns()
    s.send(q)
    r = s.recv(512)
    d = time.perf_counter_ns() - t
    if r[:2] != q[:2] or r[3] & 0xf != 0 or struct.unpack('>H', r[6:8])[0] < 1:
        sys.exit('bad answer %r' % r)
    if i:
        ds.append(d)
ds.sort()
print(ds[len(ds) // 2])
`

// DNSInSandbox is the median time, seen from inside sb, of n answers of
// its resolver at server for name, cached after the first of n+1 queries.
// n must stay under the resolver's per-sandbox burst (200).
func DNSInSandbox(ctx context.Context, sb backend.Sandbox, server netip.Addr, name string, n int) (time.Duration, error) {
	var mu sync.Mutex
	var out, errb strings.Builder
	res, err := backend.Exec(ctx, sb, &wire.ExecRequest{
		Argv:      []string{"/usr/bin/python3", "-c", dnsProbe, server.String(), name, strconv.Itoa(n)},
		TimeoutMs: 60_000,
	}, func(stream string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		if stream == wire.Stderr {
			errb.Write(data)
		} else {
			out.Write(data)
		}
	})
	if err != nil {
		return 0, err
	}
	if res.Code != 0 {
		return 0, fmt.Errorf("dns probe exited %d: %s", res.Code, errb.String())
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(out.String()), 10, 64)
	if err != nil || ns <= 0 {
		return 0, errors.New("dns probe: no median in " + strconv.Quote(out.String()))
	}
	return time.Duration(ns), nil
}
