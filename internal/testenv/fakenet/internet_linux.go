package fakenet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// Internet is a running fake internet.
type Internet struct {
	// DNS is the authoritative server for "test." (UDP and TCP).
	DNS netip.AddrPort
	// CAPEM is the test CA's certificate, PEM; CAFile holds the same in a
	// file anyone can read.
	CAPEM  []byte
	CAFile string
	// The services' ports (the package's constants, here for callers
	// that hold only an *Internet).
	HTTPPort, HTTPSPort, EchoPort, BannerPort, UDPEchoPort uint16
	// Package is the package the index at pypi.test serves, Module the
	// module its wheel installs, and Version its version.
	Package, Module, Version string

	// setup is how long start took once it held the host-wide lock.
	setup time.Duration

	ns      netns.NsHandle
	lock    *os.File
	closers []func() error
	wg      sync.WaitGroup
	once    sync.Once

	mu       sync.Mutex
	queries  []string       // names the DNS server was asked, oldest first
	requests map[string]int // HTTP(S) requests by Host (port removed)
}

// maxQueries bounds the list of queries kept.
const maxQueries = 100000

// lockPath serializes fake internets host-wide: their addresses are fixed.
const lockPath = "/run/warren-fakenet.lock"

// Start makes a fake internet and registers its Close with t.Cleanup. It
// needs root.
func Start(t testing.TB) *Internet {
	t.Helper()
	testenv.RequireRoot(t)
	in, err := start()
	if err != nil {
		t.Fatalf("fakenet: %v", err)
	}
	t.Cleanup(func() {
		if err := in.Close(); err != nil {
			t.Errorf("fakenet: close: %v", err)
		}
	})
	return in
}

func start() (in *Internet, err error) {
	in = &Internet{
		DNS: netip.AddrPortFrom(dnsAddr, DNSPort), HTTPPort: HTTPPort, HTTPSPort: HTTPSPort, EchoPort: EchoPort,
		BannerPort: BannerPort, UDPEchoPort: UDPEchoPort, Package: pkgName, Module: pkgModule, Version: pkgVersion,
		requests: map[string]int{}, ns: -1,
	}
	if in.lock, err = hostLock(); err != nil {
		return nil, err
	}
	locked := time.Now()
	defer func() {
		if err != nil {
			_ = in.Close()
			in = nil
		}
	}()
	tlsConf, caPEM, err := newCA()
	if err != nil {
		return nil, err
	}
	in.CAPEM = caPEM
	if in.CAFile, err = writeCA(caPEM); err != nil {
		return nil, err
	}
	in.closers = append(in.closers, func() error { return os.RemoveAll(filepath.Dir(in.CAFile)) })
	index, err := newIndex()
	if err != nil {
		return nil, err
	}
	var ls listeners
	if in.ns, ls, err = inNamespace(); err != nil {
		return nil, err
	}
	for _, c := range ls.all() {
		in.closers = append(in.closers, c.Close)
	}
	if err := in.link(); err != nil {
		return nil, err
	}
	in.serve(ls, tlsConf, index)
	in.setup = time.Since(locked)
	return in, nil
}

// hostLock takes the host-wide lock, waiting up to two minutes for a
// fake internet of another test process to close.
func hostLock() (*os.File, error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockPath, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// writeCA writes the CA's PEM where a process of any uid can read it.
func writeCA(pem []byte) (string, error) {
	dir, err := os.MkdirTemp("", "fakenet-ca-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil { //nolint:gosec // a CA certificate is public
		return "", err
	}
	p := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(p, pem, 0o644); err != nil { //nolint:gosec // a CA certificate is public
		return "", err
	}
	return p, nil
}

// listeners are the sockets made inside the namespace.
type listeners struct {
	http, https, echo, banner, dnsTCP net.Listener
	udpEcho, dnsUDP                   net.PacketConn
}

func (l *listeners) all() []interface{ Close() error } {
	var cs []interface{ Close() error }
	for _, c := range []interface{ Close() error }{l.http, l.https, l.echo, l.banner, l.dnsTCP, l.udpEcho, l.dnsUDP} {
		if c != nil { // a nil field converts to a nil interface
			cs = append(cs, c)
		}
	}
	return cs
}

// inNamespace makes the namespace and its sockets on a thread of its own:
// a socket stays in the namespace it was made in, whichever thread serves
// it later. The thread goes back to the host's namespace; if it cannot, it
// stays locked and dies with its goroutine.
func inNamespace() (netns.NsHandle, listeners, error) {
	type result struct {
		ns  netns.NsHandle
		ls  listeners
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var r result
		r.ns = -1
		defer func() { done <- r }()
		host, err := netns.Get()
		if err != nil {
			r.err = fmt.Errorf("current netns: %w", err)
			return
		}
		defer func() { _ = host.Close() }()
		r.ns, r.err = netns.New()
		if r.err != nil {
			r.err = fmt.Errorf("new netns: %w", r.err)
			_ = netns.Set(host)
			return
		}
		r.ls, r.err = listen()
		if err := netns.Set(host); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("back to the host netns: %w", err))
			return // the thread stays locked: it ends with this goroutine
		}
		runtime.UnlockOSThread()
	}()
	r := <-done
	if r.err != nil {
		for _, c := range r.ls.all() {
			_ = c.Close()
		}
		if r.ns >= 0 {
			_ = r.ns.Close()
		}
		return -1, listeners{}, r.err
	}
	return r.ns, r.ls, nil
}

// listen makes the services' sockets, on every address of the current
// namespace.
func listen() (ls listeners, err error) {
	defer func() {
		if err != nil {
			for _, c := range ls.all() {
				_ = c.Close()
			}
		}
	}()
	tcp := func(port uint16) (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf(":%d", port)) }
	// IPv4 only: the replies' source address is set per datagram.
	udp := func(port uint16) (net.PacketConn, error) { return net.ListenPacket("udp4", fmt.Sprintf(":%d", port)) }
	if ls.http, err = tcp(HTTPPort); err != nil {
		return ls, err
	}
	if ls.https, err = tcp(HTTPSPort); err != nil {
		return ls, err
	}
	if ls.echo, err = tcp(EchoPort); err != nil {
		return ls, err
	}
	if ls.banner, err = tcp(BannerPort); err != nil {
		return ls, err
	}
	if ls.dnsTCP, err = tcp(DNSPort); err != nil {
		return ls, err
	}
	if ls.udpEcho, err = udp(UDPEchoPort); err != nil {
		return ls, err
	}
	ls.dnsUDP, err = udp(DNSPort)
	return ls, err
}

// link makes the veth pair, addresses the namespace's side with every
// address of the zone, and gives the host routes to them.
func (in *Internet) link() error {
	inner, err := netlink.NewHandleAt(in.ns)
	if err != nil {
		return fmt.Errorf("netlink in the netns: %w", err)
	}
	defer inner.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: HostLink}, PeerName: innerLink, PeerNamespace: netlink.NsFd(int(in.ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", HostLink, err)
	}
	// Deleting one side deletes both, and the routes through it.
	in.closers = append(in.closers, func() error {
		l, err := netlink.LinkByName(HostLink)
		if err != nil {
			return nil //nolint:nilerr // already gone: nothing to delete
		}
		return netlink.LinkDel(l)
	})
	host, err := netlink.LinkByName(HostLink)
	if err != nil {
		return err
	}
	peer, err := inner.LinkByName(innerLink)
	if err != nil {
		return err
	}
	lo, err := inner.LinkByName("lo")
	if err != nil {
		return err
	}
	addr := func(h *netlink.Handle, l netlink.Link, p netip.Prefix) error {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD // usable at once
		}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", p, l.Attrs().Name, err)
		}
		return nil
	}
	hostH := &netlink.Handle{}
	if err := addr(hostH, host, hostLinkAddr); err != nil {
		return err
	}
	if err := addr(hostH, host, hostLink6); err != nil {
		return err
	}
	if err := addr(inner, peer, innerLinkAddr); err != nil {
		return err
	}
	if err := addr(inner, peer, innerLink6); err != nil {
		return err
	}
	seen := map[netip.Addr]bool{}
	for _, a := range append(zoneAddrs(zone), zoneAddrs(zone6)...) {
		if seen[a] || !routedAddr(a) {
			continue
		}
		seen[a] = true
		if err := addr(inner, peer, netip.PrefixFrom(a, a.BitLen())); err != nil {
			return err
		}
	}
	for _, l := range []netlink.Link{lo, peer} {
		if err := inner.LinkSetUp(l); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	for _, gw := range []netip.Addr{hostLinkAddr.Addr(), hostLink6.Addr()} {
		r := &netlink.Route{LinkIndex: peer.Attrs().Index, Gw: gw.AsSlice()}
		if err := inner.RouteAdd(r); err != nil {
			return fmt.Errorf("default route via %s in the netns: %w", gw, err)
		}
	}
	for _, p := range routed {
		gw := innerLinkAddr.Addr()
		if p.Addr().Is6() {
			gw = innerLink6.Addr()
		}
		dst := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: dst, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("host route to %s: %w", p, err)
		}
	}
	return nil
}

func zoneAddrs(z map[string]netip.Addr) []netip.Addr {
	var as []netip.Addr
	for _, a := range z {
		as = append(as, a)
	}
	sort.Slice(as, func(i, j int) bool { return as[i].Less(as[j]) })
	return as
}

// routedAddr: the fake internet holds a only if the host routes to it (the
// rebinding names' addresses are not the fake internet's).
func routedAddr(a netip.Addr) bool {
	for _, p := range routed {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Addr is name's IPv4 address in the zone (the invalid Addr for a name
// the zone lacks). The name may end with a dot; case does not matter.
func (in *Internet) Addr(name string) netip.Addr {
	return zone[canonical(name)]
}

// Addr6 is name's IPv6 address in the zone, if it has one.
func (in *Internet) Addr6(name string) netip.Addr {
	return zone6[canonical(name)]
}

// Names lists the zone's names (tunnel names aside).
func (in *Internet) Names() []string {
	var ns []string
	for n := range zone {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

func canonical(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

// Queries lists the names the DNS server was asked (lower case, no
// trailing dot), oldest first; the most recent 100000 at most.
func (in *Internet) Queries() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.queries...)
}

// Requests is how many HTTP and HTTPS requests came with Host host (no
// port).
func (in *Internet) Requests(host string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.requests[canonical(host)]
}

func (in *Internet) noteQuery(name string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.queries) >= maxQueries {
		in.queries = in.queries[1:]
	}
	in.queries = append(in.queries, name)
}

func (in *Internet) noteRequest(host string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.requests[canonical(host)]++
}

// Close stops the services and removes the namespace, the veth pair, the
// routes and the CA file. It waits for the services' goroutines.
func (in *Internet) Close() error {
	var err error
	in.once.Do(func() {
		for i := len(in.closers) - 1; i >= 0; i-- {
			if e := in.closers[i](); e != nil && !errors.Is(e, net.ErrClosed) {
				err = errors.Join(err, e)
			}
		}
		in.wg.Wait()
		if in.ns >= 0 {
			err = errors.Join(err, in.ns.Close())
		}
		if in.lock != nil {
			err = errors.Join(err, in.lock.Close())
		}
	})
	return err
}
