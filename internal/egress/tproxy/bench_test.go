package tproxy

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
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
