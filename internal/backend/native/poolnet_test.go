package native_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestWarmPoolNetwork: a warm pool on a backend that gives sandboxes a
// network attaches each pooled agent's link when it fills, and a pooled
// start takes that link (no new one): the sandbox's address is the one
// NetAddr reports, its resolver is its gateway, and its TCP reaches the
// host's proxy port, from its own address. A loopback-only sandbox on the
// same backend gets no link. Crash leftovers of pooled links (a pool of a
// process that is gone) are swept; a live process's are not. Nothing is
// left after the sandbox's removal and the pool's closing: no interface of
// the plumbing's, no element in its table.
func TestWarmPoolNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireFile(t, "/usr/bin/python3")
	svc := newNetServices(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "warren-poolnet-" + hex.EncodeToString(b)
	cfg := svc.config(prefix)

	// Leftovers of a crash: pooled links of a process that is gone
	// (its agents' namespaces still held here, as if they were alive)
	// and of a live one (pid 1), attached by a Host that then went away.
	old, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatalf("netplumb: %v", err)
	}
	deadID, liveID := ".pool-99999999-1", ".pool-1-1"
	for _, id := range []string{deadID, liveID} {
		if _, err := old.Attach(id, newNetns(t)); err != nil {
			t.Fatalf("attach %s: %v", id, err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	h, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatalf("netplumb: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Remove(); err != nil {
			t.Errorf("netplumb remove: %v", err)
		}
	})
	aliasOf := func(id string) string { return prefix + " " + id }

	base := testenv.SearchableDir(t, "warren-poolnet-test-")
	be, err := native.New(native.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
		AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: prefix, Prewarm: 2, Net: h,
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = be.Close()
		}
	})
	waitFor(t, be.PoolSettled)
	if _, err := be.ReapOrphans(nil); err != nil {
		t.Fatalf("reap: %v", err)
	}
	links := linksOf(t, h.VethPrefix())
	var pooled []string
	for name, alias := range links {
		switch {
		case alias == aliasOf(deadID):
			t.Errorf("the link of a gone process's pooled agent was not swept")
		case alias == aliasOf(liveID):
		case strings.HasPrefix(alias, aliasOf(".pool-")):
			pooled = append(pooled, name)
		default:
			t.Errorf("unexpected link %s (%q)", name, alias)
		}
	}
	if !slices.ContainsFunc(mapValues(links), func(a string) bool { return a == aliasOf(liveID) }) {
		t.Errorf("a live process's pooled link was swept")
	}
	// Two ready, one more spawned waiting for a slot: each has its link.
	if len(pooled) != 3 {
		t.Errorf("pooled links %v, want 3", pooled)
	}
	if els := spoofElements(t, prefix); len(els) != 3 {
		t.Errorf("table elements %v, want the 3 pooled agents'", els)
	}

	img, err := be.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := func(id, network string) backend.Sandbox {
		t.Helper()
		sb, err := be.Create(ctx, backend.Config{ID: id, Image: img, Network: network})
		if err != nil {
			t.Fatal(err)
		}
		if err := sb.Start(ctx); err != nil {
			_ = sb.Remove(ctx)
			t.Fatalf("start %s: %v", id, err)
		}
		return sb
	}
	sb := start("pooled-net", backend.NetworkEgress)
	addr := sb.(backend.Networked).NetAddr()
	if !addr.IsValid() || !cfg.Pool.Contains(addr) {
		t.Fatalf("NetAddr %v, want an address of %v", addr, cfg.Pool)
	}
	gw := addr.Prev() // the /30's .1
	var own string
	for name, alias := range linksOf(t, h.VethPrefix()) {
		if alias == aliasOf("pooled-net") {
			own = name
		}
	}
	if !slices.Contains(pooled, own) {
		t.Errorf("the sandbox's link %q is not one of the pool's %v: attached at start", own, pooled)
	}
	r := conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/etc/resolv.conf")
	if !strings.Contains(r.Stdout, "nameserver "+gw.String()+"\n") {
		t.Errorf("resolv.conf %q does not name the gateway %s", r.Stdout, gw)
	}
	r = conformance.Exec(t, sb, 10*time.Second, "/usr/bin/python3", "-c",
		"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.connect(('"+gw.String()+"', 53))\nprint(s.getsockname()[0])")
	if got := strings.TrimSpace(r.Stdout); got != addr.String() {
		t.Errorf("the sandbox's source address %q (%s), NetAddr %s", got, r.Stderr, addr)
	}
	// With the gate open (the registry's to do in a server), any TCP
	// connection lands on the proxy's port; the connect completes into the
	// listener's backlog, accepted once the command is done.
	if err := h.Gate().Bypass(addr, true); err != nil {
		t.Fatal(err)
	}
	r = conformance.Exec(t, sb, 10*time.Second, "/usr/bin/python3", "-c",
		"import socket\nc = socket.create_connection(('192.0.2.1', 80), timeout=5)\nc.sendall(b'pooled')\nc.close()")
	if r.ExitStatus.Code != 0 {
		t.Errorf("connect from the sandbox: %d %s", r.ExitStatus.Code, r.Stderr)
	} else {
		_ = svc.proxy.SetDeadline(time.Now().Add(5 * time.Second))
		c, err := svc.proxy.AcceptTCP()
		if err != nil {
			t.Fatalf("proxy port: %v", err)
		}
		from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		_ = c.Close()
		if from != addr {
			t.Errorf("the proxy port's connection came from %v, want %v", from, addr)
		}
	}

	// Loopback only on the same backend: no eth0.
	lo := start("pooled-lo", backend.NetworkNone)
	r = conformance.Exec(t, lo, 10*time.Second, "/bin/cat", "/proc/net/dev")
	if strings.Contains(r.Stdout, "eth0") {
		t.Errorf("a loopback-only sandbox has eth0:\n%s", r.Stdout)
	}
	if a := lo.(backend.Networked).NetAddr(); a.IsValid() {
		t.Errorf("a loopback-only sandbox's NetAddr %v", a)
	}
	for _, s := range []backend.Sandbox{sb, lo} {
		if err := s.Remove(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The release runs in the background: its link and element go soon.
	left := func() (out []string) {
		if _, ok := linksOf(t, h.VethPrefix())[own]; ok {
			out = append(out, own)
		}
		for _, e := range spoofElements(t, prefix) {
			if strings.HasPrefix(e, own+" ") {
				out = append(out, e)
			}
		}
		return out
	}
	for deadline := time.Now().Add(10 * time.Second); len(left()) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if l := left(); len(l) > 0 {
		t.Errorf("the removed sandbox's link or table element is left: %v", l)
	}
	waitFor(t, be.PoolSettled)

	closed = true
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	for name, alias := range linksOf(t, h.VethPrefix()) {
		if alias != aliasOf(liveID) {
			t.Errorf("link %s (%q) left after the pool closed", name, alias)
		}
	}
	if els := spoofElements(t, prefix); len(els) != 0 {
		t.Errorf("table elements left after the pool closed: %v", els)
	}
}

// netServices stand in for the resolver and the proxy: a TCP listener for
// the proxy, UDP and TCP on one port for the resolver.
type netServices struct {
	proxy    *net.TCPListener
	resolver uint16
}

func newNetServices(t *testing.T) *netServices {
	t.Helper()
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	s := &netServices{proxy: l}
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
		s.resolver = uint16(u.LocalAddr().(*net.UDPAddr).Port) //nolint:gosec // a port number
		break
	}
	if s.resolver == 0 {
		t.Fatal("no free port for both UDP and TCP")
	}
	return s
}

// config is a plumbing Config for these services with an address range of
// its own (a server on this machine may be using the default one).
func (s *netServices) config(prefix string) netplumb.Config {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return netplumb.Config{
		Prefix:       prefix,
		Pool:         netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128 + b[0]%112, b[1] & 0xf0, 0}), 20),
		ResolverPort: s.resolver,
		ProxyPort:    uint16(s.proxy.Addr().(*net.TCPAddr).Port), //nolint:gosec // a port number
	}
}

// newNetns returns a new network namespace, held open until the test ends.
func newNetns(t *testing.T) *os.File {
	t.Helper()
	type res struct {
		f   *os.File
		err error
	}
	c := make(chan res)
	go func() {
		// Never unlocked: the thread leaves the process's namespace, so
		// it ends with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			c <- res{err: err}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		c <- res{f, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatalf("new netns: %v", r.err)
	}
	t.Cleanup(func() { _ = r.f.Close() })
	return r.f
}

// linksOf maps the host's interfaces whose name starts with prefix to
// their aliases.
func linksOf(t *testing.T, prefix string) map[string]string {
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

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// spoofElements lists the table's anti-spoof elements as "ifname addr".
func spoofElements(t *testing.T, table string) []string {
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

// TestReattachNetworkBeforePool: a server restarted with a warm pool keeps
// a running sandbox's address. The new backend reserves the links its run
// directory records before the pool attaches links of its own, so no pooled
// agent takes the address of the sandbox about to be reattached.
func TestReattachNetworkBeforePool(t *testing.T) {
	testenv.RequireRoot(t)
	svc := newNetServices(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "warren-poolnet-" + hex.EncodeToString(b)
	cfg := svc.config(prefix)
	h, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatalf("netplumb: %v", err)
	}
	base := testenv.SearchableDir(t, "warren-poolnet-test-")
	opts := native.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
		AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: prefix, Net: h,
	}
	be, err := native.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	img, err := be.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bcfg := backend.Config{ID: "kept", Image: img, Network: backend.NetworkEgress}
	sb, err := be.Create(ctx, bcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		_ = sb.Remove(ctx)
		t.Fatal(err)
	}
	addr := sb.(backend.Networked).NetAddr()
	// The server goes; the sandbox keeps running. The next one writes the
	// table anew and starts with a warm pool.
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h2, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatalf("netplumb: %v", err)
	}
	t.Cleanup(func() {
		if err := h2.Remove(); err != nil {
			t.Errorf("netplumb remove: %v", err)
		}
	})
	opts.Net, opts.Prewarm = h2, 3
	be2, err := native.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = be2.Close() })
	waitFor(t, be2.PoolSettled)
	sb2, err := be2.Open(ctx, bcfg)
	if err != nil {
		t.Fatalf("reattach: %v", err)
	}
	t.Cleanup(func() { _ = sb2.Remove(context.Background()) })
	if got := sb2.(backend.Networked).NetAddr(); got != addr {
		t.Errorf("reattached with address %v, want its own %v", got, addr)
	}
	if els := spoofElements(t, prefix); !slices.ContainsFunc(els, func(e string) bool { return strings.HasSuffix(e, " "+addr.String()) }) {
		t.Errorf("the reattached sandbox's address %v has no anti-spoof element: %v", addr, els)
	}
}
