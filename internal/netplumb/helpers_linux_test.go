package netplumb_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// netns is a network namespace held by a locked thread, which runs what the
// test hands it: a sandbox's side. The thread is never unlocked, so it dies
// with its goroutine and the namespace with its last reference.
type netns struct {
	f   *os.File
	run chan func()
}

func newNetns(t testing.TB) *netns {
	t.Helper()
	n := &netns{run: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- err
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		n.f = f
		ready <- err
		for fn := range n.run {
			fn()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		close(n.run)
		_ = n.f.Close()
	})
	return n
}

// do runs fn in the namespace.
func (n *netns) do(fn func()) {
	done := make(chan struct{})
	n.run <- func() { defer close(done); fn() }
	<-done
}

func requireNet(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	c, err := nftables.New()
	testenv.Require(t, err == nil, "nftables netlink")
	_, err = c.ListTables()
	testenv.Require(t, err == nil, "nftables")
}

// services stand in for the resolver and the proxy: a TCP listener for the
// proxy, UDP and TCP on one port for the resolver, all on the wildcard
// address of the host.
type services struct {
	proxy       *net.TCPListener
	resolverTCP *net.TCPListener
	resolverUDP *net.UDPConn
}

func newServices(t testing.TB) *services {
	t.Helper()
	s := &services{}
	l, err := netplumb.ListenTCP("0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	s.proxy = l.(*net.TCPListener)
	for range 20 {
		pc, err := netplumb.ListenUDP("0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		u := pc.(*net.UDPConn)
		tl, err := netplumb.ListenTCP(fmt.Sprintf("0.0.0.0:%d", u.LocalAddr().(*net.UDPAddr).Port))
		if err != nil {
			_ = u.Close()
			continue
		}
		s.resolverUDP, s.resolverTCP = u, tl.(*net.TCPListener)
		break
	}
	if s.resolverUDP == nil {
		t.Fatal("no free port for both UDP and TCP")
	}
	t.Cleanup(func() { _ = s.proxy.Close(); _ = s.resolverTCP.Close(); _ = s.resolverUDP.Close() })
	return s
}

// config is a Config for these services with a pool of its own: other
// tests and servers on this machine may be using the default pool, and
// Open refuses a pool that another's interfaces are in.
func (s *services) config(prefix string) netplumb.Config {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return netplumb.Config{
		Prefix:       prefix,
		Pool:         netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128 + b[0]%112, b[1] & 0xf0, 0}), 20),
		ResolverPort: uint16(s.resolverUDP.LocalAddr().(*net.UDPAddr).Port),
		ProxyPort:    uint16(s.proxy.Addr().(*net.TCPAddr).Port),
	}
}

// openHost opens a Host with a prefix of the test's own and removes it at
// the end, checking that Remove leaves nothing.
func openHost(t testing.TB, cfg netplumb.Config) *netplumb.Host {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = testPrefix()
	}
	h, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
		if n := vethsOf(t, h.VethPrefix()); len(n) != 0 {
			t.Errorf("Remove left veths %v", n)
		}
		if _, err := listTable(cfg.Prefix); err == nil {
			t.Errorf("Remove left table %s", cfg.Prefix)
		}
	})
	return h
}

func listTable(name string) (*nftables.Table, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	return c.ListTableOfFamily(name, nftables.TableFamilyINet)
}

// elements lists the table's anti-spoof set elements as "ifname addr".
func elements(t testing.TB, table string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := &nftables.Table{Family: nftables.TableFamilyINet, Name: table}
	set, err := c.GetSetByName(tb, "spoof")
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

// vethsOf lists the host's interfaces whose name starts with prefix.
func vethsOf(t testing.TB, prefix string) []string {
	t.Helper()
	var links []netlink.Link
	var err error
	for range 20 { // other tests' links come and go: a dump may be interrupted
		if links, err = netlink.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// originalDst reads SO_ORIGINAL_DST of an accepted, redirected connection.
func originalDst(t testing.TB, c *net.TCPConn) netip.AddrPort {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mreq *unix.IPv6Mreq
	var serr error
	if err := rc.Control(func(fd uintptr) {
		// struct sockaddr_in is 16 bytes, as is this type.
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatalf("SO_ORIGINAL_DST: %v", serr)
	}
	b := mreq.Multiaddr
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), uint16(b[2])<<8|uint16(b[3]))
}

func isRefusal(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.ECONNRESET)
}

func dialTCP(dst string) (net.Conn, error) {
	d := net.Dialer{Timeout: fast}
	return d.Dial("tcp4", dst)
}

func acceptWithin(l *net.TCPListener, wait time.Duration) (*net.TCPConn, error) {
	_ = l.SetDeadline(time.Now().Add(wait))
	return l.AcceptTCP()
}

// setElements lists the raw keys of a set of the table.
func setElements(t testing.TB, table, name string) [][]byte {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	set, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: table}, name)
	if err != nil {
		t.Fatalf("set %s: %v", name, err)
	}
	els, err := c.GetSetElements(set)
	if err != nil {
		t.Fatalf("elements of %s: %v", name, err)
	}
	var out [][]byte
	for _, e := range els {
		out = append(out, e.Key)
	}
	return out
}

// testPrefix is a server prefix of the test's own: test processes may run
// side by side.
func testPrefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "warren-test-" + hex.EncodeToString(b)
}

// openAll lets every connection of l's sandbox through the gate to the
// proxy, for tests of what is behind it (the gate has its own test).
func openAll(t testing.TB, h *netplumb.Host, l netplumb.Link) {
	t.Helper()
	if err := h.Gate().Bypass(l.Addr, true); err != nil {
		t.Fatal(err)
	}
}
