package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func mustCompile(t testing.TB, rules ...string) *Policy {
	t.Helper()
	p, err := Compile(rules)
	if err != nil {
		t.Fatalf("Compile(%q): %v", rules, err)
	}
	return p
}

func TestCompileReportsEveryBadRule(t *testing.T) {
	_, err := Compile([]string{"pypi.org", "https://x", "ok.example", "*.com", "10.0.0.1/8"})
	if err == nil {
		t.Fatal("Compile accepted bad rules")
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v does not wrap ErrInvalid", err)
	}
	msg := err.Error()
	for _, want := range []string{`rule 1 "https://x"`, `rule 3 "*.com"`, `rule 4 "10.0.0.1/8"`, "did you mean 10.0.0.0/8"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	for _, not := range []string{"rule 0", "rule 2"} {
		if strings.Contains(msg, not) {
			t.Errorf("error %q names a good rule (%s)", msg, not)
		}
	}
}

func TestCompileBounds(t *testing.T) {
	rules := make([]string, MaxRules)
	for i := range rules {
		rules[i] = fmt.Sprintf("h%d.example.com", i)
	}
	if p := mustCompile(t, rules...); p.Len() != MaxRules {
		t.Fatalf("Len = %d, want %d", p.Len(), MaxRules)
	}
	rules = append(rules, "one-more.example.com", "bad..name")
	_, err := Compile(rules)
	if err == nil || !strings.Contains(err.Error(), "258 rules, at most 256") {
		t.Fatalf("Compile of %d rules: %v", len(rules), err)
	}
	// A long rule is quoted short in the error.
	_, err = Compile([]string{strings.Repeat("x", 100000)})
	if err == nil || len(err.Error()) > 300 {
		t.Fatalf("error for a huge rule: %d bytes", len(err.Error()))
	}
}

func TestCompileDeduplicatesAndCanonicalises(t *testing.T) {
	p := mustCompile(t, "PyPI.org", "pypi.org.", "pypi.org:443", "*.Example.com", "*.example.com", "10.0.0.0/8:5432", "10.0.0.0/8:5432")
	want := []string{"pypi.org", "pypi.org:443", "*.example.com", "10.0.0.0/8:5432"}
	if got := p.Rules(); !slices.Equal(got, want) {
		t.Fatalf("Rules() = %q, want %q", got, want)
	}
	// Rules() is a copy.
	p.Rules()[0] = "evil.test"
	if p.Rules()[0] != "pypi.org" {
		t.Fatal("Rules() exposes the policy's slice")
	}
	empty := mustCompile(t)
	if got := empty.Rules(); got == nil || len(got) != 0 {
		t.Fatalf("empty Rules() = %#v", got)
	}
}

func TestPolicyNames(t *testing.T) {
	p := mustCompile(t,
		"pypi.org",
		"*.githubusercontent.com",
		"api.example.com:8443",
		"git.example.com:*",
		"*.deep.example.net:22",
		"x.deep.example.net",
	)
	cases := []struct {
		name string
		port uint16 // 0: AllowsName (any port)
		rule string // "" = denied
	}{
		{"pypi.org", 0, "pypi.org"},
		{"PYPI.ORG.", 443, "pypi.org"},
		{"pypi.org", 80, "pypi.org"},
		{"pypi.org", 22, ""},
		{"files.pypi.org", 0, ""},
		{"pypi.org.evil.test", 0, ""},
		{"evilpypi.org", 0, ""},
		{"raw.githubusercontent.com", 443, "*.githubusercontent.com"},
		{"a.b.githubusercontent.com", 443, "*.githubusercontent.com"},
		{"githubusercontent.com", 0, ""},
		{"evilgithubusercontent.com", 0, ""},
		{"githubusercontent.com.evil.test", 0, ""},
		{"api.example.com", 0, "api.example.com:8443"},
		{"api.example.com", 8443, "api.example.com:8443"},
		{"api.example.com", 443, ""},
		{"git.example.com", 9418, "git.example.com:*"},
		{"a.deep.example.net", 22, "*.deep.example.net:22"},
		{"a.deep.example.net", 443, ""},
		{"x.deep.example.net", 443, "x.deep.example.net"},
		{"x.deep.example.net", 22, "*.deep.example.net:22"},
		// Not host names: match nothing, even under a wildcard.
		{"", 0, ""},
		{".", 0, ""},
		{"..githubusercontent.com", 0, ""},
		{"a b.githubusercontent.com", 0, ""},
		{"a_b.githubusercontent.com", 0, ""},
		{"\x00.githubusercontent.com", 0, ""},
		{"pypi.org..", 0, ""},
		{strings.Repeat("a.", 130) + "githubusercontent.com", 0, ""},
	}
	for _, c := range cases {
		var rule string
		var ok bool
		if c.port == 0 {
			rule, ok = p.AllowsName(c.name)
		} else {
			rule, ok = p.AllowsNamePort(c.name, c.port)
		}
		if ok != (c.rule != "") || rule != c.rule {
			t.Errorf("%q port %d: (%q, %v), want %q", c.name, c.port, rule, ok, c.rule)
		}
	}
}

func TestPolicyPrecedence(t *testing.T) {
	p := mustCompile(t, "*.example.com", "*.a.example.com", "b.a.example.com", "b.a.example.com:*")
	for name, want := range map[string]string{
		"b.a.example.com": "b.a.example.com",
		"c.a.example.com": "*.a.example.com",
		"c.example.com":   "*.example.com",
	} {
		if got, _ := p.AllowsNamePort(name, 443); got != want {
			t.Errorf("%s: rule %q, want %q", name, got, want)
		}
	}
	if got, _ := p.AllowsNamePort("b.a.example.com", 22); got != "b.a.example.com:*" {
		t.Errorf("port 22: rule %q", got)
	}
}

func TestPolicyAddrs(t *testing.T) {
	defer SetHostLocal(nil)
	SetHostLocal([]netip.Prefix{netip.MustParsePrefix("10.201.0.0/16"), netip.MustParsePrefix("192.0.2.1/32")})
	p := mustCompile(t, "203.0.113.7:22", "10.0.0.0/8:5432", "198.51.100.0/24", "[2001:db8::/32]:443",
		"0.0.0.0/0:9999", "10.201.0.6:8080", "169.254.0.0/16:80")
	cases := []struct {
		dst  string
		rule string
	}{
		{"203.0.113.7:22", "203.0.113.7:22"},
		{"203.0.113.7:23", ""},
		{"203.0.113.8:22", ""},
		{"[::ffff:203.0.113.7]:22", "203.0.113.7:22"},
		{"10.1.2.3:5432", "10.0.0.0/8:5432"},
		{"10.1.2.3:5433", ""},
		{"198.51.100.200:443", "198.51.100.0/24"},
		{"198.51.100.200:80", "198.51.100.0/24"},
		{"198.51.100.200:8080", ""},
		{"[2001:db8:1::5]:443", "[2001:db8::/32]:443"},
		{"[2001:db9::5]:443", ""},
		{"8.8.8.8:9999", "0.0.0.0/0:9999"},
		// Strict addresses: only a rule for that very address.
		{"10.201.0.2:5432", ""},
		{"10.201.0.6:8080", "10.201.0.6:8080"},
		{"192.0.2.1:9999", ""},
		{"169.254.169.254:80", ""},
		{"169.254.169.254:9999", ""},
		{"169.254.1.1:80", "169.254.0.0/16:80"},
	}
	for _, c := range cases {
		rule, ok := p.AllowsAddr(netip.MustParseAddrPort(c.dst))
		if ok != (c.rule != "") || rule != c.rule {
			t.Errorf("%s: (%q, %v), want %q", c.dst, rule, ok, c.rule)
		}
	}
	for a, want := range map[string]bool{
		"10.9.9.9": true, "203.0.113.7": true, "203.0.113.9": true, "10.201.0.2": false,
		"10.201.0.6": true, "169.254.169.254": false, "169.254.1.1": true, "::ffff:10.9.9.9": true,
	} {
		if got := p.NamesRange(netip.MustParseAddr(a)); got != want {
			t.Errorf("NamesRange(%s) = %v, want %v", a, got, want)
		}
	}
	var nilp *Policy
	if _, ok := nilp.AllowsAddr(netip.MustParseAddrPort("1.1.1.1:443")); ok || nilp.NamesRange(netip.MustParseAddr("1.1.1.1")) {
		t.Fatal("nil policy allows an address")
	}
	if _, ok := nilp.AllowsName("pypi.org"); ok {
		t.Fatal("nil policy allows a name")
	}
}

func TestSpecial(t *testing.T) {
	defer SetHostLocal(nil)
	SetHostLocal([]netip.Prefix{netip.MustParsePrefix("198.51.100.77/32"), netip.MustParsePrefix("::ffff:10.201.0.0/112")})
	cases := map[string]string{
		"127.0.0.1":              "loopback",
		"127.255.0.9":            "loopback",
		"::ffff:127.0.0.1":       "loopback",
		"::1":                    "loopback",
		"169.254.169.254":        "cloud metadata",
		"::ffff:169.254.169.254": "cloud metadata",
		"169.254.0.1":            "link-local",
		"10.1.2.3":               "private",
		"172.16.0.1":             "private",
		"172.31.255.255":         "private",
		"192.168.1.1":            "private",
		"100.64.0.1":             "shared address space (CGNAT)",
		"100.127.255.255":        "shared address space (CGNAT)",
		"0.0.0.0":                "unspecified",
		"0.1.2.3":                "\"this network\" (0/8)",
		"224.0.0.1":              "multicast",
		"239.255.255.255":        "multicast",
		"255.255.255.255":        "broadcast",
		"240.0.0.1":              "reserved",
		"::":                     "unspecified",
		"fe80::1":                "link-local",
		"fe80::1%eth0":           "link-local",
		"fd00::1":                "unique local (private)",
		"fc00::1":                "unique local (private)",
		"ff02::1":                "multicast",
		"198.51.100.77":          "host-local",
		"10.201.3.4":             "host-local",
		// Not special: the internet, and the ranges the tests' fake internet uses.
		"203.0.113.7":  "",
		"198.51.100.1": "",
		"192.0.2.1":    "",
		"198.18.0.1":   "",
		"198.19.255.1": "",
		"8.8.8.8":      "",
		"172.32.0.1":   "",
		"100.128.0.1":  "",
		"2001:db8::1":  "",
		"2606:4700::1": "",
		"11.0.0.1":     "",
	}
	for a, want := range cases {
		why, special := Special(netip.MustParseAddr(a))
		if special != (want != "") || why != want {
			t.Errorf("Special(%s) = (%q, %v), want %q", a, why, special, want)
		}
	}
	if _, special := Special(netip.Addr{}); !special {
		t.Error("the zero address is not special")
	}
}
