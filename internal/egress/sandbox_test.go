package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable time for pins and records.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestSandbox(t testing.TB, rules ...string) (*Sandbox, *clock) {
	c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := NewSandbox("ns", "box", mustCompile(t, rules...))
	s.now = c.now
	return s, c
}

var ip = netip.MustParseAddr
var ap = netip.MustParseAddrPort

var testRules = []string{
	"allowed.test",
	"*.wild.test",
	"ssh.test:22",
	"shared-a.test",
	"203.0.113.50:5432",
	"10.20.0.0/16:6379",
}

// TestDecide is the connection matrix. Each case starts from a fresh
// sandbox with testRules and the pins given.
func TestDecide(t *testing.T) {
	type pin struct{ name, addr string }
	cases := []struct {
		name       string
		rules      []string // nil: testRules
		pins       []pin
		dst        string
		wire, kind string
		allow      bool
		rule       string // the verdict's rule when allowed
		vname      string // the verdict's name when allowed
		reason     string // a piece of the reason
	}{
		{name: "allowed name over TLS", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:443", wire: "allowed.test", kind: "tls", allow: true, rule: "allowed.test", vname: "allowed.test"},
		{name: "allowed name over HTTP, Host in capitals", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:80", wire: "Allowed.Test.", kind: "http", allow: true, rule: "allowed.test", vname: "allowed.test"},
		{name: "mapped destination", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "[::ffff:203.0.113.10]:443", wire: "allowed.test", kind: "tls", allow: true, rule: "allowed.test"},
		{name: "denied SNI on an allowed name's address", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:443", wire: "evil.test", kind: "tls", reason: "SNI evil.test not allowed"},
		{name: "denied Host on an allowed name's address", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:80", wire: "evil.test", kind: "http", reason: "Host evil.test not allowed"},
		{name: "TLS without SNI", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:443", kind: "tls", reason: "TLS without a name"},
		{name: "HTTP without Host", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:80", kind: "http", reason: "HTTP without a name"},
		{name: "Host that is no host name", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:80", wire: "allowed.test:80", kind: "http", reason: `Host "allowed.test:80" is not a host name`},
		{name: "opaque protocol on 443", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:443", reason: "unrecognised protocol on port 443"},
		{name: "opaque protocol on 80", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:80", reason: "unrecognised protocol on port 80"},
		{name: "unknown wire kind", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:443", wire: "allowed.test", kind: "ssh", reason: `unknown protocol kind ssh`},
		{name: "IP literal of an allowed name's address, never resolved",
			dst: "203.0.113.10:443", wire: "allowed.test", kind: "tls", reason: "address 203.0.113.10 not resolved by this sandbox"},
		{name: "address resolved for another name only", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.11:443", wire: "allowed.test", kind: "tls", reason: "address 203.0.113.11 not resolved by this sandbox"},
		{name: "shared address, SNI of the denied name", pins: []pin{{"shared-a.test", "203.0.113.9"}},
			dst: "203.0.113.9:443", wire: "shared-b.test", kind: "tls", reason: "SNI shared-b.test not allowed"},
		{name: "shared address, Host of the denied name", pins: []pin{{"shared-a.test", "203.0.113.9"}},
			dst: "203.0.113.9:80", wire: "shared-b.test", kind: "http", reason: "Host shared-b.test not allowed"},
		{name: "shared address, SNI of an allowed name not resolved there",
			rules: []string{"shared-a.test", "shared-b.test"}, pins: []pin{{"shared-a.test", "203.0.113.9"}},
			dst: "203.0.113.9:443", wire: "shared-b.test", kind: "tls", reason: "SNI shared-b.test not pinned to 203.0.113.9"},
		{name: "shared address, both resolved",
			rules: []string{"shared-a.test", "shared-b.test"}, pins: []pin{{"shared-a.test", "203.0.113.9"}, {"shared-b.test", "203.0.113.9"}},
			dst: "203.0.113.9:443", wire: "shared-b.test", kind: "tls", allow: true, rule: "shared-b.test", vname: "shared-b.test"},
		{name: "wildcard", pins: []pin{{"a.b.wild.test", "203.0.113.20"}},
			dst: "203.0.113.20:443", wire: "a.b.wild.test", kind: "tls", allow: true, rule: "*.wild.test", vname: "a.b.wild.test"},
		{name: "wildcard's bare suffix", pins: []pin{{"a.wild.test", "203.0.113.20"}},
			dst: "203.0.113.20:443", wire: "wild.test", kind: "tls", reason: "SNI wild.test not allowed"},
		{name: "port rule, opaque protocol", pins: []pin{{"ssh.test", "203.0.113.22"}},
			dst: "203.0.113.22:22", allow: true, rule: "ssh.test:22", vname: "ssh.test"},
		{name: "port rule, TLS on its port", pins: []pin{{"ssh.test", "203.0.113.22"}},
			dst: "203.0.113.22:22", wire: "ssh.test", kind: "tls", allow: true, rule: "ssh.test:22"},
		{name: "port rule, other port", pins: []pin{{"ssh.test", "203.0.113.22"}},
			dst: "203.0.113.22:443", wire: "ssh.test", kind: "tls", reason: "no name resolved to 203.0.113.22 is allowed at port 443"},
		{name: "default ports only", pins: []pin{{"allowed.test", "203.0.113.10"}},
			dst: "203.0.113.10:22", reason: "no name resolved to 203.0.113.10 is allowed at port 22"},
		{name: "SNI allowed at other ports only", pins: []pin{{"ssh.test", "203.0.113.30"}, {"allowed.test", "203.0.113.30"}},
			dst: "203.0.113.30:22", wire: "allowed.test", kind: "tls", reason: "SNI allowed.test not allowed at port 22"},
		{name: "address rule", dst: "203.0.113.50:5432", allow: true, rule: "203.0.113.50:5432"},
		{name: "address rule wins over protocol checks", dst: "203.0.113.50:5432", wire: "evil.test", kind: "tls", allow: true, rule: "203.0.113.50:5432"},
		{name: "address rule's other port", dst: "203.0.113.50:5433", reason: "address 203.0.113.50 not resolved by this sandbox"},
		{name: "CIDR rule on a private range", dst: "10.20.3.4:6379", allow: true, rule: "10.20.0.0/16:6379"},
		{name: "named private range, a resolved name on another port", pins: []pin{{"allowed.test", "10.20.5.5"}},
			dst: "10.20.5.5:443", wire: "allowed.test", kind: "tls", allow: true, rule: "allowed.test"},
		{name: "private range not named", dst: "10.30.0.1:6379", reason: "address 10.30.0.1 is private"},
		{name: "loopback literal", dst: "127.0.0.1:8080", reason: "address 127.0.0.1 is loopback"},
		{name: "metadata literal", dst: "169.254.169.254:80", wire: "allowed.test", kind: "http", reason: "address 169.254.169.254 is cloud metadata"},
		{name: "metadata, mapped", dst: "[::ffff:169.254.169.254]:80", reason: "address 169.254.169.254 is cloud metadata"},
		{name: "stale pin to loopback", pins: []pin{{"allowed.test", "127.0.0.1"}},
			dst: "127.0.0.1:443", wire: "allowed.test", kind: "tls", reason: "address 127.0.0.1 is loopback"},
		{name: "IPv6 ULA", dst: "[fd00::1]:443", reason: "address fd00::1 is unique local (private)"},
		{name: "invalid destination", dst: "", reason: "invalid destination"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rules := c.rules
			if rules == nil {
				rules = testRules
			}
			s, _ := newTestSandbox(t, rules...)
			for _, p := range c.pins {
				_ = s.Pin(p.name, []netip.Addr{ip(p.addr)}, time.Minute)
			}
			var dst netip.AddrPort
			if c.dst != "" {
				dst = ap(c.dst)
			}
			v := s.Decide(dst, c.wire, c.kind)
			if v.Allow != c.allow {
				t.Fatalf("Decide = %+v, want allow=%v", v, c.allow)
			}
			if c.allow {
				if v.Rule != c.rule || (c.vname != "" && v.Name != c.vname) {
					t.Fatalf("Decide = %+v, want rule %q name %q", v, c.rule, c.vname)
				}
				return
			}
			if v.Rule != "" || !strings.Contains(v.Reason, c.reason) {
				t.Fatalf("Decide = %+v, want a denial saying %q", v, c.reason)
			}
		})
	}
}

func TestDecideIsPerSandbox(t *testing.T) {
	a, _ := newTestSandbox(t, testRules...)
	b, _ := newTestSandbox(t, testRules...)
	_ = b.Pin("allowed.test", []netip.Addr{ip("203.0.113.10")}, time.Hour)
	if v := a.Decide(ap("203.0.113.10:443"), "allowed.test", "tls"); v.Allow {
		t.Fatalf("a sandbox uses another's pin: %+v", v)
	}
	if v := b.Decide(ap("203.0.113.10:443"), "allowed.test", "tls"); !v.Allow {
		t.Fatalf("the resolving sandbox is denied: %+v", v)
	}
}

func TestRebinding(t *testing.T) {
	defer SetHostLocal(nil)
	SetHostLocal([]netip.Prefix{netip.MustParsePrefix("10.201.0.0/16")})
	s, _ := newTestSandbox(t, "allowed.test", "10.0.0.0/8:6379", "10.201.0.6:8080")
	cases := []struct {
		addr string
		why  string // "" = not refused
	}{
		{"203.0.113.10", ""},
		{"198.18.0.1", ""},
		{"127.0.0.1", "allowed.test resolves to 127.0.0.1, which is loopback"},
		{"::ffff:127.0.0.1", "allowed.test resolves to 127.0.0.1, which is loopback"},
		{"169.254.169.254", "cloud metadata"},
		{"192.168.1.1", "private"},
		{"172.16.0.1", "private"},
		{"100.64.1.1", "CGNAT"},
		{"0.0.0.0", "unspecified"},
		{"::1", "loopback"},
		{"10.20.9.9", ""},            // the user named 10.20/16
		{"10.201.0.2", "host-local"}, // a broad rule never opens host-local
		{"10.201.0.6", ""},           // a rule for exactly this address does
	}
	for _, c := range cases {
		why, refused := s.Rebinding("Allowed.Test", ip(c.addr))
		if refused != (c.why != "") || !strings.Contains(why, c.why) {
			t.Errorf("Rebinding(%s) = (%q, %v), want %q", c.addr, why, refused, c.why)
		}
	}
}

func TestAllowName(t *testing.T) {
	s, _ := newTestSandbox(t, testRules...)
	for name, want := range map[string]string{
		"allowed.test": "allowed.test", "ssh.test": "ssh.test:22", "x.wild.test": "*.wild.test",
		"evil.test": "", "wild.test": "",
	} {
		if rule, ok := s.AllowName(name); rule != want || ok != (want != "") {
			t.Errorf("AllowName(%s) = (%q, %v), want %q", name, rule, ok, want)
		}
	}
	empty := NewSandbox("ns", "n", nil)
	if _, ok := empty.AllowName("allowed.test"); ok {
		t.Fatal("a sandbox without a policy allows a name")
	}
	if v := empty.Decide(ap("203.0.113.50:5432"), "", ""); v.Allow {
		t.Fatal("a sandbox without a policy allows an address")
	}
}

func TestLivePolicyChange(t *testing.T) {
	s, c := newTestSandbox(t, testRules...)
	_ = s.Pin("allowed.test", []netip.Addr{ip("203.0.113.10")}, time.Minute)
	if v := s.Decide(ap("203.0.113.10:443"), "allowed.test", "tls"); !v.Allow {
		t.Fatalf("before the change: %+v", v)
	}
	c.add(time.Second)
	s.SetPolicy(mustCompile(t, "other.test", "*.Wild.test"))
	if v := s.Decide(ap("203.0.113.10:443"), "allowed.test", "tls"); v.Allow ||
		!strings.Contains(v.Reason, "no name resolved to 203.0.113.10 is allowed at port 443") {
		t.Fatalf("after removing the rule: %+v", v)
	}
	if _, ok := s.AllowName("allowed.test"); ok {
		t.Fatal("the resolver still allows a removed name")
	}
	if got := s.Policy().Rules(); !slices.Equal(got, []string{"other.test", "*.wild.test"}) {
		t.Fatalf("Policy().Rules() = %q", got)
	}
	// The pin outlived the change: putting the rule back reopens it.
	s.SetPolicy(mustCompile(t, "allowed.test"))
	if v := s.Decide(ap("203.0.113.10:443"), "allowed.test", "tls"); !v.Allow {
		t.Fatalf("after restoring the rule: %+v", v)
	}
	s.SetPolicy(nil)
	if v := s.Decide(ap("203.0.113.10:443"), "allowed.test", "tls"); v.Allow {
		t.Fatalf("after emptying the policy: %+v", v)
	}
	log := s.Log(0, 0)
	if len(log) != 3 {
		t.Fatalf("log has %d records, want 3 policy records: %+v", len(log), log)
	}
	r := log[0]
	if r.Kind != "policy" || r.Verdict != "set" || !slices.Equal(r.Rules, []string{"other.test", "*.wild.test"}) ||
		r.Namespace != "ns" || r.Sandbox != "box" || !r.Time.Equal(c.now()) || r.Seq != 1 {
		t.Fatalf("policy record %+v", r)
	}
	if len(log[2].Rules) != 0 || log[2].Reason != "0 rules" {
		t.Fatalf("empty policy record %+v", log[2])
	}
	if n := len(s.Counts()); n != 0 {
		t.Fatalf("policy records were counted: %v", s.Counts())
	}
}

func TestPinExpiry(t *testing.T) {
	s, c := newTestSandbox(t, testRules...)
	_ = s.Pin("allowed.test", []netip.Addr{ip("203.0.113.10")}, time.Second) // kept MinPinTTL
	_ = s.Pin("ssh.test", []netip.Addr{ip("203.0.113.22")}, time.Hour)
	_ = s.Pin("x.wild.test", []netip.Addr{ip("203.0.113.20")}, 10*365*24*time.Hour) // cut to MaxPinTTL
	_ = s.Pin("not a name", []netip.Addr{ip("203.0.113.23")}, time.Hour)            // ignored
	_ = s.Pin("allowed.test", []netip.Addr{{}}, time.Hour)                          // ignored
	allowed := func(dst, name, kind string) bool { return s.Decide(ap(dst), name, kind).Allow }

	c.add(MinPinTTL - time.Second)
	if !allowed("203.0.113.10:443", "allowed.test", "tls") {
		t.Fatal("a short-TTL pin expired before MinPinTTL")
	}
	if got := s.PinnedNames(ip("::ffff:203.0.113.10")); !slices.Equal(got, []string{"allowed.test"}) {
		t.Fatalf("PinnedNames = %q", got)
	}
	if got := s.PinnedNames(ip("203.0.113.23")); len(got) != 0 {
		t.Fatalf("an invalid name was pinned: %q", got)
	}
	c.add(time.Second)
	if allowed("203.0.113.10:443", "allowed.test", "tls") {
		t.Fatal("a pin outlived MinPinTTL")
	}
	if got := s.PinnedNames(ip("203.0.113.10")); len(got) != 0 {
		t.Fatalf("PinnedNames of an expired pin = %q", got)
	}
	// A new answer renews it; a shorter one does not shorten the longer.
	_ = s.Pin("ssh.test", []netip.Addr{ip("203.0.113.22")}, time.Second)
	c.add(time.Hour - MinPinTTL - time.Second)
	if !allowed("203.0.113.22:22", "", "") {
		t.Fatal("a shorter re-pin cut a longer pin")
	}
	c.add(time.Second)
	if allowed("203.0.113.22:22", "", "") {
		t.Fatal("a one-hour pin outlived its hour")
	}
	c.add(MaxPinTTL - time.Hour - time.Second)
	if !allowed("203.0.113.20:443", "x.wild.test", "tls") {
		t.Fatal("a long pin expired before MaxPinTTL")
	}
	c.add(time.Second)
	if allowed("203.0.113.20:443", "x.wild.test", "tls") {
		t.Fatal("a pin outlived MaxPinTTL")
	}
}

func TestPinBound(t *testing.T) {
	s, c := newTestSandbox(t, "*.many.test")
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}) }
	for i := range MaxPins + 10 {
		_ = s.Pin(fmt.Sprintf("h%d.many.test", i), []netip.Addr{addr(i)}, time.Hour)
		c.add(time.Millisecond) // later pins expire later
	}
	if s.npins != MaxPins {
		t.Fatalf("%d pins, want the bound %d", s.npins, MaxPins)
	}
	for i := range 10 {
		if got := s.PinnedNames(addr(i)); len(got) != 0 {
			t.Fatalf("pin %d (among the oldest) survived: %q", i, got)
		}
	}
	for _, i := range []int{10, MaxPins / 2, MaxPins + 9} {
		if got := s.PinnedNames(addr(i)); !slices.Equal(got, []string{fmt.Sprintf("h%d.many.test", i)}) {
			t.Fatalf("pin %d lost: %q", i, got)
		}
	}
	// At the bound, expired pins go first, all at once.
	c.add(time.Hour - 100*time.Millisecond)
	_ = s.Pin("new.many.test", []netip.Addr{addr(60000)}, time.Hour)
	if s.npins > MaxPins-50 {
		t.Fatalf("%d pins after the oldest expired, want the expired ones swept", s.npins)
	}
	if got := s.PinnedNames(addr(60000)); len(got) != 1 {
		t.Fatalf("the new pin is missing: %q", got)
	}
}

func TestLogRing(t *testing.T) {
	s, c := newTestSandbox(t)
	at := c.now()
	for i := 1; i <= LogSize+500; i++ {
		v := "allow"
		if i%3 == 0 {
			v = "deny"
		}
		s.Record(Record{Kind: "tcp", Verdict: v, Name: fmt.Sprint(i), Namespace: "spoofed", Sandbox: "spoofed"})
	}
	s.Record(Record{Kind: "dns", Verdict: "deny", Time: at.Add(time.Hour)})
	last := uint64(LogSize + 501)

	all := s.Log(0, 0)
	if len(all) != LogSize || all[0].Seq != last-LogSize+1 || all[len(all)-1].Seq != last {
		t.Fatalf("Log(0, 0): %d records, seq %d..%d", len(all), all[0].Seq, all[len(all)-1].Seq)
	}
	for i, r := range all {
		if r.Seq != all[0].Seq+uint64(i) {
			t.Fatalf("record %d has seq %d", i, r.Seq)
		}
		if r.Namespace != "ns" || r.Sandbox != "box" {
			t.Fatalf("record %d names %s/%s", i, r.Namespace, r.Sandbox)
		}
	}
	if r := all[0]; r.Name != fmt.Sprint(r.Seq) || !r.Time.Equal(at) {
		t.Fatalf("oldest record %+v", r)
	}
	if r := all[len(all)-1]; r.Kind != "dns" || !r.Time.Equal(at.Add(time.Hour)) {
		t.Fatalf("a record's own time was replaced: %+v", r)
	}
	for _, c := range []struct {
		since    uint64
		limit    int
		first, n uint64
	}{
		{0, 10, last - LogSize + 1, 10},
		{1400, 0, 1401, last - 1400},
		{1400, 5, 1401, 5},
		{last - 1, 0, last, 1},
		{last, 0, 0, 0},
		{last + 100, 0, 0, 0},
		{0, -1, last - LogSize + 1, LogSize},
		{0, 1 << 30, last - LogSize + 1, LogSize},
	} {
		got := s.Log(c.since, c.limit)
		if uint64(len(got)) != c.n || (c.n > 0 && (got[0].Seq != c.first || got[len(got)-1].Seq != c.first+c.n-1)) {
			t.Errorf("Log(%d, %d): %d records from %v", c.since, c.limit, len(got), got[:min(len(got), 1)])
		}
		if got == nil {
			t.Errorf("Log(%d, %d) is nil", c.since, c.limit)
		}
	}
	want := map[string]Count{"tcp": {Allowed: 1000, Denied: 500}, "dns": {Denied: 1}}
	got := s.Counts()
	if len(got) != len(want) || got["tcp"] != want["tcp"] || got["dns"] != want["dns"] {
		t.Fatalf("Counts() = %v, want %v", got, want)
	}
	got["tcp"] = Count{}
	if s.Counts()["tcp"] != want["tcp"] {
		t.Fatal("Counts() exposes the sandbox's map")
	}
	if len(s.ring) != LogSize {
		t.Fatalf("the ring holds %d records", len(s.ring))
	}
}

func TestLogEmpty(t *testing.T) {
	s, _ := newTestSandbox(t)
	if got := s.Log(0, 0); got == nil || len(got) != 0 {
		t.Fatalf("Log of an empty log: %#v", got)
	}
	if got := s.Log(5, 0); got == nil || len(got) != 0 {
		t.Fatalf("Log(5) of an empty log: %#v", got)
	}
}

// TestSandboxConcurrent runs every method at once; -race checks it.
func TestSandboxConcurrent(t *testing.T) {
	s := NewSandbox("ns", "box", mustCompile(t, testRules...))
	p1, p2 := mustCompile(t, testRules...), mustCompile(t, "allowed.test")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				a := netip.AddrFrom4([4]byte{203, 0, 113, byte(i)})
				_ = s.Pin("allowed.test", []netip.Addr{a}, time.Minute)
				s.Decide(netip.AddrPortFrom(a, 443), "allowed.test", "tls")
				s.AllowName("x.wild.test")
				s.Rebinding("allowed.test", a)
				s.PinnedNames(a)
				s.Record(Record{Kind: "tcp", Verdict: "allow"})
				if i%50 == g {
					s.SetPolicy([]*Policy{p1, p2}[i%2])
				}
				s.Log(uint64(i), 10)
				s.Counts()
			}
		})
	}
	wg.Wait()
	if got := s.Counts()["tcp"].Allowed; got != 2000 {
		t.Fatalf("counted %d records, want 2000", got)
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	a, b := NewSandbox("ns", "a", nil), NewSandbox("ns", "b", nil)
	_ = r.Add(ip("10.201.0.2"), a)
	_ = r.Add(ip("::ffff:10.201.0.6"), b)
	if r.Lookup(ip("::ffff:10.201.0.2")) != a || r.Lookup(ip("10.201.0.6")) != b {
		t.Fatal("lookup of a registered address")
	}
	var zero Registry
	if zero.Lookup(ip("10.201.0.2")) != nil {
		t.Fatal("the zero registry knows an address")
	}
	_ = zero.Add(ip("10.201.0.2"), a)
	if zero.Lookup(ip("10.201.0.2")) != a {
		t.Fatal("the zero registry lost an address")
	}
	if r.Lookup(ip("10.201.0.10")) != nil || r.Lookup(netip.Addr{}) != nil {
		t.Fatal("lookup of an unknown address is not nil")
	}
	_ = r.Remove(ip("10.201.0.2"))
	if r.Lookup(ip("10.201.0.2")) != nil || r.Len() != 1 {
		t.Fatal("a removed address still maps")
	}

	// Concurrent: writers add and remove their own addresses while readers
	// look up a fixed one.
	fixed := ip("10.201.255.254")
	_ = r.Add(fixed, a)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				addr := netip.AddrFrom4([4]byte{10, 202, byte(g), byte(i)})
				s := NewSandbox("ns", fmt.Sprint(g), nil)
				_ = r.Add(addr, s)
				if r.Lookup(addr) != s {
					t.Errorf("lookup after add of %s", addr)
				}
				_ = r.Remove(addr)
			}
		})
		wg.Go(func() {
			for range 1000 {
				if r.Lookup(fixed) != a {
					t.Error("the fixed address vanished")
				}
			}
		})
	}
	wg.Wait()
	if r.Len() != 2 {
		t.Fatalf("%d addresses left, want 2", r.Len())
	}
}

func TestRecordBounds(t *testing.T) {
	s, _ := newTestSandbox(t)
	huge := strings.Repeat("x", 1<<20)
	s.Record(Record{Kind: huge, Name: huge, Addr: huge, Verdict: "deny", Rule: huge, Reason: huge})
	r := s.Log(0, 0)[0]
	for field, v := range map[string]string{"kind": r.Kind, "name": r.Name, "addr": r.Addr, "rule": r.Rule, "reason": r.Reason} {
		if len(v) > 512 || !strings.HasSuffix(v, "...") {
			t.Errorf("%s kept %d bytes", field, len(v))
		}
	}
	if r.Verdict != "deny" || s.Counts()[r.Kind].Denied != 1 {
		t.Errorf("a short field was changed: %+v", r)
	}

	// A long policy's record lists a bounded prefix of its rules.
	rules := make([]string, MaxRules)
	for i := range rules {
		rules[i] = fmt.Sprintf("%s.%s.%s-%d.example.com", strings.Repeat("n", 55), strings.Repeat("o", 55), strings.Repeat("p", 55), i)
	}
	s.SetPolicy(mustCompile(t, rules...))
	r = s.Log(1, 0)[0]
	size := 0
	for _, x := range r.Rules {
		size += len(x)
	}
	if len(r.Rules) == 0 || size > maxListed || !slices.Equal(r.Rules, rules[:len(r.Rules)]) ||
		r.Reason != fmt.Sprintf("256 rules (the first %d listed)", len(r.Rules)) {
		t.Fatalf("policy record lists %d rules, %d bytes: %q", len(r.Rules), size, r.Reason)
	}
	if ns, name := s.ID(); ns != "ns" || name != "box" {
		t.Fatalf("ID() = %s, %s", ns, name)
	}
}

// TestSetPolicyOrder: however changes race, the last policy record names
// the policy in force.
func TestSetPolicyOrder(t *testing.T) {
	s := NewSandbox("ns", "box", nil)
	var wg sync.WaitGroup
	for g := range 8 {
		p := mustCompile(t, fmt.Sprintf("g%d.example.com", g))
		wg.Go(func() {
			for range 100 {
				s.SetPolicy(p)
			}
		})
	}
	wg.Wait()
	log := s.Log(0, 0)
	last := log[len(log)-1]
	if !slices.Equal(last.Rules, s.Policy().Rules()) {
		t.Fatalf("last record lists %q, the policy is %q", last.Rules, s.Policy().Rules())
	}
}

// The method sets the resolver and the proxy declare for a sandbox (they
// do not import this type): *Sandbox must keep satisfying them.
var (
	_ interface {
		AllowName(name string) (rule string, ok bool)
		Rebinding(name string, a netip.Addr) (why string, refused bool)
		Pin(name string, as []netip.Addr, ttl time.Duration) error
		Record(r Record)
	} = (*Sandbox)(nil)
	_ interface {
		Decide(dst netip.AddrPort, wireName, wireKind string) Verdict
		Record(r Record)
	} = (*Sandbox)(nil)
)

// TestNilSandbox: an unknown source wrapped in an interface denies
// everything instead of crashing.
func TestNilSandbox(t *testing.T) {
	var s *Sandbox
	if _, ok := s.AllowName("allowed.test"); ok {
		t.Error("AllowName allowed")
	}
	if _, refused := s.Rebinding("allowed.test", ip("203.0.113.1")); !refused {
		t.Error("Rebinding not refused")
	}
	_ = s.Pin("allowed.test", []netip.Addr{ip("203.0.113.1")}, time.Minute)
	s.Record(Record{Kind: "tcp", Verdict: "allow"})
	if v := s.Decide(ap("203.0.113.1:443"), "allowed.test", "tls"); v.Allow || v.Reason != "unknown sandbox" {
		t.Errorf("Decide = %+v", v)
	}
	if s.Policy().Len() != 0 {
		t.Error("Policy of nil has rules")
	}
}
