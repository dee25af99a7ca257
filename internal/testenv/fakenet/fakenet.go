// Package fakenet is a fake internet for tests: a network namespace of its
// own, joined to the host by a veth pair, holding an authoritative DNS
// server for the zone "test.", HTTP and HTTPS servers (a test CA signs a
// certificate for every name of the zone), a TCP echo, a server-first TCP
// service, a UDP echo and a simple package index.
//
// Its addresses come from the documentation ranges 203.0.113.0/24,
// 198.51.100.0/24 and 2001:db8::/32, deliberately not "private", so a
// policy that refuses private ranges still lets tests reach it. The host
// reaches them through host routes over the veth pair; nothing in the host
// namespace listens.
//
// One fake internet exists on a host at a time (its addresses and routes
// are fixed): Start waits for a host-wide lock. Everything it makes dies
// with the test process even when Close never runs: the namespace is held
// only by the process's descriptors and sockets, and the veth pair and the
// routes die with it.
package fakenet

import "net/netip"

// The zone's names and their addresses. Every service listens on every
// address of the namespace, so each name reaches each service.
var zone = map[string]netip.Addr{
	"allowed.test":         netip.MustParseAddr("203.0.113.10"),
	"denied.test":          netip.MustParseAddr("203.0.113.11"),
	"api.allowed.test":     netip.MustParseAddr("203.0.113.12"),
	"a.wild.test":          netip.MustParseAddr("203.0.113.13"),
	"b.c.wild.test":        netip.MustParseAddr("203.0.113.14"),
	"wild.test":            netip.MustParseAddr("203.0.113.15"), // the apex: "*.wild.test" does not cover it
	"shared-a.test":        netip.MustParseAddr("203.0.113.20"),
	"shared-b.test":        netip.MustParseAddr("203.0.113.20"),
	"pypi.test":            netip.MustParseAddr("203.0.113.30"),
	"ns.test":              netip.MustParseAddr("203.0.113.53"),
	"other.test":           netip.MustParseAddr("198.51.100.130"),
	"v6.test":              netip.MustParseAddr("203.0.113.60"),
	"rebind-loopback.test": netip.MustParseAddr("127.0.0.1"),
	"rebind-metadata.test": netip.MustParseAddr("169.254.169.254"),
	"rebind-private.test":  netip.MustParseAddr("10.9.9.9"),
	"tunnel.test":          netip.MustParseAddr("203.0.113.99"),
	"mail.allowed.test":    netip.MustParseAddr("203.0.113.25"),
}

// zone6 holds the names with an AAAA record.
var zone6 = map[string]netip.Addr{
	"v6.test": netip.MustParseAddr("2001:db8::60"),
}

// TunnelSuffix is a domain every name under which exists (a wildcard); TXT
// answers carry the first label, as a DNS tunnel's server would.
const TunnelSuffix = "tunnel.test"

// Service ports, the well-known ones so that a rule without a port (80
// and 443) covers HTTP and HTTPS.
const (
	HTTPPort    uint16 = 80
	HTTPSPort   uint16 = 443
	EchoPort    uint16 = 7  // TCP echo
	BannerPort  uint16 = 22 // server-first: sends Banner, then echoes
	UDPEchoPort uint16 = 7
	DNSPort     uint16 = 53
)

// Banner is what the server-first service sends before reading anything.
const Banner = "SSH-2.0-fakenet\r\n"

// The link between the host and the fake internet, and the routes the
// host gets.
var (
	hostLinkAddr  = netip.MustParsePrefix("198.51.100.1/30")
	innerLinkAddr = netip.MustParsePrefix("198.51.100.2/30")
	hostLink6     = netip.MustParsePrefix("2001:db8:ffff::1/64")
	innerLink6    = netip.MustParsePrefix("2001:db8:ffff::2/64")
	routed        = []netip.Prefix{
		netip.MustParsePrefix("203.0.113.0/24"),
		netip.MustParsePrefix("198.51.100.128/25"),
		netip.MustParsePrefix("2001:db8::/64"),
	}
	dnsAddr = netip.MustParseAddr("203.0.113.53")
)

// HostLink is the name of the host side of the veth pair.
const HostLink = "wfakenet0"

const innerLink = "eth0"
