package fakenet

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dialer reaches the fake internet by the zone's names, without the host's
// resolver.
func client(in *Internet, t *testing.T) *http.Client {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(in.CAPEM) {
		t.Fatal("CAPEM holds no certificate")
	}
	d := &net.Dialer{Timeout: 3 * time.Second}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if a := in.Addr(host); a.IsValid() {
				host = a.String()
			}
			return d.DialContext(ctx, network, net.JoinHostPort(host, port))
		},
	}}
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// TestServices: the host reaches every service of a fake internet.
func TestServices(t *testing.T) {
	in := Start(t)
	c := client(in, t)

	t.Run("http", func(t *testing.T) {
		if got, want := get(t, c, "http://allowed.test/some/path"), "host=allowed.test path=/some/path tls=false\n"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
		if got := get(t, c, "http://denied.test/x"); got != "host=denied.test path=/x tls=false\n" {
			t.Errorf("denied.test: %q", got)
		}
		if n := in.Requests("allowed.test"); n != 1 {
			t.Errorf("Requests(allowed.test) = %d, want 1", n)
		}
		if got := get(t, c, "http://allowed.test/bytes/100000"); len(got) != 100000 {
			t.Errorf("/bytes/100000: %d bytes", len(got))
		}
	})
	t.Run("https", func(t *testing.T) {
		for _, name := range []string{"allowed.test", "api.allowed.test", "a.wild.test", "b.c.wild.test", "shared-a.test", "shared-b.test"} {
			if got, want := get(t, c, "https://"+name+"/p"), "host="+name+" path=/p tls=true\n"; got != want {
				t.Errorf("%s: got %q, want %q", name, got, want)
			}
		}
		// A name the certificate lacks fails verification: the SANs are
		// real, not a blanket.
		if _, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", in.Addr("allowed.test").String()+":443",
			&tls.Config{ServerName: "elsewhere.example", RootCAs: c.Transport.(*http.Transport).TLSClientConfig.RootCAs, MinVersion: tls.VersionTLS12}); err == nil {
			t.Error("the certificate verified for elsewhere.example")
		}
		b, err := os.ReadFile(in.CAFile)
		if err != nil || string(b) != string(in.CAPEM) {
			t.Errorf("CAFile: %v, same as CAPEM: %v", err, string(b) == string(in.CAPEM))
		}
	})
	t.Run("echo", func(t *testing.T) {
		conn := dial(t, "tcp", in.Addr("allowed.test"), in.EchoPort)
		if _, err := io.WriteString(conn, "ping\n"); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Errorf("echo: %q %v", line, err)
		}
	})
	t.Run("banner", func(t *testing.T) {
		conn := dial(t, "tcp", in.Addr("other.test"), in.BannerPort)
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || line != Banner {
			t.Errorf("banner: %q %v", line, err)
		}
	})
	t.Run("udp", func(t *testing.T) {
		conn := dial(t, "udp", in.Addr("allowed.test"), in.UDPEchoPort)
		if _, err := conn.Write([]byte("datagram")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		if err != nil || string(buf[:n]) != "datagram" {
			t.Errorf("udp echo: %q %v", buf[:n], err)
		}
	})
	t.Run("ipv6", func(t *testing.T) {
		a := in.Addr6("v6.test")
		if !a.Is6() {
			t.Fatalf("Addr6(v6.test) = %v", a)
		}
		if got := get(t, c, "http://["+a.String()+"]/six"); !strings.Contains(got, "path=/six") {
			t.Errorf("http over IPv6: %q", got)
		}
	})
	for _, network := range []string{"udp", "tcp"} {
		t.Run("dns-"+network, func(t *testing.T) { testDNS(t, in, network) })
	}
	t.Run("index", func(t *testing.T) { testIndex(t, in, c) })
}

func dial(t *testing.T, network string, a netip.Addr, port uint16) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout(network, netip.AddrPortFrom(a, port).String(), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	return conn
}

func testDNS(t *testing.T, in *Internet, network string) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, in.DNS.String())
	}}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"allowed.test", "a.wild.test", "b.c.wild.test", "shared-a.test", "shared-b.test", "pypi.test",
		"rebind-loopback.test", "rebind-metadata.test", "rebind-private.test"} {
		as, err := r.LookupNetIP(ctx, "ip4", name)
		if err != nil || len(as) != 1 || as[0] != in.Addr(name) {
			t.Errorf("%s: %v %v, want %v", name, as, err, in.Addr(name))
		}
	}
	if in.Addr("shared-a.test") != in.Addr("shared-b.test") {
		t.Error("shared-a.test and shared-b.test differ")
	}
	want := map[string]string{"rebind-loopback.test": "127.0.0.1", "rebind-metadata.test": "169.254.169.254", "rebind-private.test": "10.9.9.9"}
	for n, a := range want {
		if in.Addr(n).String() != a {
			t.Errorf("%s = %v, want %s", n, in.Addr(n), a)
		}
	}
	if as, err := r.LookupNetIP(ctx, "ip6", "v6.test"); err != nil || len(as) != 1 || as[0] != in.Addr6("v6.test") {
		t.Errorf("v6.test AAAA: %v %v", as, err)
	}
	var dnsErr *net.DNSError
	if _, err := r.LookupNetIP(ctx, "ip4", "nowhere.test"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Errorf("nowhere.test: %v, want NXDOMAIN", err)
	}
	label := strings.Repeat("q", 60)
	txt, err := r.LookupTXT(ctx, label+".x."+TunnelSuffix)
	if err != nil || !slices.Equal(txt, []string{label}) {
		t.Errorf("tunnel TXT: %v %v", txt, err)
	}
	mx, err := r.LookupMX(ctx, "allowed.test")
	if err != nil || len(mx) != 1 || mx[0].Host != "mail.allowed.test." {
		t.Errorf("MX: %v %v", mx, err)
	}
	if !slices.Contains(in.Queries(), label+".x."+TunnelSuffix) {
		t.Error("Queries lacks the tunnel query")
	}
}

// testIndex: the index's pages link the wheel with its hash, and pip
// installs it.
func testIndex(t *testing.T, in *Internet, c *http.Client) {
	page := get(t, c, "http://pypi.test/simple/"+in.Package+"/")
	wheel := get(t, c, "http://pypi.test/files/"+in.Module+"-"+in.Version+"-py3-none-any.whl")
	sum := sha256.Sum256([]byte(wheel))
	if !strings.Contains(page, "#sha256="+hex.EncodeToString(sum[:])) {
		t.Fatalf("the project page does not link the wheel with its hash: %s", page)
	}
	// The host's own Python, which sandboxes of the host image run.
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s: %v", python, err)
	}
	target := t.TempDir()
	cmd := exec.Command(python, "-m", "pip", "install", "--isolated", "--no-cache-dir", "--disable-pip-version-check", "--target", target,
		"--index-url", "http://"+in.Addr("pypi.test").String()+"/simple/", "--trusted-host", in.Addr("pypi.test").String(), in.Package)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	out, err := exec.Command(python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import "+in.Module+"; print("+in.Module+".GREETING)", target).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != PackageGreeting {
		t.Errorf("import the installed module: %v %q", err, out)
	}
}

// TestCloseLeavesNothing: after Close no link, route, namespace, socket or
// goroutine remains, and a new fake internet starts at once (the lock is
// free) and fast.
func TestCloseLeavesNothing(t *testing.T) {
	// A first cycle, so that what the process makes once (the runtime's
	// own descriptors) is not counted.
	warm, err := start()
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Close(); err != nil {
		t.Fatal(err)
	}
	goroutines := runtime.NumGoroutine()
	fdsBefore := openFDs(t)
	in, err := start()
	if err != nil {
		t.Fatal(err)
	}
	// Not counting the wait for another test process's fake internet.
	took := in.setup
	t.Logf("start took %v once it held the lock", took)
	// The budget is 200 ms on an idle host; the bound leaves room for a
	// loaded one.
	if took > 2*time.Second {
		t.Errorf("start took %v", took)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(in.ns), &st); err != nil {
		t.Fatal(err)
	}
	nsLink := fmt.Sprintf("net:[%d]", st.Ino)
	// Use every service once, so that Close has connections to end.
	conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(in.Addr("allowed.test"), EchoPort).String(), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = get(t, client(in, t), "https://allowed.test/")
	caFile := in.CAFile

	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(HostLink); err == nil {
		t.Errorf("link %s is left", HostLink)
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		p, _ := netip.AddrFromSlice(r.Dst.IP)
		for _, want := range routed {
			if want.Contains(p.Unmap()) {
				t.Errorf("route %v is left", r)
			}
		}
	}
	for _, fd := range openFDs(t) {
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", fd)); l == nsLink {
			t.Errorf("fd %s still holds the namespace", fd)
		}
	}
	if _, err := os.Stat(caFile); !os.IsNotExist(err) {
		t.Errorf("CA file left: %v", err)
	}
	// The HTTP client's idle connections and the dial's goroutines end
	// on their own; wait a little for them.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutines+1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines+1 {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines, %d before:\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
	}
	_ = conn.Close()
	for _, fd := range openFDs(t) {
		l, _ := os.Readlink(filepath.Join("/proc/self/fd", fd))
		// What fakenet makes: sockets, the namespace, the lock file.
		// (Other descriptors come and go with the runtime and the test
		// framework.)
		mine := strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "net:") || l == lockPath
		if mine && !slices.Contains(fdsBefore, fd) {
			t.Errorf("descriptor %s (%s) is left", fd, l)
		}
	}
	// The lock is free again.
	in2, err := start()
	if err != nil {
		t.Fatal(err)
	}
	if err := in2.Close(); err != nil {
		t.Fatal(err)
	}
}

func openFDs(t *testing.T) []string {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range es {
		fds = append(fds, e.Name())
	}
	return fds
}
