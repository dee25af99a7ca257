package tproxy

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/secrets"
)

// The benchmarks compare a connection through the proxy with the same
// connection straight to the server, on loopback:
//
//	go test -run '^$' -bench . -count 6 ./internal/egress/tproxy
//
// Bulk is MB/s one way (sandbox → server, 1 MiB per op); Connect is one
// connection, a byte echoed, closed.

// benchServer serves handle on loopback, and a proxy in front of it that
// allows everything; it returns both addresses.
func benchServer(b *testing.B, handle func(net.Conn)) (direct, proxied string) {
	b.Helper()
	ln := serve(b, handle)
	sb := newSandbox([]string{"203.0.113.7"})
	go func() {
		for range sb.records { // drain the log
		}
	}()
	p := New(Config{
		Lookup:      func(netip.Addr) Sandbox { return sb },
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return netip.MustParseAddrPort("203.0.113.7:7"), nil },
		Dial: func(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", ln.Addr().String())
		},
	})
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = p.Serve(pln) }()
	b.Cleanup(func() { _ = p.Close(); close(sb.records) })
	return ln.Addr().String(), pln.Addr().String()
}

func BenchmarkBulk(b *testing.B) {
	// The server counts what it is sent and says how much at the end.
	direct, proxied := benchServer(b, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		_ = binary.Write(c, binary.BigEndian, n)
	})
	chunk := make([]byte, 1<<20)
	for _, bc := range []struct{ name, addr string }{{"direct", direct}, {"proxy", proxied}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(chunk)))
			c, err := net.Dial("tcp", bc.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			for b.Loop() {
				if _, err := c.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			_ = c.(*net.TCPConn).CloseWrite()
			var n int64
			if err := binary.Read(c, binary.BigEndian, &n); err != nil || n != int64(b.N)*int64(len(chunk)) {
				b.Fatalf("server got %d bytes (%v), sent %d", n, err, int64(b.N)*int64(len(chunk)))
			}
		})
	}
}

func BenchmarkConnect(b *testing.B) {
	direct, proxied := benchServer(b, echo)
	for _, bc := range []struct{ name, addr string }{{"direct", direct}, {"proxy", proxied}} {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 1)
			for b.Loop() {
				c, err := net.Dial("tcp", bc.addr)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				_ = c.Close()
			}
		})
	}
}

// BenchmarkHTTPRequests is one POST of 1 KiB answered on a kept-alive
// connection: straight to the server, through the proxy (every request
// parsed, its Host checked, written out again), and through the proxy
// with a secret put in its header and body.
func BenchmarkHTTPRequests(b *testing.B) {
	web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})}
	wln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = web.Serve(wln) }()
	b.Cleanup(func() { _ = web.Close() })
	st, err := secrets.NewStore(map[string]secrets.Provider{"env": &secrets.Env{Prefix: "B_", Lookup: func(string) (string, bool) { return "sk-bench-value", true }}},
		map[string][]secrets.Grant{"ns": {{Name: "api", Provider: "env", Hosts: []string{"bench.test"}}}})
	if err != nil {
		b.Fatal(err)
	}
	d, err := st.Resolve(context.Background(), "ns", "b", []string{"api"})
	if err != nil {
		b.Fatal(err)
	}
	_, ph, _ := strings.Cut(d.Env[0], "=")
	proxy := func(sec *secrets.Proxy) string {
		sb := newSandbox([]string{"203.0.113.7"}, "bench.test")
		sb.sec = sec
		go func() {
			for range sb.records {
			}
		}()
		p := New(Config{
			Lookup:      func(netip.Addr) Sandbox { return sb },
			OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return netip.MustParseAddrPort("203.0.113.7:80"), nil },
			Dial: func(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", wln.Addr().String())
			},
		})
		pln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = p.Serve(pln) }()
		b.Cleanup(func() { _ = p.Close(); close(sb.records) })
		return pln.Addr().String()
	}
	body := strings.Repeat("x", 1024-len(ph)) + ph
	for _, bc := range []struct{ name, addr string }{{"direct", wln.Addr().String()}, {"proxy", proxy(nil)}, {"proxy-secret", proxy(d.Proxy)}} {
		b.Run(bc.name, func(b *testing.B) {
			cl := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", bc.addr)
			}}}
			defer cl.CloseIdleConnections()
			for b.Loop() {
				req, _ := http.NewRequest("POST", "http://bench.test/", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+ph)
				resp, err := cl.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
}
