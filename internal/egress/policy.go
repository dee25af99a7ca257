package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Policy is a compiled, immutable allowlist. The zero policy (and a nil
// *Policy) allows nothing: an empty allowlist means nothing leaves.
//
// Invariants:
//
//   - Compile accepts at most MaxRules rules and reports every bad one
//     (index and text) and the count in one error, or returns a policy; it
//     never returns a policy built from part of its input.
//   - Rules are deduplicated by canonical form, keeping the first; Rules()
//     lists the canonical forms in the order given.
//   - Name lookups take a name as a resolver or a client sends it: case
//     and one trailing dot do not matter, and a string that is not a valid
//     host name matches nothing. They cost one map lookup per label of the
//     name (exact names in a map, wildcards found by walking the name's
//     suffixes), whatever the number of rules.
//   - Address lookups scan the address rules (at most MaxRules prefixes).
//     A strict special address (see Special) is matched only by a rule for
//     exactly that address.
//   - When several rules match, exact names win over wildcards, longer
//     wildcard suffixes over shorter ones, and otherwise the earlier rule;
//     the rule returned is its canonical text.
type Policy struct {
	rules []Rule
	text  []string         // canonical forms, index-aligned with rules
	exact map[string][]int // name → indexes of its exact rules
	wild  map[string][]int // wildcard suffix → indexes
	addrs []int            // indexes of address rules
}

// Compile parses rules into a policy.
func Compile(rules []string) (*Policy, error) {
	var errs []error
	if len(rules) > MaxRules {
		errs = append(errs, fmt.Errorf("%w: %d rules, at most %d (rules after the first %d were not checked)",
			ErrInvalid, len(rules), MaxRules, MaxRules))
		rules = rules[:MaxRules]
	}
	p := &Policy{exact: map[string][]int{}, wild: map[string][]int{}}
	seen := make(map[string]bool, len(rules))
	for i, s := range rules {
		r, err := ParseRule(s)
		if err != nil {
			q := fmt.Sprintf("%.80q", s)
			if len(s) > 80 {
				q += "..."
			}
			errs = append(errs, fmt.Errorf("rule %d %s: %w", i, q, err))
			continue
		}
		c := r.String()
		if seen[c] {
			continue
		}
		seen[c] = true
		n := len(p.rules)
		p.rules = append(p.rules, r)
		p.text = append(p.text, c)
		switch {
		case r.IsAddr():
			p.addrs = append(p.addrs, n)
		case r.Wildcard:
			p.wild[r.Name] = append(p.wild[r.Name], n)
		default:
			p.exact[r.Name] = append(p.exact[r.Name], n)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// Rules returns the policy's rules in canonical form.
func (p *Policy) Rules() []string {
	if p == nil {
		return []string{}
	}
	return append([]string{}, p.text...)
}

// Len is the number of (distinct) rules.
func (p *Policy) Len() int {
	if p == nil {
		return 0
	}
	return len(p.rules)
}

// AllowsName reports whether a name rule allows name at some port: the
// resolver's question.
func (p *Policy) AllowsName(name string) (rule string, ok bool) {
	return p.matchName(name, 0, true)
}

// AllowsNamePort reports whether a name rule allows name at port.
func (p *Policy) AllowsNamePort(name string, port uint16) (rule string, ok bool) {
	return p.matchName(name, port, false)
}

func (p *Policy) matchName(name string, port uint16, anyPort bool) (string, bool) {
	if p == nil || (len(p.exact) == 0 && len(p.wild) == 0) {
		return "", false
	}
	name, valid := canonName(name)
	if !valid {
		return "", false
	}
	if rule, ok := p.pick(p.exact[name], port, anyPort); ok {
		return rule, true
	}
	if len(p.wild) == 0 {
		return "", false
	}
	// Proper suffixes only, longest first: "a.b.c.d" tries "b.c.d", "c.d".
	for i := strings.IndexByte(name, '.'); i >= 0; {
		suffix := name[i+1:]
		if rule, ok := p.pick(p.wild[suffix], port, anyPort); ok {
			return rule, true
		}
		j := strings.IndexByte(suffix, '.')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return "", false
}

func (p *Policy) pick(idx []int, port uint16, anyPort bool) (string, bool) {
	for _, i := range idx {
		if anyPort || p.rules[i].AllowsPort(port) {
			return p.text[i], true
		}
	}
	return "", false
}

// hasAddrRules reports whether p allows addresses by rule, which no pin
// (and so no gate) knows of.
func (p *Policy) hasAddrRules() bool { return p != nil && len(p.addrs) > 0 }

// AllowsAddr reports whether an address rule allows dst.
func (p *Policy) AllowsAddr(dst netip.AddrPort) (rule string, ok bool) {
	return p.matchAddr(dst.Addr(), dst.Port(), false)
}

// NamesRange reports whether an address rule covers a at any port, so a
// name resolving there is no rebinding: the user named that range.
func (p *Policy) NamesRange(a netip.Addr) bool {
	_, ok := p.matchAddr(a, 0, true)
	return ok
}

func (p *Policy) matchAddr(a netip.Addr, port uint16, anyPort bool) (string, bool) {
	if p == nil || len(p.addrs) == 0 {
		return "", false
	}
	a = a.Unmap().WithZone("")
	classified, strict := false, false
	for _, i := range p.addrs {
		r := p.rules[i]
		if !r.Prefix.Contains(a) || !(anyPort || r.AllowsPort(port)) {
			continue
		}
		if !classified {
			_, strict, _ = classify(a)
			classified = true
		}
		if strict && !r.Prefix.IsSingleIP() {
			continue
		}
		return p.text[i], true
	}
	return "", false
}
