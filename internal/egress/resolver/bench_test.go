package resolver

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/warren-sandbox/warren/internal/egress"
)

// BenchmarkCachedAnswer is one query for an allowed, cached name and its
// answer over UDP on loopback, as a sandbox's stub resolver sees it (the
// target is 0.5 ms): the policy check, the pins and the log record are
// made for each query.
func BenchmarkCachedAnswer(b *testing.B) {
	u := newUpstream(b, testZones())
	sb := &discardSandbox{sandbox: *testSandbox()}
	s, err := New(Config{
		Lookup:    func(netip.Addr) Sandbox { return sb },
		Upstreams: []netip.AddrPort{u.addr},
		Rate:      1e9, Burst: 1e9,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = s.ServeUDP(pc) }()
	c, err := net.DialUDP("udp", nil, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	q := query(b, 1, "allowed.test.", dnsmessage.TypeA, false)
	buf := make([]byte, 1024)
	ask := func() {
		if _, err := c.Write(q); err != nil {
			b.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
	ask() // fills the cache
	b.ResetTimer()
	for b.Loop() {
		ask()
	}
	b.StopTimer()
	if st := s.Stats(); st.CacheMisses != 1 {
		b.Fatalf("stats %+v", st)
	}
}

// discardSandbox keeps no pins or records (a benchmark makes millions).
type discardSandbox struct{ sandbox }

func (*discardSandbox) Pin(string, []netip.Addr, time.Duration) error { return nil }
func (*discardSandbox) Record(egress.Record)                          {}
