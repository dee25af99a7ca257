package resolver

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/warren-sandbox/warren/internal/egress"
)

// zone is one name of the fake upstream's authoritative data.
type zone struct {
	cname string   // answer a CNAME to this name (and what it holds)
	addrs []string // A records
	ttl   uint32
	tc    bool // over UDP, answer truncated (with no records)
	nx    bool
	delay time.Duration // before answering
}

// upstream is an authoritative DNS server on 127.0.0.1 (UDP and TCP on one
// port) standing in for the host's resolvers.
type upstream struct {
	addr  netip.AddrPort
	zones map[string]zone

	mu      sync.Mutex
	queries map[string]int // by "udp name" / "tcp name"
}

func newUpstream(t testing.TB, zones map[string]zone) *upstream {
	t.Helper()
	u := &upstream{zones: zones, queries: make(map[string]int)}
	var pc net.PacketConn
	var ln net.Listener
	for i := 0; ; i++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		_ = pc.Close()
		if i == 20 {
			t.Fatal(err)
		}
	}
	u.addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	t.Cleanup(func() { _ = pc.Close(); _ = ln.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			go func(m []byte) {
				if out := u.answer(m, false); out != nil {
					_, _ = pc.WriteTo(out, from)
				}
			}(append([]byte(nil), buf[:n]...))
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				m := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, m); err != nil {
					return
				}
				out := u.answer(m, true)
				_, _ = c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(out))))
				_, _ = c.Write(out)
			}()
		}
	}()
	return u
}

func (u *upstream) count(transport, name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.queries[transport+" "+name]
}

func (u *upstream) answer(msg []byte, tcp bool) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.TrimSuffix(q.Name.String(), ".")
	tr := "udp"
	if tcp {
		tr = "tcp"
	}
	u.mu.Lock()
	u.queries[tr+" "+name]++
	u.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true}
	z, ok := u.zones[name]
	time.Sleep(z.delay)
	if !ok || z.nx {
		rh.RCode = dnsmessage.RCodeNameError
	}
	if z.tc && !tcp {
		rh.Truncated = true
	}
	b := dnsmessage.NewBuilder(nil, rh)
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	for at, hops := name, 0; ok && !rh.Truncated && hops < 20; hops++ {
		if z.cname != "" {
			_ = b.CNAMEResource(dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(at + "."), Class: dnsmessage.ClassINET, TTL: z.ttl},
				dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(z.cname + ".")})
			at = z.cname
			z, ok = u.zones[at]
			continue
		}
		for _, a := range z.addrs {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(at + "."), Class: dnsmessage.ClassINET, TTL: z.ttl},
				dnsmessage.AResource{A: netip.MustParseAddr(a).As4()})
		}
		break
	}
	out, err := b.Finish()
	if err != nil {
		panic(err)
	}
	return out
}

// sandbox is a stand-in for *egress.Sandbox: exact names and "*.suffix"
// rules, the special ranges refused unless a prefix is allowed.
type sandbox struct {
	allow  []string
	ranges []netip.Prefix

	mu     sync.Mutex
	pins   []pin
	log    []egress.Record
	pinErr error // what Pin answers (the host's gate failing)
}

type pin struct {
	name string
	addr netip.Addr
	ttl  time.Duration
}

func (s *sandbox) AllowName(name string) (string, bool) {
	for _, r := range s.allow {
		if r == name || strings.HasPrefix(r, "*.") && strings.HasSuffix(name, r[1:]) {
			return r, true
		}
	}
	return "", false
}

func (s *sandbox) Rebinding(_ string, a netip.Addr) (string, bool) {
	s.mu.Lock()
	ranges := s.ranges
	s.mu.Unlock()
	for _, p := range ranges {
		if p.Contains(a) {
			return "", false
		}
	}
	switch {
	case a.IsLoopback():
		return "loopback", true
	case a.IsLinkLocalUnicast():
		return "link-local", true
	case a.IsPrivate():
		return "private", true
	case a.IsUnspecified():
		return "unspecified", true
	}
	return "", false
}

func (s *sandbox) Pin(name string, as []netip.Addr, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pinErr != nil {
		return s.pinErr
	}
	for _, a := range as {
		s.pins = append(s.pins, pin{name, a, ttl})
	}
	return nil
}

func (s *sandbox) Record(r egress.Record) {
	s.mu.Lock()
	s.log = append(s.log, r)
	s.mu.Unlock()
}

func (s *sandbox) records() []egress.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]egress.Record(nil), s.log...)
}

func (s *sandbox) pinned() []pin {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]pin(nil), s.pins...)
}

// lastRecord is the newest log record, failing the test if there is none.
func (s *sandbox) lastRecord(t *testing.T) egress.Record {
	t.Helper()
	rs := s.records()
	if len(rs) == 0 {
		t.Fatal("no log record")
	}
	return rs[len(rs)-1]
}

// server is a resolver serving UDP and TCP on 127.0.0.1, where the
// sandboxes are the source addresses in sbs.
type server struct {
	*Server
	udp, tcp netip.AddrPort
}

func newServer(t testing.TB, cfg Config, sbs map[netip.Addr]*sandbox) *server {
	t.Helper()
	cfg.Lookup = func(src netip.Addr) Sandbox {
		if sb := sbs[src]; sb != nil {
			return sb
		}
		return nil
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { errs <- s.ServeUDP(pc) }()
	go func() { errs <- s.ServeTCP(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	})
	return &server{s, pc.LocalAddr().(*net.UDPAddr).AddrPort(), ln.Addr().(*net.TCPAddr).AddrPort()}
}

// query packs a query for name and type t (with an EDNS0 record if edns).
func query(t testing.TB, id uint16, name string, typ dnsmessage.Type, edns bool) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	if edns {
		_ = b.StartAdditionals()
		var rh dnsmessage.ResourceHeader
		_ = rh.SetEDNS0(1232, dnsmessage.RCodeSuccess, false)
		_ = b.OPTResource(rh, dnsmessage.OPTResource{})
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var errNoAnswer = errors.New("no answer")

// exchangeUDP sends msg from the address from and returns the answer, or
// errNoAnswer after wait.
func exchangeUDP(t testing.TB, to netip.AddrPort, from netip.Addr, msg []byte, wait time.Duration) ([]byte, error) {
	t.Helper()
	c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, errNoAnswer
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n], nil
}

// parsed is an answer as the tests look at it.
type parsed struct {
	h     dnsmessage.Header
	qs    []dnsmessage.Question
	addrs []netip.Addr
	ttls  []uint32
	other int // answer records that are not A
	opt   bool
	size  int
}

func parse(t testing.TB, m []byte) parsed {
	t.Helper()
	var msg dnsmessage.Message
	if err := msg.Unpack(m); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	p := parsed{h: msg.Header, qs: msg.Questions, size: len(m)}
	for _, r := range msg.Answers {
		if a, ok := r.Body.(*dnsmessage.AResource); ok {
			p.addrs = append(p.addrs, netip.AddrFrom4(a.A))
			p.ttls = append(p.ttls, r.Header.TTL)
		} else {
			p.other++
		}
	}
	for _, r := range msg.Additionals {
		if r.Header.Type == dnsmessage.TypeOPT {
			p.opt = true
		}
	}
	return p
}
