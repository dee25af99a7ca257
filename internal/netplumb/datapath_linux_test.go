package netplumb_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// BenchmarkDataPath compares, from inside a sandbox's namespace to a server
// in another namespace (the "remote", reached through the host), the three
// data paths docs/network.md weighs:
//
//	route:  a plain veth and a route (ip_forward on for the benchmark only)
//	proxy:  netplumb's veth and table, REDIRECT to a minimal splice proxy
//	slirp:  a tap into slirp4netns, a user-space TCP/IP stack
//
// connect: dial + a one-byte round trip (a proxy answers the SYN itself, so
// the dial alone would flatter it), median in conn-ms; bulk: 64 MiB to the
// remote, which answers when it has read them all (MB/s).
//
//	go test -run XXX -bench DataPath -count 3 ./internal/netplumb
func BenchmarkDataPath(b *testing.B) {
	requireNet(b)
	testenv.RequireFile(b, "/usr/bin/slirp4netns")
	remote := newNetns(b)
	remoteAddr := setupRemote(b, remote)
	paths := []struct {
		name  string
		setup func(b *testing.B) *netns
	}{
		{"route", routePath},
		{"proxy", proxyPath},
		{"slirp", slirpPath},
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			sb := p.setup(b)
			b.Run("connect", func(b *testing.B) {
				var ds []time.Duration
				for b.Loop() {
					var d time.Duration
					var err error
					sb.do(func() { d, err = connectRTT(remoteAddr) })
					if err != nil {
						b.Fatal(err)
					}
					ds = append(ds, d)
				}
				b.ReportMetric(medianMS(ds), "conn-ms")
			})
			b.Run("bulk", func(b *testing.B) {
				const size = 64 << 20
				b.SetBytes(size)
				for b.Loop() {
					var err error
					sb.do(func() { err = bulk(remoteAddr, size) })
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// setupRemote links the remote namespace to the host (10.250.0.1 on the
// host, .2 in the remote) and serves there: one byte back for each byte
// read (connect), or one byte when the client has finished sending (bulk).
func setupRemote(b *testing.B, remote *netns) string {
	b.Helper()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "wbench-r"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(remote.f.Fd())}
	_ = netlink.LinkDel(veth)
	if err := netlink.LinkAdd(veth); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = netlink.LinkDel(veth) })
	ip(b, "addr", "add", "10.250.0.1/30", "dev", "wbench-r")
	ip(b, "link", "set", "wbench-r", "up")
	var l net.Listener
	var err error
	remote.do(func() {
		eth0, _ := netlink.LinkByName("eth0")
		a, _ := netlink.ParseAddr("10.250.0.2/30")
		_ = netlink.AddrAdd(eth0, a)
		_ = netlink.LinkSetUp(eth0)
		lo, _ := netlink.LinkByName("lo")
		_ = netlink.LinkSetUp(lo)
		_ = netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("10.250.0.1")})
		l, err = net.Listen("tcp4", "10.250.0.2:9000")
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				buf := make([]byte, 1)
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if buf[0] == 'p' { // ping: echo
					_, _ = c.Write(buf)
					return
				}
				_, _ = io.Copy(io.Discard, c)
				_, _ = c.Write(buf)
			}()
		}
	}()
	return "10.250.0.2:9000"
}

func connectRTT(addr string) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write([]byte("p")); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func bulk(addr string, size int) error {
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	buf := make([]byte, 256<<10)
	buf[0] = 'b'
	for sent := 0; sent < size; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	_, err = io.ReadFull(c, make([]byte, 1))
	return err
}

// routePath: a veth with a route, forwarded by the host.
func routePath(b *testing.B) *netns {
	sb := newNetns(b)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "wbench-a"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(sb.f.Fd())}
	_ = netlink.LinkDel(veth)
	if err := netlink.LinkAdd(veth); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = netlink.LinkDel(veth) })
	ip(b, "addr", "add", "10.251.0.1/30", "dev", "wbench-a")
	ip(b, "link", "set", "wbench-a", "up")
	sb.do(func() {
		eth0, _ := netlink.LinkByName("eth0")
		a, _ := netlink.ParseAddr("10.251.0.2/30")
		_ = netlink.AddrAdd(eth0, a)
		_ = netlink.LinkSetUp(eth0)
		_ = netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("10.251.0.1")})
	})
	const fwd = "/proc/sys/net/ipv4/ip_forward"
	old, err := os.ReadFile(fwd)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(fwd, []byte("1"), 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.WriteFile(fwd, old, 0) })
	return sb
}

// proxyPath: netplumb's link and table, and a splice proxy standing in for
// the real one: accept, SO_ORIGINAL_DST, dial, copy both ways (io.Copy
// between TCP connections is splice(2)).
func proxyPath(b *testing.B) *netns {
	svc := newServices(b)
	h := openHost(b, svc.config(""))
	sb := newNetns(b)
	l, err := h.Attach("bench", sb.f)
	if err != nil {
		b.Fatal(err)
	}
	openAll(b, h, l)
	go func() {
		for {
			c, err := svc.proxy.AcceptTCP()
			if err != nil {
				return
			}
			go splice(b, c)
		}
	}()
	return sb
}

func splice(b *testing.B, c *net.TCPConn) {
	defer func() { _ = c.Close() }()
	dst := originalDst(b, c)
	u, err := net.DialTimeout("tcp4", dst.String(), 5*time.Second)
	if err != nil {
		return
	}
	defer func() { _ = u.Close() }()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(u, c)
		_ = u.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(c, u)
	<-done
}

// slirpPath: slirp4netns on a tap in the namespace, as rootless container
// engines use it (MTU 65520, their default).
func slirpPath(b *testing.B) *netns {
	sb := newNetns(b)
	var tid int
	sb.do(func() { tid = unix.Gettid() })
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
		"--ready-fd=3", "--netns-type=path", fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), tid), "tap0")
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	_ = w.Close()
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	_ = r.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.Read(make([]byte, 1)); err != nil {
		b.Fatalf("slirp4netns not ready: %v", err)
	}
	_ = r.Close()
	return sb
}

func ip(b *testing.B, args ...string) {
	b.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		b.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
