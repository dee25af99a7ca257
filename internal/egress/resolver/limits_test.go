package resolver

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// TestInFlightLimits: a sandbox whose queries hang upstream gets REFUSED
// past its in-flight share, and a cache miss past the global upstream
// bound gets SERVFAIL at once, not after the timeout.
func TestInFlightLimits(t *testing.T) {
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Close() }()
	hole := silent.LocalAddr().(*net.UDPAddr).AddrPort()
	a, b := testSandbox(), testSandbox()
	bAddr := netip.MustParseAddr("127.0.0.3")
	s := newServer(t, Config{Upstreams: []netip.AddrPort{hole}, UpstreamTimeout: 2 * time.Second,
		MaxInFlightPerSandbox: 1, MaxUpstream: 1}, map[netip.Addr]*sandbox{sbAddr: a, bAddr: b})

	hung := make(chan error, 1)
	go func() {
		_, err := exchangeUDP(t, s.udp, sbAddr, query(t, 1, "allowed.test.", dnsmessage.TypeA, false), 5*time.Second)
		hung <- err
	}()
	waitFor(t, func() bool { return s.Stats().CacheMisses == 1 })

	start := time.Now()
	m, err := exchangeUDP(t, s.udp, sbAddr, query(t, 2, "short.test.", dnsmessage.TypeA, false), time.Second)
	if err != nil || parse(t, m).h.RCode != dnsmessage.RCodeRefused {
		t.Fatalf("second query of the same sandbox: %v", err)
	}
	m, err = exchangeUDP(t, s.udp, bAddr, query(t, 3, "long.test.", dnsmessage.TypeA, false), time.Second)
	if err != nil || parse(t, m).h.RCode != dnsmessage.RCodeServerFailure {
		t.Fatalf("another sandbox's miss: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("answered after %v", d)
	}
	if r := b.lastRecord(t); !strings.Contains(r.Reason, errBusy.Error()) {
		t.Fatalf("record %+v", r)
	}
	// The sandbox's cached and denied names are still answered by the
	// other sandbox meanwhile.
	m, err = exchangeUDP(t, s.udp, bAddr, query(t, 4, "denied.test.", dnsmessage.TypeA, false), time.Second)
	if err != nil || parse(t, m).h.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("denied name: %v", err)
	}
	if err := <-hung; err != nil {
		t.Fatalf("hung query: %v", err) // SERVFAIL after the timeout
	}
	if st := s.Stats(); st.RateLimited != 1 || st.ServFail != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestForget: a gone sandbox's refused queries are logged when its
// address is forgotten, and its bucket does not carry over.
func TestForget(t *testing.T) {
	now := time.Unix(1e9, 0)
	cfg := Config{Rate: 1, Burst: 2, Now: func() time.Time { return now }}
	cfg.defaults()
	l := newLimits(&cfg)
	sb := testSandbox()
	src := netip.MustParseAddr("10.201.0.2")
	var got []bool
	for range 5 {
		ok := l.admit(src, sb, now)
		got = append(got, ok)
		if ok {
			l.release(src)
		}
	}
	if !slices.Equal(got, []bool{true, true, false, false, false}) {
		t.Fatalf("admitted %v", got)
	}
	l.forget(src)
	if rs := sb.records(); len(rs) != 1 || rs[0].Reason != "rate limit: 3 queries refused" || rs[0].Verdict != "deny" {
		t.Fatalf("records %+v", rs)
	}
	if !l.admit(src, testSandbox(), now) {
		t.Fatal("the next sandbox at the address starts with an empty bucket")
	}
	// Half a second later, half a token: not enough.
	l.release(src)
	if !l.admit(src, sb, now) || l.admit(src, sb, now.Add(time.Second/2)) {
		t.Fatal("refill")
	}
}

// TestBoundedState: the cache and the per-source state stay within their
// bounds whatever the number of names and sources.
func TestBoundedState(t *testing.T) {
	now := time.Unix(1e9, 0)
	c := newCache(16)
	for i := range 1000 {
		c.put(fmt.Sprint(i, ".test"), &answer{expires: now.Add(time.Minute)}, now)
	}
	if len(c.m) != 16 {
		t.Fatalf("cache holds %d", len(c.m))
	}
	if c.get("999.test", now) == nil || c.get("999.test", now.Add(time.Minute)) != nil {
		t.Fatal("the newest entry, expiring")
	}
	c.evictExpired(now.Add(time.Minute))
	if len(c.m) != 0 {
		t.Fatalf("expired entries kept: %d", len(c.m))
	}

	cfg := Config{MaxSandboxes: 8}
	cfg.defaults()
	l := newLimits(&cfg)
	sb := testSandbox()
	for i := range 100 {
		src := netip.AddrFrom4([4]byte{10, 201, 0, byte(i)})
		if !l.admit(src, sb, now) {
			t.Fatal("refused a fresh source")
		}
		l.release(src)
	}
	if len(l.m) > 8 {
		t.Fatalf("state for %d sources", len(l.m))
	}
	l.evictIdle(now.Add(2 * idleState))
	if len(l.m) != 0 {
		t.Fatalf("idle state kept: %d", len(l.m))
	}
}

func TestResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("# comment\nsearch example\nnameserver 192.0.2.1\nnameserver ::ffff:192.0.2.2\nnameserver fe80::1%eth0\nnameserver bogus\noptions ndots:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readResolvConf(p)
	want := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:53"), netip.MustParseAddrPort("192.0.2.2:53"), netip.MustParseAddrPort("[fe80::1%eth0]:53")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%v %v", got, err)
	}
	if err := os.WriteFile(p, []byte("search example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Lookup: func(netip.Addr) Sandbox { return nil }, ResolvConf: p}); err == nil {
		t.Fatal("no nameserver: no error")
	}
}

// TestClose: Close ends the queries waiting on an upstream and the TCP
// connections at once, and the Serve methods return nil.
func TestClose(t *testing.T) {
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Close() }()
	sb := testSandbox()
	s, err := New(Config{
		Lookup:          func(netip.Addr) Sandbox { return sb },
		Upstreams:       []netip.AddrPort{silent.LocalAddr().(*net.UDPAddr).AddrPort()},
		UpstreamTimeout: time.Minute,
	})
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
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write(query(t, 1, "allowed.test.", dnsmessage.TypeA, false)); err != nil {
		t.Fatal(err)
	}
	tc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tc.Close() }()
	waitFor(t, func() bool { return s.Stats().CacheMisses == 1 })

	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("serve: %v", err)
		}
	}
	_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := tc.Read(make([]byte, 1)); err == nil {
		t.Fatal("TCP connection open after Close")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v", d)
	}
	if err := s.ServeUDP(pc); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ServeUDP after Close: %v", err)
	}
}
