package egress

import (
	"net/netip"
	"testing"
)

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		pattern, rule string
		want          bool
	}{
		// names
		{"pypi.org", "pypi.org", true},
		{"pypi.org", "PyPI.org.", true},
		{"pypi.org", "evil-pypi.org", false},
		{"pypi.org", "a.pypi.org", false},
		{"*.pythonhosted.org", "files.pythonhosted.org", true},
		{"*.pythonhosted.org", "a.b.pythonhosted.org", true},
		{"*.pythonhosted.org", "pythonhosted.org", false},
		{"*.pythonhosted.org", "evilpythonhosted.org", false},
		{"*.pythonhosted.org", "pythonhosted.org.evil.com", false},
		{"*.b.c", "*.b.c", true},
		{"*.b.c", "*.x.b.c", true},
		{"*.x.b.c", "*.b.c", false},
		{"evil.com", "*.evil.com", false},
		{"*.evil.com", "*.com.evil.com", true},
		{"a.evil.com", "*.evil.com", false},
		{"example.com", "203.0.113.7", false},
		// addresses
		{"10.0.0.0/8", "10.1.2.3", true},
		{"10.0.0.0/8", "10.1.0.0/16", true},
		{"10.1.0.0/16", "10.0.0.0/8", false},
		{"10.0.0.0/8", "11.0.0.1", false},
		{"10.0.0.1", "10.0.0.1", true},
		{"10.0.0.1", "10.0.0.0/31", false},
		{"0.0.0.0/0", "203.0.113.7", true},
		{"0.0.0.0/0", "169.254.169.254", false}, // cloud metadata: only exactly
		{"169.254.0.0/16", "169.254.169.254", false},
		{"169.254.169.254", "169.254.169.254", true},
		{"0.0.0.0/0", "169.254.0.0/16", true}, // a network rule never opens metadata
		{"[2001:db8::/32]", "[2001:db8::1]", true},
		{"0.0.0.0/0", "[2001:db8::1]", false},
		{"[::/0]", "10.0.0.1", false},
		{"10.0.0.0/8", "example.com", false},
		// ports
		{"pypi.org", "pypi.org:443", true},
		{"pypi.org", "pypi.org:80", true},
		{"pypi.org", "pypi.org:22", false},
		{"pypi.org", "pypi.org:*", false},
		{"pypi.org:443", "pypi.org", false},
		{"pypi.org:443", "pypi.org:443", true},
		{"pypi.org:443", "pypi.org:8443", false},
		{"pypi.org:*", "pypi.org:22", true},
		{"pypi.org:*", "pypi.org:*", true},
		{"pypi.org:*", "pypi.org", true},
		{"*.b.c:*", "x.b.c:5432", true},
		{"10.0.0.0/8:5432", "10.0.0.1:5432", true},
		{"10.0.0.0/8:5432", "10.0.0.1", false},
	} {
		ok, err := Covered(c.rule, []string{c.pattern})
		if err != nil {
			t.Fatalf("%s by %s: %v", c.rule, c.pattern, err)
		}
		if ok != c.want {
			t.Errorf("Covered(%q, [%q]) = %v, want %v", c.rule, c.pattern, ok, c.want)
		}
	}
}

func TestCoveredHostLocal(t *testing.T) {
	SetHostLocal([]netip.Prefix{netip.MustParsePrefix("192.0.2.10/32")})
	defer SetHostLocal(nil)
	if ok, _ := Covered("192.0.2.10", []string{"192.0.2.0/24"}); ok {
		t.Error("a host-local address is covered by a wider pattern")
	}
	if ok, _ := Covered("192.0.2.11", []string{"192.0.2.0/24"}); !ok {
		t.Error("an ordinary address of the pattern is not covered")
	}
}

func TestCoveredErrors(t *testing.T) {
	for _, c := range []struct{ rule, pattern string }{
		{"*", "example.com"},
		{"example.com", "*"},
		{"https://example.com", "example.com"},
	} {
		if _, err := Covered(c.rule, []string{c.pattern}); err == nil {
			t.Errorf("Covered(%q, [%q]): no error", c.rule, c.pattern)
		}
	}
	if ok, err := Covered("example.com", nil); ok || err != nil {
		t.Errorf("no patterns: %v %v", ok, err)
	}
}
