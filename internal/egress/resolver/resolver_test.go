package resolver

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

var (
	sbAddr    = netip.MustParseAddr("127.0.0.1") // the sandbox's source address
	otherAddr = netip.MustParseAddr("127.0.0.2") // not a sandbox
)

func testZones() map[string]zone {
	return map[string]zone{
		"allowed.test":    {addrs: []string{"203.0.113.10", "203.0.113.11"}, ttl: 60},
		"short.test":      {addrs: []string{"203.0.113.20"}, ttl: 1},
		"long.test":       {addrs: []string{"203.0.113.21"}, ttl: 86400},
		"denied.test":     {addrs: []string{"203.0.113.30"}, ttl: 60},
		"rebind-lo.test":  {addrs: []string{"127.0.0.1"}, ttl: 60},
		"rebind-md.test":  {addrs: []string{"169.254.169.254"}, ttl: 60},
		"rebind-10.test":  {addrs: []string{"10.1.2.3"}, ttl: 60},
		"mixed.test":      {addrs: []string{"127.0.0.1", "203.0.113.40"}, ttl: 60},
		"cname.test":      {cname: "cdn.elsewhere", ttl: 30},
		"cdn.elsewhere":   {addrs: []string{"203.0.113.50"}, ttl: 120},
		"loop.test":       {cname: "loop2.test", ttl: 30},
		"loop2.test":      {cname: "loop.test", ttl: 30},
		"big.test":        {addrs: bigAddrs(20), ttl: 60, tc: true},
		"gone.test":       {nx: true},
		"slow.test":       {addrs: []string{"203.0.113.70"}, ttl: 60, delay: 200 * time.Millisecond},
		"rebind-all.test": {addrs: privateAddrs(12), ttl: 60},
		"empty.test":      {ttl: 60},
		"a.wild.test":     {addrs: []string{"203.0.113.60"}, ttl: 60},
		"wild.test":       {addrs: []string{"203.0.113.61"}, ttl: 60},
		"x.y.z.wild.test": {addrs: []string{"203.0.113.62"}, ttl: 60},
	}
}

func bigAddrs(n int) []string {
	var out []string
	for i := range n {
		out = append(out, netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}).String())
	}
	return out
}

func privateAddrs(n int) []string {
	var out []string
	for i := range n {
		out = append(out, netip.AddrFrom4([4]byte{192, 168, 0, byte(i + 1)}).String())
	}
	return out
}

func testSandbox() *sandbox {
	return &sandbox{allow: []string{
		"allowed.test", "short.test", "long.test", "rebind-lo.test", "rebind-md.test",
		"rebind-10.test", "mixed.test", "cname.test", "loop.test", "big.test", "gone.test",
		"empty.test", "*.wild.test", "rebind-all.test", "slow.test",
	}}
}

// setup is a resolver forwarding to a fake upstream, with one sandbox at
// 127.0.0.1.
func setup(t *testing.T, cfg Config) (*server, *upstream, *sandbox) {
	t.Helper()
	u := newUpstream(t, testZones())
	sb := testSandbox()
	if cfg.Upstreams == nil {
		cfg.Upstreams = []netip.AddrPort{u.addr}
	}
	return newServer(t, cfg, map[netip.Addr]*sandbox{sbAddr: sb}), u, sb
}

func ask(t *testing.T, s *server, name string, typ dnsmessage.Type) parsed {
	t.Helper()
	m, err := exchangeUDP(t, s.udp, sbAddr, query(t, 0x1234, name+".", typ, false), 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	p := parse(t, m)
	if p.h.ID != 0x1234 || !p.h.Response {
		t.Fatalf("%s: header %+v", name, p.h)
	}
	if len(p.qs) != 1 || !strings.EqualFold(p.qs[0].Name.String(), name+".") || p.qs[0].Type != typ {
		t.Fatalf("%s: question not echoed: %+v", name, p.qs)
	}
	if p.size > 512 {
		t.Fatalf("%s: answer of %d bytes", name, p.size)
	}
	return p
}

func TestAllowedName(t *testing.T) {
	s, u, sb := setup(t, Config{})
	p := ask(t, s, "Allowed.TEST", dnsmessage.TypeA)
	want := []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")}
	if p.h.RCode != dnsmessage.RCodeSuccess || !slices.Equal(p.addrs, want) || p.ttls[0] != 60 {
		t.Fatalf("answer %+v", p)
	}
	if r := sb.lastRecord(t); r.Kind != "dns" || r.Verdict != "allow" || r.Name != "allowed.test" ||
		r.Addr != "203.0.113.10,203.0.113.11" || r.Rule != "allowed.test" {
		t.Fatalf("record %+v", r)
	}
	pins := sb.pinned()
	if len(pins) != 2 || pins[0] != (pin{"allowed.test", want[0], 60 * time.Second}) {
		t.Fatalf("pins %+v", pins)
	}
	// Cached: upstream is asked once, the pins are made again (they are
	// per sandbox, per answer).
	ask(t, s, "allowed.test", dnsmessage.TypeA)
	if n := u.count("udp", "allowed.test"); n != 1 {
		t.Fatalf("upstream asked %d times", n)
	}
	if len(sb.pinned()) != 4 || s.Stats().CacheHits != 1 {
		t.Fatalf("pins %d, stats %+v", len(sb.pinned()), s.Stats())
	}

	// A real stub resolver gets the addresses (and an empty AAAA).
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, s.udp.String())
	}}
	got, err := r.LookupHost(t.Context(), "allowed.test")
	if err != nil || len(got) != 2 {
		t.Fatalf("LookupHost: %v %v", got, err)
	}
	if _, err := r.LookupHost(t.Context(), "denied.test"); !isNotFound(err) {
		t.Fatalf("LookupHost denied.test: %v", err)
	}
}

// TestGateFails: when the host's gate does not open for the addresses, the
// answer is SERVFAIL, not addresses whose connections would be refused.
func TestGateFails(t *testing.T) {
	s, _, sb := setup(t, Config{})
	sb.mu.Lock()
	sb.pinErr = errors.New("netlink: no buffer space")
	sb.mu.Unlock()
	p := ask(t, s, "allowed.test", dnsmessage.TypeA)
	if p.h.RCode != dnsmessage.RCodeServerFailure || len(p.addrs) != 0 {
		t.Fatalf("answer %+v, want SERVFAIL without addresses", p)
	}
	if r := sb.lastRecord(t); !strings.Contains(r.Reason, "gate did not open: netlink: no buffer space") {
		t.Fatalf("record %+v", r)
	}
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

func TestTTLClamp(t *testing.T) {
	s, _, sb := setup(t, Config{})
	for _, c := range []struct {
		name string
		ttl  uint32
	}{{"short.test", 5}, {"long.test", 300}} {
		p := ask(t, s, c.name, dnsmessage.TypeA)
		if len(p.ttls) != 1 || p.ttls[0] != c.ttl {
			t.Fatalf("%s: TTLs %v, want %d", c.name, p.ttls, c.ttl)
		}
		pins := sb.pinned()
		if last := pins[len(pins)-1]; last.name != c.name || last.ttl != time.Duration(c.ttl)*time.Second {
			t.Fatalf("%s: pin %+v", c.name, last)
		}
	}
}

func TestDeniedName(t *testing.T) {
	s, u, sb := setup(t, Config{})
	for _, name := range []string{"denied.test", "wild.test", "allowed.test.evil", "sub.allowed.test"} {
		for _, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} {
			p := ask(t, s, name, typ)
			if p.h.RCode != dnsmessage.RCodeNameError || !p.h.Authoritative || len(p.addrs)+p.other != 0 {
				t.Fatalf("%s: %+v", name, p)
			}
			if r := sb.lastRecord(t); r.Verdict != "deny" || r.Name != name || r.Reason != "name not allowed" || r.Rule != "" {
				t.Fatalf("%s: record %+v", name, r)
			}
		}
		if n := u.count("udp", name); n != 0 {
			t.Fatalf("%s forwarded upstream", name)
		}
	}
	if len(sb.pinned()) != 0 {
		t.Fatalf("pins %+v", sb.pinned())
	}
	// A suffix rule: any depth below it, not the suffix itself (above).
	for _, name := range []string{"a.wild.test", "x.y.z.wild.test"} {
		if p := ask(t, s, name, dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeSuccess || len(p.addrs) != 1 {
			t.Fatalf("%s: %+v", name, p)
		}
		if r := sb.lastRecord(t); r.Rule != "*.wild.test" {
			t.Fatalf("%s: record %+v", name, r)
		}
	}
	if st := s.Stats(); st.Denied != 8 || st.Allowed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRebinding(t *testing.T) {
	s, _, sb := setup(t, Config{})
	for _, c := range []struct{ name, reason string }{
		{"rebind-lo.test", "rebinding: 127.0.0.1 loopback"},
		{"rebind-md.test", "rebinding: 169.254.169.254 link-local"},
		{"rebind-10.test", "rebinding: 10.1.2.3 private"},
	} {
		p := ask(t, s, c.name, dnsmessage.TypeA)
		if p.h.RCode != dnsmessage.RCodeSuccess || len(p.addrs) != 0 {
			t.Fatalf("%s: %+v", c.name, p)
		}
		if r := sb.lastRecord(t); r.Verdict != "deny" || r.Reason != c.reason || r.Addr != "" {
			t.Fatalf("%s: record %+v", c.name, r)
		}
	}
	if len(sb.pinned()) != 0 {
		t.Fatalf("pins %+v", sb.pinned())
	}
	p := ask(t, s, "mixed.test", dnsmessage.TypeA)
	if len(p.addrs) != 1 || p.addrs[0] != netip.MustParseAddr("203.0.113.40") {
		t.Fatalf("mixed: %+v", p)
	}
	if r := sb.lastRecord(t); r.Verdict != "allow" || r.Addr != "203.0.113.40" || !strings.Contains(r.Reason, "127.0.0.1 loopback") {
		t.Fatalf("mixed: record %+v", r)
	}
	if pins := sb.pinned(); len(pins) != 1 || pins[0].addr != p.addrs[0] {
		t.Fatalf("pins %+v", pins)
	}
	// A range a rule names is handed out (the check is per sandbox, on
	// the cached answer).
	sb.mu.Lock()
	sb.ranges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	sb.mu.Unlock()
	if p := ask(t, s, "rebind-10.test", dnsmessage.TypeA); len(p.addrs) != 1 {
		t.Fatalf("rebind-10 with a range rule: %+v", p)
	}
	// The record lists a bounded number of the dropped addresses.
	if p := ask(t, s, "rebind-all.test", dnsmessage.TypeA); len(p.addrs) != 0 {
		t.Fatalf("rebind-all: %+v", p)
	}
	if r := sb.lastRecord(t); r.Verdict != "deny" || !strings.HasSuffix(r.Reason, "192.168.0.8 private, 4 more") {
		t.Fatalf("rebind-all: record %+v", r)
	}
	if st := s.Stats(); st.Rebinding != 5 || st.Allowed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCNAME(t *testing.T) {
	s, _, sb := setup(t, Config{})
	p := ask(t, s, "cname.test", dnsmessage.TypeA)
	if p.h.RCode != dnsmessage.RCodeSuccess || p.other != 0 || len(p.addrs) != 1 ||
		p.addrs[0] != netip.MustParseAddr("203.0.113.50") || p.ttls[0] != 30 {
		t.Fatalf("answer %+v", p)
	}
	if pins := sb.pinned(); len(pins) != 1 || pins[0].name != "cname.test" {
		t.Fatalf("pins %+v", pins)
	}
	// The target is not a name the sandbox may ask for itself.
	if p := ask(t, s, "cdn.elsewhere", dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("target: %+v", p)
	}
	if p := ask(t, s, "loop.test", dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeServerFailure {
		t.Fatalf("loop: %+v", p)
	}
}

func TestTypes(t *testing.T) {
	s, u, sb := setup(t, Config{})
	p := ask(t, s, "allowed.test", dnsmessage.TypeAAAA)
	if p.h.RCode != dnsmessage.RCodeSuccess || len(p.addrs)+p.other != 0 {
		t.Fatalf("AAAA: %+v", p)
	}
	if r := sb.lastRecord(t); r.Verdict != "allow" || !strings.HasPrefix(r.Reason, "AAAA") {
		t.Fatalf("AAAA: record %+v", r)
	}
	for _, typ := range []dnsmessage.Type{dnsmessage.TypeTXT, dnsmessage.TypeMX, dnsmessage.TypeSRV,
		dnsmessage.TypeALL, dnsmessage.TypePTR, dnsmessage.TypeNS, 10 /* NULL */, dnsmessage.TypeCNAME} {
		p := ask(t, s, "allowed.test", typ)
		if p.h.RCode != dnsmessage.RCodeRefused || len(p.addrs)+p.other != 0 {
			t.Fatalf("%v: %+v", typ, p)
		}
		if r := sb.lastRecord(t); r.Verdict != "deny" || !strings.Contains(r.Reason, "not served") {
			t.Fatalf("%v: record %+v", typ, r)
		}
	}
	if n := u.count("udp", "allowed.test"); n != 0 {
		t.Fatalf("forwarded %d", n)
	}
	if p := ask(t, s, "gone.test", dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("upstream NXDOMAIN: %+v", p)
	}
	if p := ask(t, s, "empty.test", dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeSuccess || len(p.addrs) != 0 {
		t.Fatalf("upstream no data: %+v", p)
	}
}

// exchangeTCP sends each message on one connection and returns the
// answers read until the connection ends or wait passes.
func exchangeTCP(t *testing.T, to netip.AddrPort, from netip.Addr, msgs [][]byte, wait time.Duration) ([][]byte, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
	c, err := d.DialContext(t.Context(), "tcp", to.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(wait))
	for _, m := range msgs {
		_, _ = c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(m))))
		_, _ = c.Write(m)
	}
	var out [][]byte
	for {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return out, err
		}
		m := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, m); err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

func TestTCP(t *testing.T) {
	s, _, sb := setup(t, Config{TCPQueries: 3})
	msgs := [][]byte{
		query(t, 1, "allowed.test.", dnsmessage.TypeA, false),
		query(t, 2, "denied.test.", dnsmessage.TypeA, false),
		query(t, 3, "allowed.test.", dnsmessage.TypeTXT, false),
		query(t, 4, "allowed.test.", dnsmessage.TypeA, false), // past TCPQueries
	}
	out, err := exchangeTCP(t, s.tcp, sbAddr, msgs, 5*time.Second)
	// (Closed with the fourth query unread: a reset or an EOF.)
	if !errors.Is(err, io.EOF) && !isReset(err) || len(out) != 3 {
		t.Fatalf("%d answers, then %v", len(out), err)
	}
	want := []dnsmessage.RCode{dnsmessage.RCodeSuccess, dnsmessage.RCodeNameError, dnsmessage.RCodeRefused}
	for i, m := range out {
		if p := parse(t, m); p.h.ID != uint16(i+1) || p.h.RCode != want[i] {
			t.Fatalf("answer %d: %+v", i, p)
		}
	}
	if p := parse(t, out[0]); len(p.addrs) != 2 {
		t.Fatalf("addresses over TCP: %+v", p)
	}
	if len(sb.pinned()) != 2 {
		t.Fatalf("pins %+v", sb.pinned())
	}

	// A length over MaxQuery ends the connection without an answer.
	out, err = exchangeTCP(t, s.tcp, sbAddr, [][]byte{make([]byte, MaxQuery+1)}, 5*time.Second)
	if len(out) != 0 || !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("oversized: %d answers, %v", len(out), err)
	}
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

func TestTCPLimits(t *testing.T) {
	s, _, _ := setup(t, Config{MaxTCPConnsPerSandbox: 2, TCPIdle: 300 * time.Millisecond})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", s.tcp.String())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		held = append(held, c)
	}
	// The third is closed at once (well before TCPIdle).
	c, err := net.Dial("tcp", s.tcp.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("third connection: %v", err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("third connection closed after %v", d)
	}
	// The idle ones are closed after TCPIdle.
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
			t.Fatalf("idle connection: %v", err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("idle connections closed after %v", d)
	}
	if st := s.Stats(); st.RateLimited != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTruncatedUpstream(t *testing.T) {
	s, u, sb := setup(t, Config{})
	p := ask(t, s, "big.test", dnsmessage.TypeA)
	if p.h.RCode != dnsmessage.RCodeSuccess || len(p.addrs) != MaxAnswers {
		t.Fatalf("answer %+v", p)
	}
	if u.count("udp", "big.test") != 1 || u.count("tcp", "big.test") != 1 {
		t.Fatalf("upstream asked udp %d, tcp %d", u.count("udp", "big.test"), u.count("tcp", "big.test"))
	}
	if len(sb.pinned()) != MaxAnswers {
		t.Fatalf("pins %d", len(sb.pinned()))
	}
	// With EDNS0, the answer carries an OPT record and still fits 512.
	m, err := exchangeUDP(t, s.udp, sbAddr, query(t, 9, "big.test.", dnsmessage.TypeA, true), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if p := parse(t, m); !p.opt || len(p.addrs) != MaxAnswers || p.size > 512 {
		t.Fatalf("EDNS answer %+v", p)
	}
}

func TestUpstreamDown(t *testing.T) {
	// A closed port: refused at once, SERVFAIL at once.
	closed, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := closed.LocalAddr().(*net.UDPAddr).AddrPort()
	_ = closed.Close()
	s, _, sb := setup(t, Config{Upstreams: []netip.AddrPort{dead}})
	start := time.Now()
	if p := ask(t, s, "allowed.test", dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeServerFailure {
		t.Fatalf("answer %+v", p)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("SERVFAIL after %v", d)
	}
	if r := sb.lastRecord(t); !strings.HasPrefix(r.Reason, "SERVFAIL") {
		t.Fatalf("record %+v", r)
	}

	// A silent upstream: UpstreamTimeout each, then the next one.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Close() }()
	hole := silent.LocalAddr().(*net.UDPAddr).AddrPort()
	s, u, _ := setup(t, Config{UpstreamTimeout: 300 * time.Millisecond})
	s2 := newServer(t, Config{UpstreamTimeout: 300 * time.Millisecond, Upstreams: []netip.AddrPort{hole, hole}},
		map[netip.Addr]*sandbox{sbAddr: testSandbox()})
	start = time.Now()
	if p := ask(t, s2, "allowed.test", dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeServerFailure {
		t.Fatalf("silent: %+v", p)
	}
	if d := time.Since(start); d < 500*time.Millisecond || d > 2*time.Second {
		t.Fatalf("silent upstreams: SERVFAIL after %v", d)
	}
	_ = s.Close()
	s3 := newServer(t, Config{UpstreamTimeout: 300 * time.Millisecond, Upstreams: []netip.AddrPort{hole, u.addr}},
		map[netip.Addr]*sandbox{sbAddr: testSandbox()})
	if p := ask(t, s3, "allowed.test", dnsmessage.TypeA); len(p.addrs) != 2 {
		t.Fatalf("second upstream: %+v", p)
	}
}

func TestUnknownSource(t *testing.T) {
	s, u, sb := setup(t, Config{})
	if _, err := exchangeUDP(t, s.udp, otherAddr, query(t, 1, "allowed.test.", dnsmessage.TypeA, false), 300*time.Millisecond); !errors.Is(err, errNoAnswer) {
		t.Fatalf("answered a source that is not a sandbox: %v", err)
	}
	out, err := exchangeTCP(t, s.tcp, otherAddr, [][]byte{query(t, 1, "allowed.test.", dnsmessage.TypeA, false)}, 5*time.Second)
	if len(out) != 0 || err == nil {
		t.Fatalf("TCP: %d answers, %v", len(out), err)
	}
	if st := s.Stats(); st.Unknown != 2 || st.Queries != 0 {
		t.Fatalf("stats %+v", st)
	}
	if u.count("udp", "allowed.test") != 0 || len(sb.records()) != 0 {
		t.Fatal("the query went somewhere")
	}
}

func TestRateLimit(t *testing.T) {
	s, u, sb := setup(t, Config{Rate: 10, Burst: 20})
	c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(sbAddr, 0)), net.UDPAddrFromAddrPort(s.udp))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	// A tunnelling burst: many distinct long names under an allowed suffix.
	tunnel := strings.Repeat("x", 60) + "." + strings.Repeat("y", 60)
	const n = 100
	for i := range n {
		if _, err := c.Write(query(t, uint16(i), tunnel+"."+string(rune('a'+i%26))+".wild.test.", dnsmessage.TypeA, false)); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rc := map[dnsmessage.RCode]int{}
	buf := make([]byte, 1024)
	for range n {
		m, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %v: %v", rc, err)
		}
		rc[parse(t, buf[:m]).h.RCode]++
	}
	// The burst (and what refilled meanwhile) is answered, the rest refused.
	if rc[dnsmessage.RCodeRefused] < n-30 || rc[dnsmessage.RCodeRefused] > n-20 {
		t.Fatalf("answers %v", rc)
	}
	var forwarded int
	for i := range 26 {
		forwarded += u.count("udp", tunnel+"."+string(rune('a'+i))+".wild.test")
	}
	if forwarded > 30 {
		t.Fatalf("%d forwarded", forwarded)
	}
	// One summary record for the refused ones, within about a second.
	deadline := time.Now().Add(3 * time.Second)
	for {
		var sum []string
		for _, r := range sb.records() {
			if strings.HasPrefix(r.Reason, "rate limit") {
				sum = append(sum, r.Reason)
			}
		}
		if len(sum) == 1 {
			if want := "rate limit: " + strconv.Itoa(rc[dnsmessage.RCodeRefused]) + " queries refused"; sum[0] != want {
				t.Fatalf("summary %q, want %q", sum[0], want)
			}
			break
		}
		if len(sum) > 1 || time.Now().After(deadline) {
			t.Fatalf("summaries %q", sum)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st := s.Stats()
	if st.RateLimited != uint64(rc[dnsmessage.RCodeRefused]) || st.LongNames == 0 {
		t.Fatalf("stats %+v", st)
	}
	if r := sb.records()[0]; !strings.Contains(r.Reason, "long name (133 bytes, 5 labels)") {
		t.Fatalf("record %+v", r)
	}
}

// TestConcurrentMisses: queries for one name that miss the cache at the
// same time, from several sandboxes, make one upstream query; each
// sandbox gets its answer and its pins.
func TestConcurrentMisses(t *testing.T) {
	u := newUpstream(t, testZones())
	a, b := testSandbox(), testSandbox()
	bAddr := netip.MustParseAddr("127.0.0.3")
	s := newServer(t, Config{Upstreams: []netip.AddrPort{u.addr}}, map[netip.Addr]*sandbox{sbAddr: a, bAddr: b})
	errs := make(chan error, 10)
	for i := range 10 {
		from := sbAddr
		if i%2 == 1 {
			from = bAddr
		}
		go func() {
			m, err := exchangeUDP(t, s.udp, from, query(t, uint16(i), "slow.test.", dnsmessage.TypeA, false), 5*time.Second)
			if err == nil && len(parse(t, m).addrs) != 1 {
				err = errors.New("no address")
			}
			errs <- err
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := u.count("udp", "slow.test"); n != 1 {
		t.Fatalf("upstream asked %d times", n)
	}
	if len(a.pinned()) != 5 || len(b.pinned()) != 5 {
		t.Fatalf("pins %d and %d", len(a.pinned()), len(b.pinned()))
	}
}

// TestTCPRateLimit: queries over TCP draw on the same bucket as over UDP.
func TestTCPRateLimit(t *testing.T) {
	s, _, sb := setup(t, Config{Rate: 0.001, Burst: 2, TCPQueries: 3})
	if p := ask(t, s, "allowed.test", dnsmessage.TypeA); p.h.RCode != dnsmessage.RCodeSuccess {
		t.Fatalf("UDP: %+v", p)
	}
	msgs := [][]byte{
		query(t, 1, "allowed.test.", dnsmessage.TypeA, false),
		query(t, 2, "allowed.test.", dnsmessage.TypeA, false),
		query(t, 3, "denied.test.", dnsmessage.TypeA, false),
	}
	out, _ := exchangeTCP(t, s.tcp, sbAddr, msgs, 5*time.Second)
	var got []dnsmessage.RCode
	for _, m := range out {
		got = append(got, parse(t, m).h.RCode)
	}
	want := []dnsmessage.RCode{dnsmessage.RCodeSuccess, dnsmessage.RCodeRefused, dnsmessage.RCodeRefused}
	if !slices.Equal(got, want) {
		t.Fatalf("answers %v, want %v", got, want)
	}
	_ = s.Close()
	if rs := sb.records(); rs[len(rs)-1].Reason != "rate limit: 2 queries refused" {
		t.Fatalf("records %+v", rs)
	}
}
