package netplumb_test

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/netplumb"
)

// TestSweepAndRestore: a restarted server (a second Open of the same prefix)
// restores the sandbox it keeps and sweeps the others' leftovers.
func TestSweepAndRestore(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	cfg := svc.config(testPrefix())
	h := openHost(t, cfg)
	links := map[string]netplumb.Link{}
	for _, id := range []string{"keep", "gone-1", "gone-2"} {
		l, err := h.Attach(id, newNetns(t).f)
		if err != nil {
			t.Fatal(err)
		}
		links[id] = l
	}
	h2, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if els := elements(t, cfg.Prefix); len(els) != 0 {
		t.Fatalf("Open kept elements %v", els)
	}
	if err := h2.Restore("keep", links["keep"]); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := h2.Restore("gone-1", links["keep"]); err == nil {
		t.Error("Restore of another sandbox's link succeeded")
	}
	removed, err := h2.Sweep(func(id string) bool { return id == "keep" })
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	slices.Sort(removed)
	if !slices.Equal(removed, []string{"gone-1", "gone-2"}) {
		t.Errorf("removed %v", removed)
	}
	if v := vethsOf(t, h2.VethPrefix()); !slices.Equal(v, []string{links["keep"].HostIf}) {
		t.Errorf("veths %v", v)
	}
	if els := elements(t, cfg.Prefix); !slices.Equal(els, []string{links["keep"].HostIf + " " + links["keep"].Addr.String()}) {
		t.Errorf("elements %v", els)
	}
	// A new sandbox does not get the restored one's address.
	l, err := h2.Attach("new", newNetns(t).f)
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr == links["keep"].Addr {
		t.Errorf("address %v handed out twice", l.Addr)
	}
	// Detach of a sandbox the Host was not told about (no Restore) finds it
	// by name.
	h3, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h3.Detach("new"); err != nil {
		t.Fatal(err)
	}
	if err := h3.Wait(); err != nil {
		t.Fatal(err)
	}
	if v := vethsOf(t, h2.VethPrefix()); !slices.Equal(v, []string{links["keep"].HostIf}) {
		t.Errorf("veths after Detach by name %v", v)
	}
	_ = h3.Close()
	_ = h2.Close()
}

// TestTwoHosts: two prefixes coexist; removing one leaves the other working.
func TestTwoHosts(t *testing.T) {
	requireNet(t)
	svc1, svc2 := newServices(t), newServices(t)
	cfg1 := svc1.config("")
	h1 := openHost(t, cfg1)
	cfg2 := svc2.config("")
	pool2 := cfg2.Pool
	cfg2.Pool = cfg1.Pool
	cfg2.Prefix = testPrefix()
	n1, n2 := newNetns(t), newNetns(t)
	l1, err := h1.Attach("x", n1.f)
	if err != nil {
		t.Fatal(err)
	}
	openAll(t, h1, l1)
	if _, err := netplumb.Open(cfg2); err == nil {
		t.Fatal("a second server on the same pool was let in")
	}
	cfg2.Pool = pool2
	h2, err := netplumb.Open(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h2.Remove() }()
	// Same id, other server: its own name and address space.
	l2, err := h2.Attach("x", n2.f)
	if err != nil {
		t.Fatal(err)
	}
	openAll(t, h2, l2)
	check := func(n *netns, svc *services) {
		t.Helper()
		n.do(func() {
			c, err := dialTCP("203.0.113.1:80")
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			_ = c.Close()
		})
		s, err := acceptWithin(svc.proxy, fast)
		if err != nil {
			t.Errorf("proxy: %v", err)
			return
		}
		_ = s.Close()
	}
	check(n1, svc1)
	check(n2, svc2)
	if err := h2.Remove(); err != nil {
		t.Fatal(err)
	}
	check(n1, svc1)
}

// TestManyDetachClean: 50 sandboxes attached, then detached, leave a clean
// table and no veth.
func TestManyDetachClean(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	h := openHost(t, svc.config(""))
	const n = 50
	for i := range n {
		if _, err := h.Attach(fmt.Sprint("sb-", i), newNetns(t).f); err != nil {
			t.Fatal(err)
		}
	}
	if els := elements(t, h.Prefix()); len(els) != n {
		t.Fatalf("%d elements, want %d", len(els), n)
	}
	if v := vethsOf(t, h.VethPrefix()); len(v) != n {
		t.Fatalf("%d veths, want %d", len(v), n)
	}
	for i := range n {
		if err := h.Detach(fmt.Sprint("sb-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	if els := elements(t, h.Prefix()); len(els) != 0 {
		t.Errorf("elements left: %v", els)
	}
	if v := vethsOf(t, h.VethPrefix()); len(v) != 0 {
		t.Errorf("veths left: %v", v)
	}
}

// BenchmarkAttachDetach is a sandbox's cost of having a network (the
// namespace itself is made by the clone that starts the agent either way):
// attach-ms and detach-ms are the medians of what a create and a destroy
// wait for; ns/op includes the veth deletions behind Detach (Wait).
// "overlapped" lets them run under the next Attach, as a busy server does;
// "alone" waits for each first.
func BenchmarkAttachDetach(b *testing.B) {
	requireNet(b)
	svc := newServices(b)
	h := openHost(b, svc.config(""))
	i := 0
	for _, alone := range []bool{false, true} {
		b.Run(map[bool]string{false: "overlapped", true: "alone"}[alone], func(b *testing.B) {
			var att, det []time.Duration
			for b.Loop() {
				b.StopTimer()
				ns := newNetns(b)
				b.StartTimer()
				id := fmt.Sprint("bench-", i)
				i++
				t0 := time.Now()
				if _, err := h.Attach(id, ns.f); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := h.Detach(id); err != nil {
					b.Fatal(err)
				}
				att, det = append(att, t1.Sub(t0)), append(det, time.Since(t1))
				if alone {
					if err := h.Wait(); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := h.Wait(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(medianMS(att), "attach-ms")
			b.ReportMetric(medianMS(det), "detach-ms")
		})
	}
}

func medianMS(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// TestProbe: on this kernel (root, nftables built in) everything is usable.
func TestProbe(t *testing.T) {
	requireNet(t)
	for _, f := range netplumb.Probe() {
		if f.Err != nil {
			t.Errorf("%s: %v", f.Name, f.Err)
		}
	}
}

// TestRename: a link attached ahead of time (a warm pool's) is handed to a
// sandbox, which a restarted server then keeps or sweeps by its new id.
func TestRename(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	cfg := svc.config(testPrefix())
	h := openHost(t, cfg)
	l, err := h.Attach("pool-1", newNetns(t).f)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Rename("pool-1", "sb-1"); err != nil {
		t.Fatal(err)
	}
	if err := h.Rename("pool-1", "sb-2"); err == nil {
		t.Error("renamed a link twice")
	}
	if _, err := h.Attach("pool-2", newNetns(t).f); err != nil {
		t.Fatal(err)
	}
	if err := h.Rename("pool-2", "sb-1"); err == nil {
		t.Error("two links renamed to one id")
	}
	h2, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h2.Restore("sb-1", l); err != nil {
		t.Fatalf("Restore under the new id: %v", err)
	}
	removed, err := h2.Sweep(func(id string) bool { return id == "sb-1" })
	if err != nil || !slices.Equal(removed, []string{"pool-2"}) {
		t.Fatalf("Sweep removed %v, %v", removed, err)
	}
	if err := h2.Detach("sb-1"); err != nil {
		t.Fatal(err)
	}
	if err := h2.Wait(); err != nil {
		t.Fatal(err)
	}
	if v := vethsOf(t, h2.VethPrefix()); len(v) != 0 {
		t.Errorf("veths left: %v", v)
	}
	if els := elements(t, cfg.Prefix); len(els) != 0 {
		t.Errorf("elements left: %v", els)
	}
	_ = h2.Close()
}

// BenchmarkRename is what a pooled start pays for its link.
func BenchmarkRename(b *testing.B) {
	requireNet(b)
	svc := newServices(b)
	h := openHost(b, svc.config(""))
	if _, err := h.Attach("a", newNetns(b).f); err != nil {
		b.Fatal(err)
	}
	from, to := "a", "b"
	for b.Loop() {
		if err := h.Rename(from, to); err != nil {
			b.Fatal(err)
		}
		from, to = to, from
	}
}

// TestConnLimit: a sandbox's flows beyond MaxConns are refused at once,
// and a closed one frees its place.
func TestConnLimit(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	cfg := svc.config("")
	cfg.MaxConns = 8
	h := openHost(t, cfg)
	ns := newNetns(t)
	l, err := h.Attach("x", ns.f)
	if err != nil {
		t.Fatal(err)
	}
	openAll(t, h, l)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	dial := func() (net.Conn, error) {
		var c net.Conn
		var err error
		ns.do(func() { c, err = dialTCP("203.0.113.9:443") })
		return c, err
	}
	for i := range cfg.MaxConns {
		c, err := dial()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		s, err := acceptWithin(svc.proxy, fast)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c, s)
	}
	start := time.Now()
	if c, err := dial(); err == nil {
		_ = c.Close()
		t.Fatal("a connection beyond MaxConns was let through")
	} else if !isRefusal(err) || time.Since(start) >= fast {
		t.Fatalf("beyond MaxConns: %v after %v, want a refusal at once", err, time.Since(start))
	}
	_ = held[0].Close()
	_ = held[1].Close()
	deadline := time.Now().Add(fast)
	for {
		c, err := dial()
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection did not free its place: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range held {
		_ = c.Close()
	}
	held = nil
	if err := h.Detach("x"); err != nil {
		t.Fatal(err)
	}
	if len(setElements(t, h.Prefix(), "conns")) != 1 {
		t.Fatal("no counting element while detaching")
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	if els := setElements(t, h.Prefix(), "conns"); len(els) != 0 {
		t.Fatalf("counting elements left: %q", els)
	}
}

// TestConcurrent: Attaches and Detaches of different sandboxes at once (a
// server creates and destroys in parallel) get distinct links and leave
// nothing.
func TestConcurrent(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	h := openHost(t, svc.config(""))
	const workers, each = 4, 5
	nss := make([]*netns, workers*each)
	for i := range nss {
		nss[i] = newNetns(t)
	}
	links := make([]netplumb.Link, len(nss))
	errs := make(chan error, len(nss))
	for w := range workers {
		go func() {
			for j := range each {
				i := w*each + j
				l, err := h.Attach(fmt.Sprint("c-", i), nss[i].f)
				links[i] = l
				errs <- err
			}
		}()
	}
	for range nss {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for _, l := range links {
		if seen[l.HostIf] || seen[l.Addr.String()] {
			t.Fatalf("link %+v handed out twice", l)
		}
		seen[l.HostIf], seen[l.Addr.String()] = true, true
	}
	if els := elements(t, h.Prefix()); len(els) != len(nss) {
		t.Fatalf("%d elements, want %d", len(els), len(nss))
	}
	for w := range workers {
		go func() {
			for j := range each {
				errs <- h.Detach(fmt.Sprint("c-", w*each+j))
			}
		}()
	}
	for range nss {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	if els := elements(t, h.Prefix()); len(els) != 0 {
		t.Errorf("elements left: %v", els)
	}
	if v := vethsOf(t, h.VethPrefix()); len(v) != 0 {
		t.Errorf("veths left: %v", v)
	}
}

// TestReopenPorts: Open again with other ports (a restarted server) steers
// the restored sandbox's traffic to the new ones.
func TestReopenPorts(t *testing.T) {
	requireNet(t)
	svc1, svc2 := newServices(t), newServices(t)
	cfg := svc1.config(testPrefix())
	h := openHost(t, cfg)
	ns := newNetns(t)
	l, err := h.Attach("r", ns.f)
	if err != nil {
		t.Fatal(err)
	}
	cfg2 := svc2.config("")
	cfg.ResolverPort, cfg.ProxyPort = cfg2.ResolverPort, cfg2.ProxyPort
	h2, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h2.Close() }()
	if err := h2.Restore("r", l); err != nil {
		t.Fatal(err)
	}
	openAll(t, h2, l) // a new table: the server re-registers its sandboxes
	ns.do(func() {
		c, err := dialTCP("203.0.113.5:80")
		if err != nil {
			t.Errorf("dial: %v", err)
			return
		}
		_ = c.Close()
	})
	s, err := acceptWithin(svc2.proxy, fast)
	if err != nil {
		t.Fatalf("the new proxy port got nothing: %v", err)
	}
	_ = s.Close()
	if s, err := acceptWithin(svc1.proxy, 100*time.Millisecond); err == nil {
		_ = s.Close()
		t.Error("the old proxy port still gets connections")
	}
}

// TestLeftTableSparesThePortsNextOwner: a table outlives its listeners (a
// server stopped while its sandboxes run, or killed); the ephemeral ports
// they had go to whoever binds next, whose connections from the host must
// not be dropped by a table that is not about them.
func TestLeftTableSparesThePortsNextOwner(t *testing.T) {
	requireNet(t)
	s := newServices(t)
	cfg := s.config("")
	openHost(t, cfg)
	_ = s.proxy.Close()
	_ = s.resolverTCP.Close()
	for _, port := range []uint16{cfg.ProxyPort, cfg.ResolverPort} {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			t.Fatalf("bind %s again: %v", addr, err)
		}
		c, err := dialTCP(addr)
		if err != nil {
			t.Errorf("a plain listener on %s, the port of a closed listener of the table: %v", addr, err)
		} else {
			_ = c.Close()
		}
		_ = l.Close()
	}
}

// TestPortsOnlyFromSandboxes: the resolver and the proxy listen on every
// address; from anywhere but a sandbox's link (here: the host's own
// loopback) their ports take nothing, while a sandbox still reaches them.
func TestPortsOnlyFromSandboxes(t *testing.T) {
	requireNet(t)
	s := newServices(t)
	cfg := s.config("")
	h := openHost(t, cfg)
	if _, err := dialTCP(fmt.Sprintf("127.0.0.1:%d", cfg.ProxyPort)); err == nil {
		t.Error("the proxy's port took a connection from the host's loopback")
	}
	if c, err := acceptWithin(s.proxy, 50*time.Millisecond); err == nil {
		_ = c.Close()
		t.Error("the proxy's listener accepted a connection that came from the host")
	}
	u, err := net.Dial("udp4", fmt.Sprintf("127.0.0.1:%d", cfg.ResolverPort))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = u.Close() }()
	_, _ = u.Write([]byte("query"))
	_ = s.resolverUDP.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := s.resolverUDP.ReadFrom(make([]byte, 64)); err == nil {
		t.Errorf("the resolver's port took %d bytes from the host's loopback", n)
	}
	// A sandbox's connection to any address still reaches the proxy.
	ns := newNetns(t)
	l, err := h.Attach("portcheck", ns.f)
	if err != nil {
		t.Fatal(err)
	}
	openAll(t, h, l)
	var derr error
	ns.do(func() {
		var c net.Conn
		if c, derr = dialTCP("203.0.113.9:80"); derr == nil {
			_ = c.Close()
		}
	})
	if derr != nil {
		t.Fatalf("a sandbox's connection: %v", derr)
	}
	c, err := acceptWithin(s.proxy, 2*time.Second)
	if err != nil {
		t.Fatalf("the proxy got nothing from the sandbox: %v", err)
	}
	_ = c.Close()
}
