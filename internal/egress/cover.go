package egress

import "fmt"

// Coverage: an operator allows a tenant's sandboxes a set of patterns
// (written as rules), and a sandbox may ask for a rule only when one
// pattern covers it, that is when everything the rule allows the pattern
// allows too:
//
//   - hosts: an exact name is covered by the same name, or by a wildcard
//     whose suffix it ends in with at least one more label ("a.b.c" by
//     "*.b.c", never by "*.a.b.c" nor by "b.c"). A wildcard is covered
//     only by a wildcard whose suffix is the same or a parent of it
//     ("*.x.b.c" by "*.b.c"); never by an exact name ("*.evil.com" is not
//     covered by "evil.com"). Names never cover addresses nor addresses
//     names.
//   - addresses: a network is covered by a network of the same family
//     that contains it (the same or fewer bits). A single address that is
//     strict-special (cloud metadata, host-local: Special), which only a
//     rule for exactly it opens, is covered only by exactly it: an
//     operator's 0.0.0.0/0 does not let a sandbox ask for the metadata
//     service.
//   - ports: the rule's ports are a subset of the pattern's. No port
//     means 80 and 443; ":*" is covered only by ":*"; ":443" by no port,
//     ":443" or ":*".

// Covers reports whether pattern p covers rule r (see above).
func Covers(p, r Rule) bool {
	return coversPorts(p, r) && coversHost(p, r)
}

func coversPorts(p, r Rule) bool {
	switch {
	case p.AnyPort:
		return true
	case r.AnyPort:
		return false
	case r.Port == 0:
		return p.Port == 0
	default:
		return p.AllowsPort(r.Port)
	}
}

func coversHost(p, r Rule) bool {
	if p.IsAddr() != r.IsAddr() {
		return false
	}
	if r.IsAddr() {
		pp, rp := p.Prefix, r.Prefix
		if pp.Addr().Is4() != rp.Addr().Is4() {
			return false
		}
		if rp.IsSingleIP() {
			if _, strict, _ := classify(rp.Addr()); strict {
				return pp == rp
			}
		}
		return pp.Bits() <= rp.Bits() && pp.Contains(rp.Addr())
	}
	switch {
	case !p.Wildcard:
		return !r.Wildcard && r.Name == p.Name
	case r.Wildcard:
		return r.Name == p.Name || hasLabelSuffix(r.Name, p.Name)
	default:
		return hasLabelSuffix(r.Name, p.Name)
	}
}

// hasLabelSuffix reports whether name ends in "."+suffix.
func hasLabelSuffix(name, suffix string) bool {
	return len(name) > len(suffix)+1 && name[len(name)-len(suffix)-1] == '.' && name[len(name)-len(suffix):] == suffix
}

// Covered reports whether rule is covered by one of patterns.
// A rule or pattern that does not parse is an error (patterns are checked
// when the operator's file is read, so that is a rule's).
func Covered(rule string, patterns []string) (bool, error) {
	r, err := ParseRule(rule)
	if err != nil {
		return false, err
	}
	for _, s := range patterns {
		p, err := ParseRule(s)
		if err != nil {
			return false, fmt.Errorf("pattern %q: %w", s, err)
		}
		if Covers(p, r) {
			return true, nil
		}
	}
	return false, nil
}
