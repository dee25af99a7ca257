package native_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

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
	svc := testenv.NewNetServices(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "warren-poolnet-" + hex.EncodeToString(b)
	cfg := svc.Config(prefix)

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
	links := testenv.LinksOf(t, h.VethPrefix())
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
	if els := testenv.SpoofElements(t, prefix); len(els) != 3 {
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
	for name, alias := range testenv.LinksOf(t, h.VethPrefix()) {
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
		_ = svc.Proxy.SetDeadline(time.Now().Add(5 * time.Second))
		c, err := svc.Proxy.AcceptTCP()
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
		if _, ok := testenv.LinksOf(t, h.VethPrefix())[own]; ok {
			out = append(out, own)
		}
		for _, e := range testenv.SpoofElements(t, prefix) {
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
	for name, alias := range testenv.LinksOf(t, h.VethPrefix()) {
		if alias != aliasOf(liveID) {
			t.Errorf("link %s (%q) left after the pool closed", name, alias)
		}
	}
	if els := testenv.SpoofElements(t, prefix); len(els) != 0 {
		t.Errorf("table elements left after the pool closed: %v", els)
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

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestReattachNetworkBeforePool: a server restarted with a warm pool keeps
// a running sandbox's address. The new backend reserves the links its run
// directory records before the pool attaches links of its own, so no pooled
// agent takes the address of the sandbox about to be reattached.
func TestReattachNetworkBeforePool(t *testing.T) {
	testenv.RequireRoot(t)
	svc := testenv.NewNetServices(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "warren-poolnet-" + hex.EncodeToString(b)
	cfg := svc.Config(prefix)
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
	if els := testenv.SpoofElements(t, prefix); !slices.ContainsFunc(els, func(e string) bool { return strings.HasSuffix(e, " "+addr.String()) }) {
		t.Errorf("the reattached sandbox's address %v has no anti-spoof element: %v", addr, els)
	}
}
