package egress

import (
	"net/netip"
	"sync/atomic"
)

// Special addresses are those a name must not resolve to (DNS rebinding)
// and an IP literal must not reach, unless an address rule names them:
// what is inside the host, the sandbox network or the provider's network
// rather than on the internet.
//
//   - IPv4-mapped IPv6 addresses are unwrapped first, so ::ffff:127.0.0.1
//     is loopback.
//   - Two kinds are "strict": the cloud metadata address 169.254.169.254
//     and host-local addresses (SetHostLocal: the host's own addresses and
//     the sandbox address pool, which holds every gateway and every other
//     sandbox). Only an address rule for exactly that one address opens a
//     strict address; a broad network rule such as 10.0.0.0/8:5432 or
//     0.0.0.0/0:* never does, so a rule written for a database network
//     cannot reach the host, another sandbox or instance credentials by
//     accident.
//   - The documentation ranges (192.0.2/24, 198.51.100/24, 203.0.113/24)
//     and the benchmarking range 198.18/15 are not special: the tests' fake
//     internet lives there.

type specialRange struct {
	p   netip.Prefix
	why string
}

var metadataAddr = netip.AddrFrom4([4]byte{169, 254, 169, 254})

// specialRanges is searched in order: the first match names the reason.
var specialRanges = func() []specialRange {
	rs := []struct{ p, why string }{
		{"0.0.0.0/32", "unspecified"},
		{"0.0.0.0/8", "\"this network\" (0/8)"},
		{"127.0.0.0/8", "loopback"},
		{"10.0.0.0/8", "private"},
		{"172.16.0.0/12", "private"},
		{"192.168.0.0/16", "private"},
		{"100.64.0.0/10", "shared address space (CGNAT)"},
		{"169.254.0.0/16", "link-local"},
		{"224.0.0.0/4", "multicast"},
		{"255.255.255.255/32", "broadcast"},
		{"240.0.0.0/4", "reserved"},
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local"},
		{"fc00::/7", "unique local (private)"},
		{"ff00::/8", "multicast"},
	}
	out := make([]specialRange, len(rs))
	for i, r := range rs {
		out[i] = specialRange{netip.MustParsePrefix(r.p), r.why}
	}
	return out
}()

// hostLocal holds the prefixes SetHostLocal was given.
var hostLocal atomic.Pointer[[]netip.Prefix]

// SetHostLocal declares the host's own addresses and the sandbox address
// pool (as prefixes; an address is a full-length prefix). They are special
// ("host-local") and strict for every sandbox of the process. The server
// sets them once at start and again when they change; it replaces the
// previous set.
func SetHostLocal(ps []netip.Prefix) {
	cp := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if p.IsValid() {
			if p.Addr().Is4In6() {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			cp = append(cp, p.Masked())
		}
	}
	hostLocal.Store(&cp)
}

func isHostLocal(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	ps := hostLocal.Load()
	if ps == nil {
		return false
	}
	for _, p := range *ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Special reports whether a is a special address, and which kind
// ("loopback", "cloud metadata", "private", "host-local", ...).
func Special(a netip.Addr) (why string, special bool) {
	why, _, special = classify(a)
	return why, special
}

// classify is Special and whether the kind is strict.
func classify(a netip.Addr) (why string, strict, special bool) {
	// A zone would make every Contains false.
	a = a.Unmap().WithZone("")
	if !a.IsValid() {
		return "invalid", false, true
	}
	if a == metadataAddr {
		return "cloud metadata", true, true
	}
	if isHostLocal(a) {
		return "host-local", true, true
	}
	for _, r := range specialRanges {
		if r.p.Contains(a) {
			return r.why, false, true
		}
	}
	return "", false, false
}
