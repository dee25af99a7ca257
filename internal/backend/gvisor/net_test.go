package gvisor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestNetwork: a sandbox of Config.Network egress gets a link of the
// host's plumbing in a namespace the backend made, which runsc's sentry
// takes over: NetAddr is an address of the pool, resolv.conf names the
// gateway, the sentry's packets leave from the sandbox's address, and a
// TCP connection reaches the host's proxy port from it, before and after
// a checkpoint; its restore does from an address of its own. A
// loopback-only sandbox on the same backend has no eth0. A stop frees the
// link and a start attaches one again. After the removal nothing is left:
// no interface, no table element, no pinned namespace. A backend without plumbing refuses
// egress as unsupported.
func TestNetwork(t *testing.T) {
	n := newNetBackend(t)
	svc, cfg, h, be, img, prefix := n.svc, n.cfg, n.h, n.be, n.img, n.prefix
	base, run := n.base, filepath.Join(n.base, "run")
	ctx := context.Background()
	start := func(id, network string) backend.Sandbox {
		t.Helper()
		sb, err := be.Create(ctx, backend.Config{ID: id, Image: img, Network: network, MemoryBytes: 512 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if err := sb.Start(ctx); err != nil {
			_ = sb.Remove(ctx)
			t.Fatalf("start %s: %v", id, err)
		}
		return sb
	}
	sb := start("gvnet", backend.NetworkEgress)
	addr := sb.(backend.Networked).NetAddr()
	if !addr.IsValid() || !cfg.Pool.Contains(addr) {
		t.Fatalf("NetAddr %v, want an address of %v", addr, cfg.Pool)
	}
	gw := addr.Prev() // the /30's .1
	r := conformance.Exec(t, sb, 20*time.Second, "/bin/cat", "/etc/resolv.conf")
	if r.Stdout != "nameserver "+gw.String()+"\n" {
		t.Errorf("resolv.conf %q, want the gateway %s only", r.Stdout, gw)
	}
	r = conformance.Exec(t, sb, 20*time.Second, "/usr/bin/python3", "-c",
		"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.connect(('"+gw.String()+"', 53))\nprint(s.getsockname()[0])")
	if got := strings.TrimSpace(r.Stdout); got != addr.String() {
		t.Errorf("the sandbox's source address %q (%s), NetAddr %s", got, r.Stderr, addr)
	}
	// With the gate open (the registry's to do in a server), a TCP
	// connection to anywhere lands on the proxy's port, from the
	// sandbox's address.
	reaches := func(what string, sb backend.Sandbox, addr netip.Addr) {
		t.Helper()
		if err := h.Gate().Bypass(addr, true); err != nil {
			t.Fatal(err)
		}
		r := conformance.Exec(t, sb, 20*time.Second, "/usr/bin/python3", "-c",
			"import socket\nc = socket.create_connection(('192.0.2.1', 80), timeout=10)\nc.sendall(b'gvisor')\nc.close()")
		if r.ExitStatus.Code != 0 {
			t.Errorf("%s: connect from the sandbox: %d %s", what, r.ExitStatus.Code, r.Stderr)
			return
		}
		_ = svc.Proxy.SetDeadline(time.Now().Add(10 * time.Second))
		c, err := svc.Proxy.AcceptTCP()
		if err != nil {
			t.Fatalf("%s: proxy port: %v", what, err)
		}
		from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		_ = c.Close()
		if from != addr {
			t.Errorf("%s: the proxy port's connection came from %v, want %v", what, from, addr)
		}
	}
	reaches("started", sb, addr)
	// A checkpoint leaves the source on its link; its restore gets a
	// link of its own, whose address runsc restore gives the sentry.
	if err := sb.(backend.Checkpointer).Checkpoint(ctx, filepath.Join(base, "snap")); err != nil {
		t.Fatalf("checkpoint of a networked sandbox: %v", err)
	}
	reaches("checkpointed", sb, addr)
	rs, err := be.Restore(ctx, backend.Config{ID: "gvnet-r", Image: img, Network: backend.NetworkEgress, MemoryBytes: 512 << 20}, filepath.Join(base, "snap"))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	raddr := rs.(backend.Networked).NetAddr()
	if !cfg.Pool.Contains(raddr) || raddr == addr {
		t.Errorf("the restored sandbox's NetAddr %v (the source's %v)", raddr, addr)
	}
	reaches("restored", rs, raddr)
	r = conformance.Exec(t, rs, 20*time.Second, "/bin/cat", "/etc/resolv.conf")
	if r.Stdout != "nameserver "+raddr.Prev().String()+"\n" {
		t.Errorf("the restored sandbox's resolv.conf %q, want its gateway %s", r.Stdout, raddr.Prev())
	}
	if err := rs.Remove(ctx); err != nil {
		t.Fatal(err)
	}

	lo := start("gvnet-lo", backend.NetworkNone)
	r = conformance.Exec(t, lo, 20*time.Second, "/bin/cat", "/proc/net/dev")
	if strings.Contains(r.Stdout, "eth0") {
		t.Errorf("a loopback-only sandbox has eth0:\n%s", r.Stdout)
	}
	if a := lo.(backend.Networked).NetAddr(); a.IsValid() {
		t.Errorf("a loopback-only sandbox's NetAddr %v", a)
	}

	// A stop frees the link; the next start attaches one again.
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if a := sb.(backend.Networked).NetAddr(); a.IsValid() {
		t.Errorf("a stopped sandbox's NetAddr %v", a)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if a := sb.(backend.Networked).NetAddr(); !cfg.Pool.Contains(a) {
		t.Errorf("NetAddr after a restart %v", a)
	}
	for _, s := range []backend.Sandbox{sb, lo} {
		if err := s.Remove(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// What a crash leaves (a pinned namespace with its link, no runsc):
	// the reaper detaches and unpins it.
	crashed := "gvnet-crashed"
	pinNetns(t, filepath.Join(run, ".netns", crashed))
	ns, err := os.Open(filepath.Join(run, ".netns", crashed))
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Attach(crashed, ns)
	_ = ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := be.ReapOrphans(nil); err != nil || !slices.Contains(removed, crashed) {
		t.Errorf("reap: %v %v, want %s removed", removed, err, crashed)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	for name, alias := range testenv.LinksOf(t, h.VethPrefix()) {
		t.Errorf("link %s (%q) left after the removal", name, alias)
	}
	if els := testenv.SpoofElements(t, prefix); len(els) != 0 {
		t.Errorf("table elements left after the removal: %v", els)
	}
	if ents, err := os.ReadDir(filepath.Join(run, ".netns")); err != nil || len(ents) != 0 {
		t.Errorf("pinned namespaces left: %v %v", ents, err)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), filepath.Join(run, ".netns")) {
		t.Errorf("a namespace's pin is still mounted (%v)", err)
	}

	// Without the host's plumbing: refused, by name.
	plain := newBackend(t)
	_, err = plain.Create(ctx, backend.Config{ID: fmt.Sprintf("gvnet-none-%d", os.Getpid()), Image: img, Network: backend.NetworkEgress})
	if !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "network") {
		t.Errorf("egress without plumbing: %v, want unsupported", err)
	}
}

// pinNetns makes a network namespace pinned at p by a bind mount, as the
// backend does, from a thread that ends with it.
func pinNetns(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread left the host's namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount("/proc/thread-self/ns/net", p, "", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		t.Fatalf("pin a namespace: %v", err)
	}
}

// netBackend is a backend on plumbing of its own (a random prefix and
// address range), removed with the test.
type netBackend struct {
	svc    *testenv.NetServices
	cfg    netplumb.Config
	h      *netplumb.Host
	be     *gvisor.Backend
	img    *image.Image
	prefix string
	base   string
}

func newNetBackend(t testing.TB) *netBackend {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireFile(t, "/usr/bin/python3")
	n := &netBackend{svc: testenv.NewNetServices(t)}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n.prefix = "warren-gvnet-" + hex.EncodeToString(b)
	n.cfg = n.svc.Config(n.prefix)
	var err error
	if n.h, err = netplumb.Open(n.cfg); err != nil {
		t.Fatalf("netplumb: %v", err)
	}
	t.Cleanup(func() {
		if err := n.h.Remove(); err != nil {
			t.Errorf("netplumb remove: %v", err)
		}
	})
	n.base = testenv.SearchableDir(t, "warren-gvnet-test-")
	n.be, err = gvisor.New(gvisor.Options{
		DataDir: filepath.Join(n.base, "data"), RunDir: filepath.Join(n.base, "run"),
		RunscPath: testenv.RunscBinary(t), AgentPath: testenv.AgentBinary(t),
		CgroupPrefix: n.prefix, Python: "/usr/bin/python3", Net: n.h,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = n.be.ReapOrphans(nil)
		if err := n.be.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if n.img, err = n.be.HostImage(); err != nil {
		t.Fatal(err)
	}
	return n
}

// BenchmarkCycleNetwork: what a link adds to a cycle (create, start,
// exec /bin/true, remove), one cycle of each kind per iteration so that
// a loaded host's drift hits both: ms/none, ms/egress and their ratio.
func BenchmarkCycleNetwork(b *testing.B) {
	n := newNetBackend(b)
	var took [2]time.Duration
	for i := range b.N {
		for k, network := range []string{backend.NetworkNone, backend.NetworkEgress} {
			t0 := time.Now()
			cycle(b, n.be, backend.Config{ID: fmt.Sprintf("bench-net-%d-%d", i, k), Image: n.img, Network: network})
			took[k] += time.Since(t0)
		}
	}
	b.ReportMetric(float64(took[0].Milliseconds())/float64(b.N), "ms/none")
	b.ReportMetric(float64(took[1].Milliseconds())/float64(b.N), "ms/egress")
	b.ReportMetric(float64(took[1])/float64(took[0]), "egress/none")
}
