package testenv

import (
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/warren-sandbox/warren/internal/netplumb"
)

// Tests of the host's network plumbing (package netplumb) in the backends
// that attach sandboxes to it.

// NetServices stand in for the resolver and the proxy: a TCP listener for
// the proxy, UDP and TCP on one port for the resolver.
type NetServices struct {
	Proxy    *net.TCPListener
	Resolver uint16
}

// NewNetServices listens on the host for a test of the plumbing.
func NewNetServices(t testing.TB) *NetServices {
	t.Helper()
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	s := &NetServices{Proxy: l}
	for range 20 {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{})
		if err != nil {
			t.Fatal(err)
		}
		tl, err := net.ListenTCP("tcp4", &net.TCPAddr{Port: u.LocalAddr().(*net.UDPAddr).Port})
		if err != nil {
			_ = u.Close()
			continue
		}
		t.Cleanup(func() { _ = u.Close(); _ = tl.Close() })
		s.Resolver = uint16(u.LocalAddr().(*net.UDPAddr).Port) //nolint:gosec // a port number
		break
	}
	if s.Resolver == 0 {
		t.Fatal("no free port for both UDP and TCP")
	}
	return s
}

// Config is a plumbing Config for these services with an address range of
// its own (a server on this machine may be using the default one).
func (s *NetServices) Config(prefix string) netplumb.Config {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	second := 128 + b[0]%112
	if second == netplumb.DefaultPool.Addr().As4()[1] {
		second++ // not a server's default range: one may be running here
	}
	return netplumb.Config{
		Prefix:       prefix,
		Pool:         netip.PrefixFrom(netip.AddrFrom4([4]byte{10, second, b[1] & 0xf0, 0}), 20),
		ResolverPort: s.Resolver,
		ProxyPort:    uint16(s.Proxy.Addr().(*net.TCPAddr).Port), //nolint:gosec // a port number
	}
}

// LinksOf maps the host's interfaces whose name starts with prefix to
// their aliases.
func LinksOf(t testing.TB, prefix string) map[string]string {
	t.Helper()
	var links []netlink.Link
	var err error
	for range 20 { // others' links come and go: a dump may be interrupted
		if links, err = netlink.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out[l.Attrs().Name] = l.Attrs().Alias
		}
	}
	return out
}

// SpoofElements lists the table's anti-spoof elements as "ifname addr".
func SpoofElements(t testing.TB, table string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	set, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: table}, "spoof")
	if err != nil {
		t.Fatalf("set: %v", err)
	}
	els, err := c.GetSetElements(set)
	if err != nil {
		t.Fatalf("elements: %v", err)
	}
	var out []string
	for _, e := range els {
		a, _ := netip.AddrFromSlice(e.Key[16:20])
		out = append(out, strings.TrimRight(string(e.Key[:16]), "\x00")+" "+a.String())
	}
	return out
}
