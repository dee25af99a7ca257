package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// A rule, as a user writes it, is one of
//
//	pypi.org                  an exact name
//	*.githubusercontent.com   every name ending in .githubusercontent.com
//	                          (a.b.githubusercontent.com, never the bare
//	                          githubusercontent.com)
//	203.0.113.7               one IPv4 address
//	10.0.0.0/8                an IPv4 network
//	[2001:db8::1]             one IPv6 address (in brackets)
//	[2001:db8::/32]           an IPv6 network (in brackets)
//
// each optionally followed by ":PORT" (1-65535) or ":*" (any port); without
// a port it allows ports 80 and 443. IPv6 rules parse and are kept, but a
// sandbox has no IPv6 route out (its namespace has IPv6 disabled), so they
// open nothing today; they are accepted so a policy written for a later
// IPv6 path need not change.
//
// Invariants of ParseRule (the tests and FuzzParseRule hold it to them):
//
//   - It never panics and looks at no more than MaxRuleLen bytes.
//   - Names are ASCII: letters, digits and hyphens, labels of 1-63 bytes not
//     starting or ending with a hyphen, at most 253 bytes in all. Case does
//     not matter and one trailing dot is ignored. A non-ASCII name is
//     refused with a hint to write its punycode (xn--) form; names are never
//     converted, so what the log shows is what the user wrote.
//   - "*" appears only as the whole first label, followed by a suffix of at
//     least two labels: "*", "*.com", "a.*.com" and "*x.com" are refused, so
//     a wildcard cannot open a whole top-level domain.
//   - An exact name may be a single label ("localhost", "intranet"): it
//     matches that one name only, and what it resolves to is still checked
//     for rebinding. A name whose last label is all digits is refused (it is
//     a mistyped address, not a name).
//   - Addresses and networks are canonical: a network with host bits set is
//     refused, naming the network that was probably meant; zones and
//     IPv4-mapped IPv6 forms are refused; IPv6 needs brackets.
//   - Spaces, control bytes, schemes ("https://"), paths, queries, user
//     info and anything else that is not one of the forms above is refused
//     with a message saying what is wrong.
//   - ParseRule(r.String()) == r for every rule it returns, and r.String()
//     is never longer than the text it was parsed from.

// Bounds on a policy.
const (
	// MaxRules is the most rules one policy holds.
	MaxRules = 256
	// MaxRuleLen is the longest rule, in bytes (a 253-byte name, ":", a
	// five-digit port, with room for a trailing dot).
	MaxRuleLen = 260

	maxNameLen  = 253
	maxLabelLen = 63
)

// ErrInvalid is wrapped by every error ParseRule and Compile return.
var ErrInvalid = errors.New("invalid egress rule")

// Rule is one parsed allowlist rule. Its zero value is not a valid rule;
// rules come from ParseRule. Rules are comparable: two rules are equal
// exactly when their String forms are.
type Rule struct {
	// Name is the lower-case name without a trailing dot, or for a
	// wildcard the suffix after "*."; "" for an address rule.
	Name string
	// Wildcard makes Name a suffix: the rule matches names with at least
	// one more label in front of it.
	Wildcard bool
	// Prefix is the network of an address rule (a single address is a
	// full-length prefix); the zero Prefix for a name rule.
	Prefix netip.Prefix
	// Port is the one port the rule allows; 0 means ports 80 and 443,
	// unless AnyPort is set.
	Port    uint16
	AnyPort bool
}

// IsAddr reports whether r is an address (IP or CIDR) rule.
func (r Rule) IsAddr() bool { return r.Name == "" }

// AllowsPort reports whether r allows port p.
func (r Rule) AllowsPort(p uint16) bool {
	switch {
	case r.AnyPort:
		return true
	case r.Port == 0:
		return p == 80 || p == 443
	default:
		return p == r.Port
	}
}

// String is r's canonical form, which ParseRule accepts and turns back
// into r.
func (r Rule) String() string {
	var b strings.Builder
	switch {
	case r.Wildcard:
		b.WriteString("*.")
		b.WriteString(r.Name)
	case r.Name != "":
		b.WriteString(r.Name)
	case r.Prefix.Addr().Is4():
		if r.Prefix.IsSingleIP() {
			b.WriteString(r.Prefix.Addr().String())
		} else {
			b.WriteString(r.Prefix.String())
		}
	default:
		b.WriteByte('[')
		if r.Prefix.IsSingleIP() {
			b.WriteString(r.Prefix.Addr().String())
		} else {
			b.WriteString(r.Prefix.String())
		}
		b.WriteByte(']')
	}
	switch {
	case r.AnyPort:
		b.WriteString(":*")
	case r.Port != 0:
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(r.Port)))
	}
	return b.String()
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// ParseRule parses one rule (see the forms above).
func ParseRule(s string) (Rule, error) {
	if s == "" {
		return Rule{}, bad("empty rule")
	}
	if len(s) > MaxRuleLen {
		return Rule{}, bad("%d bytes, at most %d", len(s), MaxRuleLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return Rule{}, bad("not ASCII: write an internationalised name in its punycode form (xn--...)")
		}
		if c <= ' ' || c == 0x7f {
			return Rule{}, bad("contains a space or control character")
		}
	}
	if i := strings.Index(s, "://"); i >= 0 {
		return Rule{}, bad("a rule is a host name, not a URL: drop %q", s[:i+3])
	}
	if strings.ContainsAny(s, "?#@\\") {
		return Rule{}, bad("a rule is a host name, an address or a network with an optional port, not a URL")
	}

	var r Rule
	host, port, hasPort := s, "", false
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Rule{}, bad("missing ] after an IPv6 address")
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if port[0] != ':' {
				return Rule{}, bad("expected :PORT after ]")
			}
			port, hasPort = port[1:], true
		}
		p, err := parseNet(host)
		if err != nil {
			return Rule{}, err
		}
		if !p.Addr().Is6() {
			return Rule{}, bad("brackets are for IPv6; write an IPv4 address without them")
		}
		r.Prefix = p
	} else {
		switch n := strings.Count(s, ":"); {
		case n == 1:
			i := strings.IndexByte(s, ':')
			host, port, hasPort = s[:i], s[i+1:], true
		case n > 1:
			if looksV6(s) {
				return Rule{}, bad("write an IPv6 address or network in brackets, as in [2001:db8::1]:443")
			}
			return Rule{}, bad("more than one ':' (one separates the port)")
		}
		if host == "" {
			return Rule{}, bad("no host before the port")
		}
		if strings.IndexByte(host, '/') >= 0 || isAddrLike(host) {
			p, err := parseNet(host)
			if err != nil {
				return Rule{}, err
			}
			if !p.Addr().Is4() {
				return Rule{}, bad("write an IPv6 address or network in brackets, as in [2001:db8::1]:443")
			}
			r.Prefix = p
		} else {
			name, wild, err := parseName(host)
			if err != nil {
				return Rule{}, err
			}
			r.Name, r.Wildcard = name, wild
		}
	}
	if hasPort {
		switch {
		case port == "":
			return Rule{}, bad("empty port after ':'")
		case port == "*":
			r.AnyPort = true
		default:
			p, err := parsePort(port)
			if err != nil {
				return Rule{}, err
			}
			r.Port = p
		}
	}
	return r, nil
}

// isAddrLike reports whether host has only the characters of an IPv4
// address, so it is parsed as one (and "1.2.3.999" is refused as a bad
// address rather than taken as a name).
func isAddrLike(host string) bool {
	for i := 0; i < len(host); i++ {
		if c := host[i]; c != '.' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// looksV6 reports whether s, or s without a ":PORT" tail, is an IPv6
// address or network, for a helpful error.
func looksV6(s string) bool {
	for _, c := range []string{s, s[:strings.LastIndexByte(s, ':')]} {
		if _, err := netip.ParseAddr(c); err == nil {
			return true
		}
		if _, err := netip.ParsePrefix(c); err == nil {
			return true
		}
	}
	return false
}

// parseNet parses an address or a network in canonical form.
func parseNet(s string) (netip.Prefix, error) {
	if strings.IndexByte(s, '%') >= 0 {
		return netip.Prefix{}, bad("an address with a zone (%%) cannot be a rule")
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		if strings.IndexByte(s[i+1:], '/') >= 0 {
			return netip.Prefix{}, bad("a rule is a host name or a network, not a path")
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			if _, aerr := netip.ParseAddr(s[:i]); aerr != nil {
				return netip.Prefix{}, bad("a rule is a host name or a network, not a path")
			}
			return netip.Prefix{}, bad("%q is not a network (address/bits)", s)
		}
		if p.Addr().Is4In6() {
			return netip.Prefix{}, bad("write an IPv4-mapped network as IPv4")
		}
		if m := p.Masked(); m != p {
			return netip.Prefix{}, bad("%s has host bits set; did you mean %s?", p, m)
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, bad("%q is not an IP address", s)
	}
	if a.Is4In6() {
		return netip.Prefix{}, bad("write an IPv4-mapped address as IPv4 (%s)", a.Unmap())
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parsePort(s string) (uint16, error) {
	if len(s) > 5 {
		return 0, bad("port %.8q is not 1-65535", s)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, bad("port %q is not a number (1-65535, or * for any)", s)
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, bad("port %s is not 1-65535", s)
	}
	return uint16(n), nil
}

// parseName checks and lower-cases a name or wildcard, dropping one
// trailing dot.
func parseName(s string) (name string, wildcard bool, err error) {
	if strings.IndexByte(s, '/') >= 0 {
		return "", false, bad("a rule is a host name, not a path")
	}
	s = strings.TrimSuffix(s, ".")
	if s == "*" {
		return "", false, bad("* alone would allow every name; list the names (a wildcard is *.example.com)")
	}
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		if strings.IndexByte(rest, '.') < 0 {
			return "", false, bad("*.%s would open a whole top-level domain; a wildcard needs two labels after *.", rest)
		}
		s, wildcard = rest, true
	}
	if strings.IndexByte(s, '*') >= 0 {
		return "", false, bad("* may only be the whole first label, as in *.example.com")
	}
	name, ok := checkName(s)
	if !ok {
		return "", false, bad("not a valid host name (letters, digits and hyphens; labels of 1-63, at most 253 in all)")
	}
	if wildcard && len(name)+2 > maxNameLen {
		return "", false, bad("wildcard suffix too long for any name to match")
	}
	if last := name[strings.LastIndexByte(name, '.')+1:]; isAddrLike(last) {
		return "", false, bad("not a host name (its last label is a number) nor an IP address")
	}
	return name, wildcard, nil
}

// canonName returns name lower-cased without one trailing dot when it is a
// valid host name, allocating only when it had upper-case letters. Lookups
// use it, so a query that is not a host name matches no rule.
func canonName(name string) (string, bool) {
	return checkName(strings.TrimSuffix(name, "."))
}

// checkName is canonName without the trailing dot.
func checkName(name string) (string, bool) {
	if len(name) == 0 || len(name) > maxNameLen {
		return "", false
	}
	upper, label := false, 0
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '.':
			if label == 0 || name[i-1] == '-' {
				return "", false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z':
			upper = true
		case c == '-':
			if label == 0 {
				return "", false
			}
		default:
			return "", false
		}
		label++
		if label > maxLabelLen {
			return "", false
		}
	}
	if label == 0 || name[len(name)-1] == '-' {
		return "", false
	}
	if upper {
		name = strings.ToLower(name)
	}
	return name, true
}
