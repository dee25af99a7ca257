package tproxy

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/secrets"
)

// The tests run the proxy on loopback with real sockets. What the kernel
// would do for a sandbox is stood in for: a sandbox is a source address
// in 127.0.0.0/8 (the test binds its clients to it), the redirected
// connection's original destination comes from a table the test fills
// as it connects, and "remote hosts" (documentation addresses) are dialled
// as loopback servers. The policy is a fake: allowed addresses and names.

var (
	sandboxA = netip.MustParseAddr("127.0.0.2")
	sandboxB = netip.MustParseAddr("127.0.0.3")
	stranger = netip.MustParseAddr("127.0.0.9")
)

// fakeSandbox allows an address when it is in addrs and, when the
// connection carries a name, the name when it is in names.
type fakeSandbox struct {
	addrs map[netip.Addr]bool
	names map[string]bool

	sec *secrets.Proxy // its proxy-mode secrets (secrets_test.go)

	mu      sync.Mutex
	decided []string // "kind:name" per Decide with a kind
	records chan egress.Record
}

func newSandbox(addrs []string, names ...string) *fakeSandbox {
	s := &fakeSandbox{addrs: map[netip.Addr]bool{}, names: map[string]bool{}, records: make(chan egress.Record, 1000)}
	for _, a := range addrs {
		s.addrs[netip.MustParseAddr(a)] = true
	}
	for _, n := range names {
		s.names[n] = true
	}
	return s
}

func (s *fakeSandbox) Decide(dst netip.AddrPort, name, kind string) egress.Verdict {
	if kind != "" {
		s.mu.Lock()
		s.decided = append(s.decided, kind+":"+name)
		s.mu.Unlock()
	}
	if !s.addrs[dst.Addr()] {
		return egress.Verdict{Reason: "not pinned"}
	}
	if kind == "" {
		return egress.Verdict{Allow: true, Rule: dst.Addr().String(), Reason: "address"}
	}
	if !s.names[name] {
		return egress.Verdict{Reason: fmt.Sprintf("%s name %q not allowed", kind, name)}
	}
	return egress.Verdict{Allow: true, Name: name, Rule: name, Reason: "name"}
}

func (s *fakeSandbox) Record(r egress.Record) { s.records <- r }

func (s *fakeSandbox) Secrets() *secrets.Proxy { return s.sec }

// record waits for the next record.
func (s *fakeSandbox) record(t *testing.T) egress.Record {
	t.Helper()
	select {
	case r := <-s.records:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no connection record")
		return egress.Record{}
	}
}

func (s *fakeSandbox) noRecord(t *testing.T) {
	t.Helper()
	select {
	case r := <-s.records:
		t.Fatalf("unexpected record %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
}

// harness is a running proxy with its stand-ins for the kernel.
type harness struct {
	t     *testing.T
	p     *Proxy
	addr  string // the proxy's listener
	sbs   map[netip.Addr]*fakeSandbox
	mu    sync.Mutex
	orig  map[string]netip.AddrPort // client address → original destination
	hosts map[netip.AddrPort]string // remote host → loopback server
	done  chan error
}

func newHarness(t *testing.T, cfg Config, sbs map[netip.Addr]*fakeSandbox) *harness {
	t.Helper()
	h := &harness{t: t, sbs: sbs, orig: map[string]netip.AddrPort{}, hosts: map[netip.AddrPort]string{}, done: make(chan error, 1)}
	cfg.Lookup = func(src netip.Addr) Sandbox {
		if s, ok := sbs[src]; ok {
			return s
		}
		return nil
	}
	cfg.OriginalDst = func(c *net.TCPConn) (netip.AddrPort, error) {
		// The client registers its connection right after connecting,
		// which may be just after the proxy accepted it.
		for range 5000 {
			h.mu.Lock()
			dst, ok := h.orig[c.RemoteAddr().String()]
			h.mu.Unlock()
			if ok {
				return dst, nil
			}
			time.Sleep(time.Millisecond)
		}
		return netip.AddrPort{}, errors.New("no original destination")
	}
	cfg.Dial = func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
		h.mu.Lock()
		real, ok := h.hosts[dst]
		h.mu.Unlock()
		if !ok {
			return nil, errors.New("connection refused")
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", real)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	h.p = New(cfg)
	go func() { h.done <- h.p.Serve(ln) }()
	t.Cleanup(func() {
		_ = h.p.Close()
		if err := <-h.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

// host makes dst (a remote address) reach the server on ln.
func (h *harness) host(dst string, ln net.Listener) {
	h.mu.Lock()
	h.hosts[netip.MustParseAddrPort(dst)] = ln.Addr().String()
	h.mu.Unlock()
}

// connect opens a connection from sandbox src as if to dst.
func (h *harness) connect(src netip.Addr, dst string) *net.TCPConn {
	h.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	c, err := d.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.orig[c.LocalAddr().String()] = netip.MustParseAddrPort(dst)
	h.mu.Unlock()
	h.t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// serve runs handle for each connection on a new loopback listener.
func serve(t testing.TB, handle func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { _ = c.Close() }()
				handle(c)
			}()
		}
	}()
	return ln
}

// echo copies back what it reads and half-closes at the end.
func echo(c net.Conn) {
	_, _ = io.Copy(c, c)
	_ = c.(*net.TCPConn).CloseWrite()
}

// refused: c was reset, at once (within a second), not left hanging.
func refused(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || err == nil || errors.Is(err, io.EOF) || isTimeout(err) {
		t.Fatalf("read on a refused connection: %d, %v; want a reset", n, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestEchoAllowed(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.7"})
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.7:7", serve(t, echo))

	c := h.connect(sandboxA, "203.0.113.7:7")
	payload := []byte(strings.Repeat("warren egress ", 100000)) // 1.4 MB
	go func() {
		_, _ = c.Write(payload)
		_ = c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != string(payload) {
		t.Fatalf("echo: %d bytes, %v; want %d bytes back", len(got), err, len(payload))
	}
	r := sb.record(t)
	if r.Kind != "tcp" || r.Verdict != "allow" || r.Addr != "203.0.113.7" || r.Port != 7 || r.Rule != "203.0.113.7" ||
		r.BytesOut != int64(len(payload)) || r.BytesIn != int64(len(payload)) || r.Duration <= 0 {
		t.Fatalf("record %+v", r)
	}
	st := h.p.Stats()
	if st.Allowed != 1 || st.Denied != 0 || st.BytesOut != uint64(len(payload)) || st.BytesIn != uint64(len(payload)) {
		t.Fatalf("stats %+v", st)
	}
}

func TestServerFirst(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.7"})
	// A long wait for the first bytes: a proxy that waited for the
	// client would fail the banner's deadline below.
	h := newHarness(t, Config{FirstBytesTimeout: 30 * time.Second}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.7:25", serve(t, func(c net.Conn) {
		_, _ = io.WriteString(c, "220 fake smtp\r\n")
		echo(c)
	}))
	start := time.Now()
	c := h.connect(sandboxA, "203.0.113.7:25")
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || line != "220 fake smtp\r\n" {
		t.Fatalf("banner: %q, %v", line, err)
	}
	t.Logf("banner after %v", time.Since(start))
	if _, err := io.WriteString(c, "EHLO sandbox\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "EHLO sandbox\r\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
}

// testCert is a self-signed certificate for the test names.
func testCert(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		DNSNames:  []string{"allowed.test", "evil.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// byteConn writes one byte per write (a segment each: Go sets
// TCP_NODELAY), so a ClientHello arrives in pieces.
type byteConn struct{ net.Conn }

func (c byteConn) Write(b []byte) (int, error) {
	for i := range b {
		if _, err := c.Conn.Write(b[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(b), nil
}

func TestTLS(t *testing.T) {
	cert, pool := testCert(t)
	sb := newSandbox([]string{"203.0.113.8"}, "allowed.test")
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	tlsServer := serve(t, func(c net.Conn) {
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
		if tc.Handshake() == nil {
			_, _ = io.WriteString(tc, "hello "+tc.ConnectionState().ServerName)
			_ = tc.Close()
		}
	})
	h.host("203.0.113.8:443", tlsServer)
	h.host("203.0.113.8:8443", tlsServer)

	for _, tc := range []struct {
		name, port, sni string
		split, allow    bool
	}{
		{"allowed", "443", "allowed.test", false, true},
		{"allowed split in 1-byte segments", "443", "allowed.test", true, true},
		{"denied", "443", "evil.test", false, false},
		{"denied split", "443", "evil.test", true, false},
		{"allowed on another port", "8443", "allowed.test", false, true},
		{"denied on another port", "8443", "evil.test", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn = h.connect(sandboxA, "203.0.113.8:"+tc.port)
			if tc.split {
				c = byteConn{c}
			}
			cl := tls.Client(c, &tls.Config{ServerName: tc.sni, RootCAs: pool})
			_ = cl.SetDeadline(time.Now().Add(5 * time.Second))
			err := cl.Handshake()
			if !tc.allow {
				r := sb.record(t)
				if err == nil || isTimeout(err) {
					t.Fatalf("handshake with SNI %s: %v; want a reset", tc.sni, err)
				}
				if r.Verdict != "deny" || r.Name != tc.sni || !strings.Contains(r.Reason, "not allowed") {
					t.Fatalf("record %+v", r)
				}
				return
			}
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			got, err := io.ReadAll(cl)
			if err != nil || string(got) != "hello "+tc.sni {
				t.Fatalf("read %q, %v", got, err)
			}
			_ = cl.Close()
			if r := sb.record(t); r.Verdict != "allow" || r.Name != tc.sni || r.BytesOut < 100 || r.BytesIn < 100 {
				t.Fatalf("record %+v", r)
			}
		})
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if want := "tls:allowed.test"; len(sb.decided) == 0 || sb.decided[0] != want {
		t.Fatalf("decisions with a name %q, want %q first", sb.decided, want)
	}
}

func TestHTTP(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.9"}, "allowed.test")
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "host "+r.Host)
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = web.Serve(ln) }()
	t.Cleanup(func() { _ = web.Close() })
	h.host("203.0.113.9:80", ln)

	t.Run("client", func(t *testing.T) {
		cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return h.connect(sandboxA, "203.0.113.9:80"), nil
			},
		}}
		resp, err := cl.Get("http://allowed.test/x")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(body) != "host allowed.test" {
			t.Fatalf("body %q", body)
		}
		if resp, err := cl.Get("http://evil.test/x"); err == nil {
			_ = resp.Body.Close()
			t.Fatal("request for a denied Host went through")
		}
		cl.CloseIdleConnections()
	})
	for _, r := range []egress.Record{sb.record(t), sb.record(t)} {
		if !(r.Name == "allowed.test" && r.Verdict == "allow" || r.Name == "evil.test" && r.Verdict == "deny") {
			t.Fatalf("record %+v", r)
		}
	}

	for _, tc := range []struct {
		name, req, host string
		allow           bool
	}{
		{"Host with port and case", "GET / HTTP/1.1\r\nHost: Allowed.TEST:80\r\n\r\n", "allowed.test", true},
		{"absolute form", "GET http://allowed.test/p HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "allowed.test", true},
		{"absolute form without Host", "GET http://allowed.test:80/p HTTP/1.0\r\n\r\n", "allowed.test", true},
		{"absolute form naming a denied host", "GET http://evil.test/p HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", false},
		{"denied Host", "POST / HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 0\r\n\r\n", "evil.test", false},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n", "", false},
		{"userinfo", "GET http://allowed.test@evil.test/ HTTP/1.1\r\n\r\n", "", false},
		{"head in bare line feeds, split", "GET / HTTP/1.1\nHost: allowed.test\n\n", "allowed.test", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn = h.connect(sandboxA, "203.0.113.9:80")
			if strings.Contains(tc.name, "split") {
				c = byteConn{c}
			}
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			if !tc.allow {
				r := sb.record(t)
				refused(t, c)
				if r.Verdict != "deny" || r.Name != tc.host || r.Reason == "" {
					t.Fatalf("record %+v", r)
				}
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if want := "host " + tc.host; resp.StatusCode != 200 || !strings.HasPrefix(strings.ToLower(string(body)), want) {
				t.Fatalf("body %q, want %q", body, want)
			}
			_ = c.Close()
			if r := sb.record(t); r.Verdict != "allow" || r.Name != tc.host {
				t.Fatalf("record %+v", r)
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.7"}, "allowed.test")
	h := newHarness(t, Config{FirstBytesTimeout: 300 * time.Millisecond}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.7:443", serve(t, echo))
	h.host("203.0.113.7:7", serve(t, echo))

	t.Run("garbage on 443", func(t *testing.T) {
		c := h.connect(sandboxA, "203.0.113.7:443")
		_, _ = io.WriteString(c, "SSH-2.0-OpenSSH\r\n")
		refused(t, c)
		if r := sb.record(t); r.Verdict != "deny" || r.Reason != "neither TLS nor HTTP on port 443" {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("malformed ClientHello on 443", func(t *testing.T) {
		c := h.connect(sandboxA, "203.0.113.7:443")
		_, _ = c.Write([]byte{22, 3, 1, 0, 5, 1, 0, 0, 1, 0})
		refused(t, c)
		if r := sb.record(t); r.Verdict != "deny" || !strings.Contains(r.Reason, "ClientHello") {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("request head over the bound", func(t *testing.T) {
		c := h.connect(sandboxA, "203.0.113.7:443")
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\nCookie: "+strings.Repeat("x", MaxPeek))
		refused(t, c)
		if r := sb.record(t); r.Verdict != "deny" || r.Reason != "HTTP request head over 16384 bytes" {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("nothing sent on 443", func(t *testing.T) {
		start := time.Now()
		c := h.connect(sandboxA, "203.0.113.7:443")
		refused(t, c)
		if d := time.Since(start); d < 250*time.Millisecond {
			t.Fatalf("refused after %v, before the deadline", d)
		}
		if r := sb.record(t); r.Verdict != "deny" || !strings.Contains(r.Reason, "no bytes") {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("ClientHello begun, never finished, on another port", func(t *testing.T) {
		c := h.connect(sandboxA, "203.0.113.7:7")
		_, _ = c.Write([]byte{22, 3, 1, 0, 200, 1})
		refused(t, c)
		if r := sb.record(t); r.Verdict != "deny" || !strings.Contains(r.Reason, "incomplete") {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("denied address", func(t *testing.T) {
		c := h.connect(sandboxA, "198.51.100.1:22")
		refused(t, c)
		if r := sb.record(t); r.Verdict != "deny" || r.Reason != "not pinned" || r.Addr != "198.51.100.1" || r.Port != 22 {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("failed dial", func(t *testing.T) {
		sb.addrs[netip.MustParseAddr("203.0.113.99")] = true // before any Decide on it
		c := h.connect(sandboxA, "203.0.113.99:5432")
		refused(t, c)
		if r := sb.record(t); r.Verdict != "deny" || !strings.HasPrefix(r.Reason, "connect: ") {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("the proxy itself", func(t *testing.T) {
		c := h.connect(sandboxA, h.addr)
		refused(t, c)
		if r := sb.record(t); r.Verdict != "deny" || !strings.Contains(r.Reason, "proxy itself") {
			t.Fatalf("record %+v", r)
		}
	})
	t.Run("unknown source", func(t *testing.T) {
		// Reset before it is looked at: the reset may beat the end of
		// connect(2) itself.
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: stranger.AsSlice()}}
		c, err := d.Dial("tcp", h.addr)
		if err == nil {
			refused(t, c)
			_ = c.Close()
		} else if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatal(err)
		}
		waitStats(t, h.p, func(st Stats) bool { return st.Unknown == 1 })
	})
	waitStats(t, h.p, func(st Stats) bool { return st.Denied == 8 && st.Allowed == 0 && st.Active == 0 })
}

// echoes checks that c is open end to end.
func echoes(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo %q, %v", b, err)
	}
	_ = c.SetDeadline(time.Time{})
}

func TestLimits(t *testing.T) {
	a, b := newSandbox([]string{"203.0.113.7"}), newSandbox([]string{"203.0.113.7"})
	h := newHarness(t, Config{MaxPerSandbox: 3, MaxTotal: 4}, map[netip.Addr]*fakeSandbox{sandboxA: a, sandboxB: b})
	h.host("203.0.113.7:7", serve(t, echo))

	var open []*net.TCPConn
	for range 3 {
		c := h.connect(sandboxA, "203.0.113.7:7")
		echoes(t, c)
		open = append(open, c)
	}
	// Three more over the sandbox's limit within a second: one record.
	for range 3 {
		refused(t, h.connect(sandboxA, "203.0.113.7:7"))
	}
	if r := a.record(t); r.Verdict != "deny" || r.Reason != "over 3 connections for this sandbox" {
		t.Fatalf("record %+v", r)
	}
	a.noRecord(t)
	// Another sandbox has its own count, but not beyond the total.
	cb := h.connect(sandboxB, "203.0.113.7:7")
	echoes(t, cb)
	refused(t, h.connect(sandboxB, "203.0.113.7:7"))
	if r := b.record(t); r.Verdict != "deny" || r.Reason != "over 4 connections in all" {
		t.Fatalf("record %+v", r)
	}
	waitStats(t, h.p, func(st Stats) bool { return st.Denied == 4 && st.Active == 4 })
	// A closed connection frees its place.
	_ = open[0].Close()
	if r := a.record(t); r.Verdict != "allow" {
		t.Fatalf("record %+v", r)
	}
	// The record is written before the connection's place is given back:
	// wait for the place (Active counts until the handler has returned).
	waitStats(t, h.p, func(st Stats) bool { return st.Active == 3 })
	echoes(t, h.connect(sandboxA, "203.0.113.7:7"))
	// After a second, the next refusal is logged with the count of the
	// ones that were not.
	time.Sleep(1100 * time.Millisecond)
	refused(t, h.connect(sandboxA, "203.0.113.7:7"))
	if r := a.record(t); r.Reason != "over 3 connections for this sandbox (and 2 more refused, not logged)" {
		t.Fatalf("record %+v", r)
	}
}

func TestHalfClose(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.7"})
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	// The server answers only once the client has finished sending.
	h.host("203.0.113.7:9", serve(t, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		_, _ = fmt.Fprintf(c, "got %d", n)
	}))
	c := h.connect(sandboxA, "203.0.113.7:9")
	if _, err := io.WriteString(c, "twelve bytes"); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "got 12" {
		t.Fatalf("read %q, %v", got, err)
	}
	if r := sb.record(t); r.BytesOut != 12 || r.BytesIn != 6 || r.Reason != "address" {
		t.Fatalf("record %+v", r)
	}

	// A reset from the sandbox ends both sides, and says so.
	h.host("203.0.113.7:7", serve(t, echo))
	c = h.connect(sandboxA, "203.0.113.7:7")
	echoes(t, c)
	reset(c)
	if r := sb.record(t); r.BytesOut != 4 || r.Reason != "address; ended: sandbox side: connection reset by peer" {
		t.Fatalf("record %+v", r)
	}
}

func TestIdle(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.7"})
	h := newHarness(t, Config{IdleTimeout: 800 * time.Millisecond}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.7:7", serve(t, echo))

	// Busy for longer than the idle timeout: stays open.
	busy := h.connect(sandboxA, "203.0.113.7:7")
	for range 12 {
		echoes(t, busy)
		time.Sleep(100 * time.Millisecond)
	}
	_ = busy.Close()
	if r := sb.record(t); r.BytesOut != 48 || strings.Contains(r.Reason, "idle") {
		t.Fatalf("record %+v", r)
	}
	// A download only: the sandbox sends nothing for longer than the
	// timeout, the data coming in keeps the connection.
	h.host("203.0.113.7:19", serve(t, func(c net.Conn) {
		for range 12 {
			if _, err := io.WriteString(c, "chargen\n"); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}))
	dl := h.connect(sandboxA, "203.0.113.7:19")
	_ = dl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(dl); err != nil || len(got) != 96 {
		t.Fatalf("download: %d bytes, %v", len(got), err)
	}
	_ = dl.CloseWrite()
	if r := sb.record(t); r.BytesIn != 96 || strings.Contains(r.Reason, "idle") {
		t.Fatalf("record %+v", r)
	}
	// Quiet: ended.
	quiet := h.connect(sandboxA, "203.0.113.7:7")
	echoes(t, quiet)
	start := time.Now()
	_ = quiet.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := quiet.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("idle connection: %v", err)
	}
	t.Logf("idle connection ended after %v", time.Since(start))
	if r := sb.record(t); r.Verdict != "allow" || !strings.Contains(r.Reason, "ended: idle") {
		t.Fatalf("record %+v", r)
	}
	// Silent from the start (still waiting for the client's first bytes).
	silent := h.connect(sandboxA, "203.0.113.7:7")
	_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("idle connection: %v", err)
	}
	if r := sb.record(t); r.Verdict != "allow" || r.Reason != "address; ended: idle" {
		t.Fatalf("record %+v", r)
	}
}

func TestCloseEndsEverything(t *testing.T) {
	base := runtime.NumGoroutine()
	sb := newSandbox([]string{"203.0.113.7"}, "allowed.test")
	cfg := Config{
		Lookup:      func(netip.Addr) Sandbox { return sb },
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return netip.MustParseAddrPort("203.0.113.7:7"), nil },
	}
	upstream := serve(t, echo)
	cfg.Dial = func(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", upstream.Addr().String())
	}
	p := New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln) }()
	var conns []net.Conn
	for range 5 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		echoes(t, c)
		conns = append(conns, c)
	}
	if st := p.Stats(); st.Active != 5 {
		t.Fatalf("stats %+v", st)
	}
	// Two goroutines a connection in the proxy, one in the echo server,
	// and the two accept loops.
	if n := runtime.NumGoroutine() - base; n > 5*3+2 {
		t.Fatalf("%d goroutines for 5 connections", n)
	}
	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
	for _, c := range conns {
		refused(t, c)
		_ = c.Close()
	}
	for range 5 {
		if r := sb.record(t); r.Verdict != "allow" || !strings.Contains(r.Reason, "egress proxy closed") {
			t.Fatalf("record %+v", r)
		}
	}
	waitStats(t, p, func(st Stats) bool { return st.Active == 0 && st.Allowed == 5 })
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Fatal("listener still open after Close")
	}
	// The proxy's goroutines are gone (the echo server's end as their
	// connections are reset).
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+2 { // the test server's accept loop, and slack for one
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitStats waits (a little: handlers finish just after the client sees
// their reset) until the counters are as ok wants.
func waitStats(t *testing.T, p *Proxy, ok func(Stats) bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !ok(p.Stats()); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", p.Stats())
		}
	}
}

// A protocol whose first word is an HTTP method's, without an HTTP
// version: forwarded by its address elsewhere, refused on 80 and 443.
func TestNotHTTP(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.7"})
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.7:6379", serve(t, echo))
	h.host("203.0.113.7:80", serve(t, echo))

	c := h.connect(sandboxA, "203.0.113.7:6379")
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET key\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "GET key\r\n" {
		t.Fatalf("echo %q, %v", line, err)
	}
	_ = c.Close()
	if r := sb.record(t); r.Verdict != "allow" || r.BytesOut != 9 {
		t.Fatalf("record %+v", r)
	}

	c = h.connect(sandboxA, "203.0.113.7:80")
	_, _ = io.WriteString(c, "GET key\r\n")
	refused(t, c)
	if r := sb.record(t); r.Verdict != "deny" || r.Reason != "neither TLS nor HTTP on port 80" {
		t.Fatalf("record %+v", r)
	}
}
