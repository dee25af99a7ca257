package egress

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// fullPolicy is MaxRules rules: 128 exact names, 64 wildcards and 64
// networks, the worst case a lookup faces.
func fullPolicy(b *testing.B) *Policy {
	rules := make([]string, 0, MaxRules)
	for i := range 128 {
		rules = append(rules, fmt.Sprintf("host-%d.example%d.com", i, i%7))
	}
	for i := range 64 {
		rules = append(rules, fmt.Sprintf("*.zone-%d.example.net:%d", i, 1000+i))
	}
	for i := range 64 {
		rules = append(rules, fmt.Sprintf("198.51.%d.0/24:5432", i))
	}
	p := mustCompile(b, rules...)
	if p.Len() != MaxRules {
		b.Fatalf("%d rules", p.Len())
	}
	return p
}

func BenchmarkAllowsName(b *testing.B) {
	p := fullPolicy(b)
	for _, c := range []struct{ label, name string }{
		{"exact", "host-100.example2.com"},
		{"wildcard", "a.b.c.zone-63.example.net"},
		{"miss", "a.b.c.d.e.f.not-allowed.example.org"},
	} {
		b.Run(c.label, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.AllowsName(c.name)
			}
		})
	}
}

func BenchmarkDecide(b *testing.B) {
	s := NewSandbox("ns", "box", fullPolicy(b))
	// A busy sandbox: a thousand pins besides the one used.
	for i := range 1000 {
		_ = s.Pin(fmt.Sprintf("a%d.zone-%d.example.net", i, i%64), []netip.Addr{netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)})}, time.Hour)
	}
	_ = s.Pin("host-100.example2.com", []netip.Addr{netip.MustParseAddr("203.0.113.7")}, time.Hour)
	for _, c := range []struct {
		label      string
		dst        string
		wire, kind string
		allow      bool
	}{
		{"tls-allowed", "203.0.113.7:443", "host-100.example2.com", "tls", true},
		{"tls-denied-sni", "203.0.113.7:443", "evil.example.org", "tls", false},
		{"address-rule", "198.51.63.9:5432", "", "", true},
		{"not-resolved", "192.0.2.1:443", "host-100.example2.com", "tls", false},
	} {
		b.Run(c.label, func(b *testing.B) {
			dst := netip.MustParseAddrPort(c.dst)
			if v := s.Decide(dst, c.wire, c.kind); v.Allow != c.allow {
				b.Fatalf("Decide = %+v", v)
			}
			b.ReportAllocs()
			for b.Loop() {
				s.Decide(dst, c.wire, c.kind)
			}
		})
	}
}
