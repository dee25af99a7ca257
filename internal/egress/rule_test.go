package egress

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// strict reports whether a is a strict special address (see Special).
func strict(a netip.Addr) bool {
	_, s, _ := classify(a)
	return s
}

func TestParseRuleAccepts(t *testing.T) {
	name := func(n string, wild bool, port uint16, anyPort bool) Rule {
		return Rule{Name: n, Wildcard: wild, Port: port, AnyPort: anyPort}
	}
	addr := func(p string, port uint16, anyPort bool) Rule {
		return Rule{Prefix: netip.MustParsePrefix(p), Port: port, AnyPort: anyPort}
	}
	label63 := strings.Repeat("a", 63)
	name253 := label63 + "." + label63 + "." + label63 + "." + strings.Repeat("b", 61) // 253
	cases := []struct {
		in    string
		want  Rule
		canon string
	}{
		{"pypi.org", name("pypi.org", false, 0, false), "pypi.org"},
		{"PyPI.Org.", name("pypi.org", false, 0, false), "pypi.org"},
		{"api.example.com:443", name("api.example.com", false, 443, false), "api.example.com:443"},
		{"api.example.com:0443", name("api.example.com", false, 443, false), "api.example.com:443"},
		{"api.example.com.:8080", name("api.example.com", false, 8080, false), "api.example.com:8080"},
		{"git.example.com:*", name("git.example.com", false, 0, true), "git.example.com:*"},
		{"*.githubusercontent.com", name("githubusercontent.com", true, 0, false), "*.githubusercontent.com"},
		{"*.A.B.c:65535", name("a.b.c", true, 65535, false), "*.a.b.c:65535"},
		{"xn--bcher-kva.example", name("xn--bcher-kva.example", false, 0, false), "xn--bcher-kva.example"},
		{"localhost", name("localhost", false, 0, false), "localhost"},
		{"a-b.c-d.e1:1", name("a-b.c-d.e1", false, 1, false), "a-b.c-d.e1:1"},
		{"1a.2b", name("1a.2b", false, 0, false), "1a.2b"},
		{name253, name(name253, false, 0, false), name253},
		{name253 + ".:65535", name(name253, false, 65535, false), name253 + ":65535"},
		{"203.0.113.7", addr("203.0.113.7/32", 0, false), "203.0.113.7"},
		{"203.0.113.7/32:22", addr("203.0.113.7/32", 22, false), "203.0.113.7:22"},
		{"10.0.0.0/8:5432", addr("10.0.0.0/8", 5432, false), "10.0.0.0/8:5432"},
		{"0.0.0.0/0:*", addr("0.0.0.0/0", 0, true), "0.0.0.0/0:*"},
		{"[2001:db8::1]:443", addr("2001:db8::1/128", 443, false), "[2001:db8::1]:443"},
		{"[2001:DB8:0::1]", addr("2001:db8::1/128", 0, false), "[2001:db8::1]"},
		{"[2001:db8::/32]:443", addr("2001:db8::/32", 443, false), "[2001:db8::/32]:443"},
		{"[::1]:*", addr("::1/128", 0, true), "[::1]:*"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			r, err := ParseRule(c.in)
			if err != nil {
				t.Fatalf("ParseRule(%q): %v", c.in, err)
			}
			if r != c.want {
				t.Fatalf("ParseRule(%q) = %#v, want %#v", c.in, r, c.want)
			}
			if got := r.String(); got != c.canon {
				t.Fatalf("String() = %q, want %q", got, c.canon)
			}
			r2, err := ParseRule(r.String())
			if err != nil || r2 != r {
				t.Fatalf("round trip of %q: %#v, %v", r.String(), r2, err)
			}
		})
	}
}

func TestParseRuleRejects(t *testing.T) {
	label64 := strings.Repeat("a", 64)
	long := strings.Repeat("abcdefghi.", 26) + "com" // 263 bytes
	name254 := strings.Repeat("a", 63) + "." + strings.Repeat("a", 63) + "." + strings.Repeat("a", 63) + "." + strings.Repeat("b", 62)
	cases := []struct {
		in, want string // want: a piece of the message
	}{
		{"", "empty"},
		{" pypi.org", "space"},
		{"pypi.org ", "space"},
		{"pypi .org", "space"},
		{"pypi.org\n", "control"},
		{"pypi.org\x00", "control"},
		{"pypi\x7f.org", "control"},
		{"bücher.example", "punycode form (xn--"},
		{"\xff\xfe", "punycode"},
		{"https://pypi.org", `not a URL: drop "https://"`},
		{"pypi.org/simple", "not a path"},
		{"203.0.113.7/32/x", "not a path"},
		{"user@pypi.org", "not a URL"},
		{"pypi.org?x", "not a URL"},
		{"pypi.org#x", "not a URL"},
		{`pypi\.org`, "not a URL"},
		{"*", "* alone"},
		{"*.", "* alone"},
		{"*:443", "* alone"},
		{"*.com", "whole top-level domain"},
		{"*.com.", "whole top-level domain"},
		{"*.*.example.com", "first label"},
		{"a.*.example.com", "first label"},
		{"*example.com", "first label"},
		{"*.example.*", "first label"},
		{"**.example.com", "first label"},
		{"example.com..", "not a valid host name"},
		{".example.com", "not a valid host name"},
		{"a..b", "not a valid host name"},
		{"-a.com", "not a valid host name"},
		{"a-.com", "not a valid host name"},
		{"a.com-", "not a valid host name"},
		{"a_b.com", "not a valid host name"},
		{label64 + ".com", "not a valid host name"},
		{name254, "not a valid host name"},
		{"*." + name254[2:], "too long"},
		{long, "at most 260"},
		{"example.123", "last label is a number"},
		{"1.2.3.999", "not an IP address"},
		{"1.2.3", "not an IP address"},
		{"01.2.3.4", "not an IP address"},
		{"1234", "not an IP address"},
		{"pypi.org:", "empty port"},
		{"pypi.org:0", "not 1-65535"},
		{"pypi.org:65536", "not 1-65535"},
		{"pypi.org:99999", "not 1-65535"},
		{"pypi.org:123456", "not 1-65535"},
		{"pypi.org:-1", "not a number"},
		{"pypi.org:+443", "not a number"},
		{"pypi.org:http", "not a number"},
		{"pypi.org:4x", "not a number"},
		{"pypi.org:**", "not a number"},
		{":443", "no host"},
		{"10.0.0.1/8", "did you mean 10.0.0.0/8"},
		{"203.0.113.7/24:22", "did you mean 203.0.113.0/24"},
		{"[2001:db8::1/32]", "did you mean 2001:db8::/32"},
		{"10.0.0.0/33", "not a network"},
		{"10.0.0.0/", "not a network"},
		{"10.0.0.0/-1", "not a network"},
		{"2001:db8::1", "in brackets"},
		{"2001:db8::1:443", "in brackets"},
		{"a:b:c", "more than one ':'"},
		{"pypi.org:443:", "more than one ':'"},
		{"2001:db8::/32:443", "in brackets"},
		{"::1", "in brackets"},
		{"[2001:db8::1", "missing ]"},
		{"[2001:db8::1]443", "expected :PORT"},
		{"[2001:db8::1]:", "empty port"},
		{"[1.2.3.4]:443", "brackets are for IPv6"},
		{"[::ffff:1.2.3.4]", "IPv4-mapped"},
		{"[::ffff:0.0.0.0/96]", "IPv4-mapped"},
		{"[fe80::1%eth0]", "zone"},
		{"[pypi.org]", "not an IP address"},
		{"[]", "not an IP address"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			r, err := ParseRule(c.in)
			if err == nil {
				t.Fatalf("ParseRule(%q) = %#v, want an error", c.in, r)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParseRule(%q) error %q, want it to say %q", c.in, err, c.want)
			}
		})
	}
}

func TestRuleAllowsPort(t *testing.T) {
	cases := []struct {
		rule string
		in   []uint16
		out  []uint16
	}{
		{"a.com", []uint16{80, 443}, []uint16{0, 22, 8080, 8443, 65535}},
		{"a.com:22", []uint16{22}, []uint16{80, 443, 23}},
		{"a.com:*", []uint16{1, 80, 443, 65535}, nil},
	}
	for _, c := range cases {
		r, err := ParseRule(c.rule)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range c.in {
			if !r.AllowsPort(p) {
				t.Errorf("%s does not allow port %d", c.rule, p)
			}
		}
		for _, p := range c.out {
			if r.AllowsPort(p) {
				t.Errorf("%s allows port %d", c.rule, p)
			}
		}
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{
		"pypi.org", "*.githubusercontent.com", "a.b:443", "x.y:*", "203.0.113.7:22",
		"10.0.0.0/8:5432", "[2001:db8::1]:443", "[2001:db8::/32]:443", "PyPI.org.",
		"[::ffff:1.2.3.4]", "https://x", "*.com", "1.2.3.4/24", "[::1.2.3.4]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		c := r.String()
		if len(c) > len(s) {
			t.Fatalf("canonical %q longer than input %q", c, s)
		}
		r2, err := ParseRule(c)
		if err != nil {
			t.Fatalf("canonical %q of %q does not parse: %v", c, s, err)
		}
		if r2 != r {
			t.Fatalf("round trip of %q via %q: %#v != %#v", s, c, r2, r)
		}
		if (r.Name != "") == r.Prefix.IsValid() {
			t.Fatalf("%q: rule is not exactly one of a name and an address: %#v", s, r)
		}
		// A policy of the rule allows what the rule names, and no more.
		p, err := Compile([]string{s})
		if err != nil || !slices.Equal(p.Rules(), []string{c}) {
			t.Fatalf("Compile(%q) = %v, %v", s, p.Rules(), err)
		}
		port := r.Port
		if port == 0 {
			port = 443
		}
		switch {
		case r.IsAddr():
			if got, ok := p.AllowsAddr(netip.AddrPortFrom(r.Prefix.Addr(), port)); !ok && !strict(r.Prefix.Addr()) || ok && got != c {
				t.Fatalf("%q does not allow its own network's first address", c)
			}
			if _, ok := p.AllowsName("a.example"); ok {
				t.Fatalf("address rule %q allows a name", c)
			}
		case r.Wildcard:
			if got, ok := p.AllowsNamePort("x."+r.Name, port); !ok || got != c {
				t.Fatalf("%q does not allow x.%s", c, r.Name)
			}
			if _, ok := p.AllowsName(r.Name); ok {
				t.Fatalf("%q allows its bare suffix", c)
			}
		default:
			if got, ok := p.AllowsNamePort(strings.ToUpper(r.Name)+".", port); !ok || got != c {
				t.Fatalf("%q does not allow its name", c)
			}
			if _, ok := p.AllowsName("x." + r.Name); ok {
				t.Fatalf("exact rule %q allows a subdomain", c)
			}
		}
	})
}
