package portfwd

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

// echo serves a TCP echo on loopback; it returns its address.
func echo(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
				time.Sleep(100 * time.Millisecond)
				_ = c.Close()
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func forward(t *testing.T, target netip.AddrPort, lim Limits) *Forwarder {
	t.Helper()
	f, err := Listen(loopback, lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	f.Serve(target, nil)
	return f
}

func dial(t *testing.T, f *Forwarder) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(f.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// TestSplice: 4 MiB each way through the forwarder arrive intact, and a
// half-close travels (the echo's answer ends when the client's data did).
func TestSplice(t *testing.T) {
	f := forward(t, echo(t), Limits{})
	c := dial(t, f)
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	go func() {
		_, _ = c.Write(data)
		_ = c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes back, want the %d sent", len(got), len(data))
	}
}

// TestPortTaken: a host port in use is an error at Listen, EADDRINUSE.
func TestPortTaken(t *testing.T) {
	f := forward(t, echo(t), Limits{})
	_, err := Listen(f.Addr(), Limits{})
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("listen on a taken port: %v, want EADDRINUSE", err)
	}
}

// TestNothingBehind: a connection to a port nothing listens on in the
// target is reset, not held open.
func TestNothingBehind(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().(*net.TCPAddr).AddrPort()
	_ = ln.Close()
	f := forward(t, dead, Limits{})
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(f.Addr()))
	if err != nil {
		return // reset before the dial returned
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read through a forwarder with nothing behind it succeeded")
	}
}

// TestMaxConns: beyond the bound a connection is closed at once; one
// more fits again once one ends.
func TestMaxConns(t *testing.T) {
	f := forward(t, echo(t), Limits{MaxConns: 2})
	a, b := dial(t, f), dial(t, f)
	for _, c := range []*net.TCPConn{a, b} {
		roundTrip(t, c)
	}
	// Over the limit the forwarder resets the connection at once: the
	// reset may reach the client before its connect returns, or after.
	if c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(f.Addr())); err == nil {
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		_, err := c.Read(make([]byte, 1))
		_ = c.Close()
		if err == nil {
			t.Fatal("a third connection with MaxConns 2 was served")
		}
	}
	_ = a.Close()
	deadline := time.Now().Add(10 * time.Second)
	for f.Active() > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections active after one of two closed", f.Active())
		}
		time.Sleep(10 * time.Millisecond)
	}
	roundTrip(t, dial(t, f))
}

func roundTrip(t *testing.T, c *net.TCPConn) {
	t.Helper()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("round trip: %q %v", b, err)
	}
}

// TestIdle: a connection that carries nothing is ended after the idle
// limit; one that keeps talking is not.
func TestIdle(t *testing.T) {
	f := forward(t, echo(t), Limits{Idle: 300 * time.Millisecond})
	quiet, busy := dial(t, f), dial(t, f)
	roundTrip(t, quiet)
	for range 8 {
		roundTrip(t, busy)
		time.Sleep(100 * time.Millisecond)
	}
	t0 := time.Now()
	if _, err := quiet.Read(make([]byte, 1)); err == nil {
		t.Fatal("idle connection still open")
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("idle connection ended after %v", d)
	}
	roundTrip(t, busy)
}

// TestClose: Close ends the listener and the connections through it, and
// frees the port.
func TestClose(t *testing.T) {
	f := forward(t, echo(t), Limits{})
	c := dial(t, f)
	roundTrip(t, c)
	addr := f.Addr()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Active() != 0 {
		t.Fatalf("%d connections active after Close", f.Active())
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection open after Close")
	}
	if _, err := net.DialTimeout("tcp", addr.String(), 2*time.Second); err == nil {
		t.Fatal("port still accepts after Close")
	}
	g, err := Listen(addr, Limits{})
	if err != nil {
		t.Fatalf("port not free after Close: %v", err)
	}
	_ = g.Close()
}

// TestUse: use is called for each spliced connection and its done when
// the connection ends (the sandbox counts it as busy meanwhile).
func TestUse(t *testing.T) {
	f, err := Listen(loopback, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	var inUse atomic.Int64
	f.Serve(echo(t), func() func() {
		inUse.Add(1)
		return func() { inUse.Add(-1) }
	})
	c := dial(t, f)
	roundTrip(t, c)
	if n := inUse.Load(); n != 1 {
		t.Fatalf("%d in use during a connection, want 1", n)
	}
	_ = c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for inUse.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d in use after the connection ended", inUse.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
