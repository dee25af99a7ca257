package netplumb_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// fast is how long a denial may take inside the sandbox: a rejection is
// immediate; a timeout would show as this elapsing.
const fast = 2 * time.Second

// TestTraffic sends real traffic from a sandbox's namespace and checks where
// the kernel delivers it.
func TestTraffic(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	refusals := make(chan [2]string, 256)
	cfg := svc.config("")
	cfg.Refused = func(src netip.Addr, dst netip.AddrPort) {
		select {
		case refusals <- [2]string{src.String(), dst.String()}:
		default:
		}
	}
	h := openHost(t, cfg)
	a, b := newNetns(t), newNetns(t)
	la, err := h.Attach("a", a.f)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := h.Attach("b", b.f)
	if err != nil {
		t.Fatal(err)
	}

	// dial connects from a's namespace.
	dial := func(network, local, remote string) (net.Conn, error) {
		var c net.Conn
		var err error
		a.do(func() {
			d := net.Dialer{Timeout: fast}
			if local != "" {
				// Only the spoofing case binds, and it expects silence.
				d.Timeout = 300 * time.Millisecond
			}
			if local != "" {
				d.LocalAddr, _ = net.ResolveTCPAddr("tcp4", local)
			}
			c, err = d.Dial(network, remote)
		})
		return c, err
	}
	// accept takes the next connection on l, or fails after wait.
	accept := func(l *net.TCPListener, wait time.Duration) (*net.TCPConn, error) {
		_ = l.SetDeadline(time.Now().Add(wait))
		return l.AcceptTCP()
	}

	t.Run("tcp to an address the gate holds open reaches the proxy with its original destination", func(t *testing.T) {
		opened := []netip.Addr{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("169.254.169.254"), lb.Addr}
		if err := h.Gate().Open(la.Addr, opened, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = h.Gate().Close(la.Addr, opened) }()
		// The gateway is the host's own address: the gate leaves it to
		// the input chain, and the redirect makes it the proxy's.
		for _, dst := range []string{"203.0.113.7:8080", "198.51.100.1:443", "169.254.169.254:80", la.Gateway.String() + ":22", lb.Addr.String() + ":80"} {
			c, err := dial("tcp4", "", dst)
			if err != nil {
				t.Fatalf("dial %s: %v", dst, err)
			}
			s, err := accept(svc.proxy, fast)
			if err != nil {
				t.Fatalf("%s: proxy accepted nothing: %v", dst, err)
			}
			if got := originalDst(t, s); got.String() != dst {
				t.Errorf("original destination %v, want %v", got, dst)
			}
			if got := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != la.Addr {
				t.Errorf("source %v, want the sandbox's %v", got, la.Addr)
			}
			_, _ = s.Write([]byte("x"))
			buf := make([]byte, 1)
			if _, err := c.Read(buf); err != nil {
				t.Errorf("%s: reply: %v", dst, err)
			}
			_ = c.Close()
			_ = s.Close()
		}
	})

	t.Run("the gate refuses the rest at connect, and says so", func(t *testing.T) {
		refused := func(dst string) {
			t.Helper()
			t0 := time.Now()
			c, err := dial("tcp4", "", dst)
			if err == nil {
				_ = c.Close()
				t.Fatalf("%s: connected; want refused", dst)
			}
			if !errors.Is(err, unix.ECONNREFUSED) || time.Since(t0) > fast/2 {
				t.Fatalf("%s: %v after %v; want connection refused at once", dst, err, time.Since(t0))
			}
			select {
			case r := <-refusals:
				if r != [2]string{la.Addr.String(), dst} {
					t.Errorf("refusal reported as %v, want %s → %s", r, la.Addr, dst)
				}
			case <-time.After(fast):
				t.Errorf("%s: refusal not reported", dst)
			}
		}
		passes := func(dst string) {
			t.Helper()
			c, err := dial("tcp4", "", dst)
			if err != nil {
				t.Fatalf("%s: %v; want the proxy", dst, err)
			}
			_ = c.Close()
			s, err := accept(svc.proxy, fast)
			if err != nil {
				t.Fatalf("%s: proxy accepted nothing: %v", dst, err)
			}
			_ = s.Close()
		}
		g := h.Gate()
		dst := netip.MustParseAddr("203.0.113.99")
		refused("203.0.113.99:8080")
		refused(lb.Addr.String() + ":80") // another sandbox
		// Opened for a: a passes, b (another source) is still refused.
		if err := g.Open(la.Addr, []netip.Addr{dst}, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		passes("203.0.113.99:8080")
		// Opening again (a pin extended) keeps it open; closing refuses.
		if err := g.Open(la.Addr, []netip.Addr{dst}, time.Now().Add(2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		passes("203.0.113.99:443")
		if err := g.Close(la.Addr, []netip.Addr{dst}); err != nil {
			t.Fatal(err)
		}
		refused("203.0.113.99:8080")
		// Closing what is not there is no error.
		if err := g.Close(la.Addr, []netip.Addr{dst}); err != nil {
			t.Fatal(err)
		}
		// A deadline passes: refused again without a Close.
		if err := g.Open(la.Addr, []netip.Addr{dst}, time.Now().Add(1500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		passes("203.0.113.99:8080")
		time.Sleep(2 * time.Second)
		refused("203.0.113.99:8080")
		// Bypass: everything of a goes to the proxy, until it is off.
		if err := g.Bypass(la.Addr, true); err != nil {
			t.Fatal(err)
		}
		passes("192.0.2.77:9999")
		if err := g.Bypass(la.Addr, false); err != nil {
			t.Fatal(err)
		}
		refused("192.0.2.77:9999")
		if err := g.Bypass(la.Addr, false); err != nil {
			t.Fatalf("bypass off twice: %v", err)
		}
	})

	t.Run("dns to any address reaches the resolver", func(t *testing.T) {
		var reply []byte
		var cerr error
		go func() {
			buf := make([]byte, 512)
			_ = svc.resolverUDP.SetReadDeadline(time.Now().Add(fast))
			n, from, err := svc.resolverUDP.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if from.Addr() == la.Addr {
				_, _ = svc.resolverUDP.WriteToUDPAddrPort(append([]byte("re:"), buf[:n]...), from)
			}
		}()
		a.do(func() {
			c, err := net.Dial("udp4", "198.51.100.53:53")
			if err != nil {
				cerr = err
				return
			}
			defer func() { _ = c.Close() }()
			_, _ = c.Write([]byte("query"))
			_ = c.SetReadDeadline(time.Now().Add(fast))
			buf := make([]byte, 512)
			n, err := c.Read(buf)
			reply, cerr = buf[:n], err
		})
		if cerr != nil || string(reply) != "re:query" {
			t.Fatalf("udp dns: %q %v", reply, cerr)
		}
		// Straight to the resolver's port on the gateway: no rewrite.
		go func() {
			buf := make([]byte, 512)
			_ = svc.resolverUDP.SetReadDeadline(time.Now().Add(fast))
			n, from, err := svc.resolverUDP.ReadFromUDPAddrPort(buf)
			if err == nil {
				_, _ = svc.resolverUDP.WriteToUDPAddrPort(buf[:n], from)
			}
		}()
		a.do(func() {
			c, err := net.Dial("udp4", netip.AddrPortFrom(la.Gateway, uint16(svc.resolverUDP.LocalAddr().(*net.UDPAddr).Port)).String())
			if err != nil {
				cerr = err
				return
			}
			defer func() { _ = c.Close() }()
			_, _ = c.Write([]byte("direct"))
			_ = c.SetReadDeadline(time.Now().Add(fast))
			buf := make([]byte, 512)
			n, err := c.Read(buf)
			reply, cerr = buf[:n], err
		})
		if cerr != nil || string(reply) != "direct" {
			t.Fatalf("udp dns straight to the resolver's port: %q %v", reply, cerr)
		}
		c, err := dial("tcp4", "", "192.0.2.1:53")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		s, err := accept(svc.resolverTCP, fast)
		if err != nil {
			t.Fatalf("tcp dns: resolver accepted nothing: %v", err)
		}
		defer func() { _ = s.Close() }()
		if got := originalDst(t, s); got.String() != "192.0.2.1:53" {
			t.Errorf("original destination %v", got)
		}
	})

	t.Run("udp elsewhere is refused at once", func(t *testing.T) {
		for _, dst := range []string{"198.51.100.1:9999", lb.Addr.String() + ":5000", la.Gateway.String() + ":5353", "8.8.8.8:123"} {
			var err error
			start := time.Now()
			a.do(func() {
				var c net.Conn
				c, err = net.Dial("udp4", dst)
				if err != nil {
					return
				}
				defer func() { _ = c.Close() }()
				_, _ = c.Write([]byte("x"))
				_ = c.SetReadDeadline(time.Now().Add(fast))
				_, err = c.Read(make([]byte, 8))
			})
			if !isRefusal(err) || time.Since(start) >= fast {
				t.Errorf("udp %s: %v after %v, want a refusal at once", dst, err, time.Since(start))
			}
		}
	})

	t.Run("icmp is rejected admin-prohibited", func(t *testing.T) {
		// A namespace of its own: the kernel allows a burst of 6 ICMP
		// errors per destination, then one a second (net.ipv4.icmp_ratelimit),
		// and the UDP case above spent a's (docs/network.md).
		c := newNetns(t)
		lc, err := h.Attach("c", c.f)
		if err != nil {
			t.Fatal(err)
		}
		for _, dst := range []string{"198.51.100.1", lc.Gateway.String(), lb.Addr.String()} {
			var got *icmp.Message
			var err error
			c.do(func() {
				var c *icmp.PacketConn
				c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
				if err != nil {
					return
				}
				defer func() { _ = c.Close() }()
				m := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: 7, Seq: 1, Data: []byte("ping")}}
				wb, _ := m.Marshal(nil)
				if _, err = c.WriteTo(wb, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
					return
				}
				_ = c.SetReadDeadline(time.Now().Add(fast))
				buf := make([]byte, 1500)
				n, _, rerr := c.ReadFrom(buf)
				if rerr != nil {
					err = rerr
					return
				}
				got, err = icmp.ParseMessage(1, buf[:n])
			})
			if err != nil {
				t.Errorf("ping %s: %v", dst, err)
				continue
			}
			if got.Type != ipv4.ICMPTypeDestinationUnreachable || got.Code != 13 {
				t.Errorf("ping %s: got %v code %d, want destination unreachable, administratively prohibited (13)", dst, got.Type, got.Code)
			}
		}
	})

	t.Run("a spoofed source is dropped", func(t *testing.T) {
		// The sandbox gives itself b's address and a foreign one, and sends
		// from each: nothing arrives, nothing answers.
		a.do(func() {
			eth0, _ := netlink.LinkByName("eth0")
			for _, p := range []string{lb.Addr.String() + "/32", "192.0.2.9/32"} {
				ad, _ := netlink.ParseAddr(p)
				if err := netlink.AddrAdd(eth0, ad); err != nil {
					t.Errorf("add %s: %v", p, err)
				}
			}
		})
		for _, src := range []string{lb.Addr.String(), "192.0.2.9"} {
			c, err := dial("tcp4", src+":0", "203.0.113.7:80")
			if err == nil {
				_ = c.Close()
				t.Errorf("from %s: connected", src)
			} else if !errors.Is(err, os.ErrDeadlineExceeded) && !isTimeout(err) {
				t.Errorf("from %s: %v, want silence (a timeout)", src, err)
			}
			if s, err := accept(svc.proxy, 100*time.Millisecond); err == nil {
				_ = s.Close()
				t.Errorf("from %s: the proxy got %v", src, s.RemoteAddr())
			}
		}
	})

	t.Run("the host's loopback services are not reachable", func(t *testing.T) {
		l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		port := l.Addr().(*net.TCPAddr).Port
		// 127.0.0.1 is the sandbox's own loopback; the gateway's address
		// leads to the proxy; neither reaches the host's listener.
		if c, err := dial("tcp4", "", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)).String()); err == nil {
			_ = c.Close()
			t.Error("127.0.0.1 connected")
		}
		c, err := dial("tcp4", "", netip.AddrPortFrom(la.Gateway, uint16(port)).String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		if s, err := accept(l, 200*time.Millisecond); err == nil {
			_ = s.Close()
			t.Error("the host's loopback listener accepted a sandbox's connection")
		}
		if s, err := accept(svc.proxy, fast); err != nil {
			t.Errorf("the proxy did not get it: %v", err)
		} else {
			_ = s.Close()
		}
	})

	t.Run("no ipv6", func(t *testing.T) {
		for _, dst := range []string{"[2001:db8::1]:80", "[fe80::1%eth0]:80", "[::1]:80"} {
			start := time.Now()
			c, err := dial("tcp6", "", dst)
			if err == nil {
				_ = c.Close()
				t.Errorf("%s connected", dst)
			} else if time.Since(start) >= fast {
				t.Errorf("%s: %v after %v", dst, err, time.Since(start))
			}
		}
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, unix.ETIMEDOUT)
}
