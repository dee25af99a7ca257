package sandbox_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// freePort is a loopback port nothing listens on (now).
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).AddrPort().Port()
}

// listening reports whether 127.0.0.1:port accepts connections.
func listening(port uint16) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(int(port)), 2*time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// TestPortsBookkeeping: the spec's ports are published on loopback while
// the sandbox runs (the fake backend has nothing behind its addresses,
// so only the host's side is checked: the port listens), unpublished
// when it stops and published again at its next start; so is a port
// exposed live, on the host port it got; unexpose frees the port for good.
func TestPortsBookkeeping(t *testing.T) {
	e := newEnv(t, sandbox.Options{Egress: egress.NewRegistry()})
	m := e.manager(t)
	hp := freePort(t)
	s := spec
	s.Ports = []backend.PortMapping{{Host: hp, Guest: 8000}}
	mustStart(t, m, "a", s)
	ps, err := m.Ports("ns", "a")
	if err != nil || len(ps) != 1 || ps[0].Host != hp || ps[0].Guest != 8000 || !ps[0].FromSpec || ps[0].Address != sandbox.DefaultPublishAddress {
		t.Fatalf("Ports = %+v %v, want %d:8000 from the spec on 127.0.0.1", ps, err, hp)
	}
	if !listening(hp) {
		t.Fatalf("published port %d does not listen", hp)
	}
	x, err := m.ExposePort(t.Context(), "ns", "a", 9000, 0, netip.Addr{})
	if err != nil || x.Host == 0 || x.Guest != 9000 || x.FromSpec {
		t.Fatalf("ExposePort: %+v %v", x, err)
	}
	if !listening(x.Host) {
		t.Fatalf("exposed port %d does not listen", x.Host)
	}
	// The same host port again: a conflict naming it.
	if _, err := m.ExposePort(t.Context(), "ns", "a", 9001, hp, netip.Addr{}); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), strconv.Itoa(int(hp))) {
		t.Errorf("expose on a taken port: %v, want a conflict naming %d", err, hp)
	}
	// Only loopback or the server's publish address.
	if _, err := m.ExposePort(t.Context(), "ns", "a", 9001, 0, netip.MustParseAddr("0.0.0.0")); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("expose on 0.0.0.0 with the default publish address: %v, want forbidden", err)
	}
	if gone, err := m.UnexposePort(t.Context(), "ns", "a", x.Host, netip.Addr{}); err != nil || len(gone) != 1 || gone[0].Guest != 9000 {
		t.Errorf("UnexposePort: %+v %v", gone, err)
	}
	if listening(x.Host) {
		t.Errorf("unexposed port %d still listens", x.Host)
	}
	if _, err := m.UnexposePort(t.Context(), "ns", "a", x.Host, netip.Addr{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unexpose twice: %v, want not found", err)
	}
	x, err = m.ExposePort(t.Context(), "ns", "a", 9000, 0, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if listening(hp) || listening(x.Host) {
		t.Error("a stopped sandbox's ports still listen")
	}
	if ps, _ := m.Ports("ns", "a"); len(ps) != 2 || ps[0].Published || ps[1].Published || ps[1].Host != x.Host || ps[1].FromSpec {
		t.Errorf("a stopped sandbox lists %+v, want its 2 ports unpublished", ps)
	}
	if _, err := m.ExposePort(t.Context(), "ns", "a", 9000, 0, netip.Addr{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("expose on a stopped sandbox: %v, want conflict", err)
	}
	// A restart with a config of its own (sandbox.start's) keeps the
	// exposed port.
	mustStart(t, m, "a", s)
	if ps, _ := m.Ports("ns", "a"); len(ps) != 2 || !ps[1].Published || ps[1].Host != x.Host || !listening(hp) || !listening(x.Host) {
		t.Errorf("after a restart: ports %+v, listening %v %v; want both, the exposed one on %d", ps, listening(hp), listening(x.Host), x.Host)
	}
	// Unexposed, the spec's port too, it stays gone after a restart.
	if gone, err := m.UnexposePort(t.Context(), "ns", "a", hp, netip.Addr{}); err != nil || len(gone) != 1 || !gone[0].FromSpec {
		t.Errorf("unexpose the spec's port: %+v %v", gone, err)
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	info, err := m.Get("ns", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(t.Context(), "ns", "a", info.Spec, false); err != nil {
		t.Fatal(err)
	}
	if ps, _ := m.Ports("ns", "a"); len(ps) != 1 || ps[0].Host != x.Host || listening(hp) {
		t.Errorf("after unexpose and a restart: ports %+v, %d listening %v; want the exposed one only", ps, hp, listening(hp))
	}
	if _, err := m.Remove(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if listening(hp) {
		t.Error("a removed sandbox's port still listens")
	}
}

// TestPortTaken: a start whose host port is taken fails with a conflict
// naming it, before the sandbox runs, and a new sandbox leaves nothing.
func TestPortTaken(t *testing.T) {
	e := newEnv(t, sandbox.Options{Egress: egress.NewRegistry()})
	m := e.manager(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	taken := ln.Addr().(*net.TCPAddr).AddrPort().Port()
	free := freePort(t)
	s := spec
	s.Ports = []backend.PortMapping{{Host: free, Guest: 80}, {Host: taken, Guest: 8000}}
	_, err = m.Start(t.Context(), "ns", "a", s, false)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), strconv.Itoa(int(taken))) {
		t.Fatalf("start with a taken port: %v, want a conflict naming %d", err, taken)
	}
	if _, err := m.Get("ns", "a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a start refused for its port left a sandbox: %v", err)
	}
	if m.Running() != 0 {
		t.Errorf("%d sandboxes running", m.Running())
	}
	if listening(free) {
		t.Errorf("port %d of the refused start listens", free)
	}
}

// TestPortsWithoutNetwork: without networking, ports are refused naming
// them, and expose has nothing to publish from.
func TestPortsWithoutNetwork(t *testing.T) {
	m := newEnv(t, sandbox.Options{}).manager(t)
	s := spec
	s.Ports = []backend.PortMapping{{Host: 18080, Guest: 80}}
	if _, err := m.Start(t.Context(), "ns", "a", s, false); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "18080:80") {
		t.Errorf("ports without a network: %v, want invalid naming 18080:80", err)
	}
	mustStart(t, m, "b", spec)
	if _, err := m.ExposePort(t.Context(), "ns", "b", 80, 0, netip.Addr{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("expose without a network: %v, want invalid", err)
	}
}

// TestPublishAddress: with the server's publish address 0.0.0.0, the spec's
// ports listen there and expose takes any IPv4 address of the host (a
// loopback one too); an address not the host's is invalid.
func TestPublishAddress(t *testing.T) {
	any4 := netip.MustParseAddr("0.0.0.0")
	m := newEnv(t, sandbox.Options{Egress: egress.NewRegistry(), PublishAddress: any4}).manager(t)
	hp := freePort(t)
	s := spec
	s.Ports = []backend.PortMapping{{Host: hp, Guest: 80}}
	mustStart(t, m, "a", s)
	if ps, err := m.Ports("ns", "a"); err != nil || len(ps) != 1 || ps[0].Address != any4 || !listening(hp) {
		t.Fatalf("Ports = %+v %v, want one on 0.0.0.0", ps, err)
	}
	if p, err := m.ExposePort(t.Context(), "ns", "a", 81, 0, netip.MustParseAddr("127.0.0.2")); err != nil || p.Address.String() != "127.0.0.2" {
		t.Errorf("expose on 127.0.0.2: %+v %v", p, err)
	}
	if _, err := m.ExposePort(t.Context(), "ns", "a", 82, 0, netip.MustParseAddr("192.0.2.1")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("expose on an address not the host's: %v, want invalid", err)
	}
}

// TestPortsAfterRestart: a server that closes unpublishes its sandboxes'
// ports (they keep running); the next one reattaches them and publishes
// their ports again, those exposed live too, each on its own: one taken
// meanwhile is left out and logged, the others published.
func TestPortsAfterRestart(t *testing.T) {
	e := newEnv(t, sandbox.Options{Egress: egress.NewRegistry()})
	m1, err := sandbox.New(t.Context(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	hp := freePort(t)
	s := spec
	s.Ports = []backend.PortMapping{{Host: hp, Guest: 80}}
	mustStart(t, m1, "a", s)
	x, err := m1.ExposePort(t.Context(), "ns", "a", 81, 0, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	y, err := m1.ExposePort(t.Context(), "ns", "a", 82, 0, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	m1.Close()
	if listening(hp) || listening(x.Host) {
		t.Fatal("a closed manager's ports still listen")
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(sandbox.DefaultPublishAddress, y.Host).String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	m2 := e.manager(t)
	if st := state(t, m2, "a"); st != sandbox.Running {
		t.Fatalf("reattached sandbox is %s", st)
	}
	if ps, err := m2.Ports("ns", "a"); err != nil || len(ps) != 2 || ps[0].Host != hp || ps[1].Host != x.Host || !listening(hp) || !listening(x.Host) {
		t.Errorf("after a restart: %+v %v, want ports %d and %d listening", ps, err, hp, x.Host)
	}
	lines, _ := m2.Logs("ns", "a", 0)
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.Contains(l, "without a published port") && strings.Contains(l, strconv.Itoa(int(y.Host)))
	}) {
		t.Errorf("the log does not say port %d was left out: %q", y.Host, lines)
	}
}

// TestExposedPortTakenAtStart: a port exposed in an earlier run that is
// taken when the sandbox starts again fails the start (conflict, naming
// the port and the way out) and leaves the sandbox in error saying so;
// unexposed while stopped, it starts without it. Bad ports and the bound
// are refused.
func TestExposedPortTakenAtStart(t *testing.T) {
	e := newEnv(t, sandbox.Options{Egress: egress.NewRegistry()})
	m := e.manager(t)
	mustStart(t, m, "a", spec)
	x, err := m.ExposePort(t.Context(), "ns", "a", 8000, 0, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ExposePort(t.Context(), "ns", "a", 0, 0, netip.Addr{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("expose guest port 0: %v, want invalid", err)
	}
	if _, err := m.ExposePort(t.Context(), "ns", "a", 8001, x.Host, netip.Addr{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("expose the same host port twice: %v, want conflict", err)
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(sandbox.DefaultPublishAddress, x.Host).String())
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Start(t.Context(), "ns", "a", spec, false)
	_ = ln.Close()
	want := fmt.Sprintf("warren ports unexpose a %d", x.Host)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), want) {
		t.Fatalf("start with its exposed port taken: %v, want a conflict saying %q", err, want)
	}
	info, err := m.Get("ns", "a")
	if err != nil || info.State != sandbox.Error || !strings.Contains(info.Error, strconv.Itoa(int(x.Host))) {
		t.Fatalf("after the failed start: %+v %v, want error naming port %d", info, err, x.Host)
	}
	if gone, err := m.UnexposePort(t.Context(), "ns", "a", x.Host, netip.Addr{}); err != nil || len(gone) != 1 || gone[0].Guest != 8000 {
		t.Fatalf("unexpose while in error: %+v %v", gone, err)
	}
	if _, err := m.UnexposePort(t.Context(), "ns", "a", x.Host, netip.Addr{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unexpose twice: %v, want not found", err)
	}
	mustStart(t, m, "a", spec)
	if ps, err := m.Ports("ns", "a"); err != nil || len(ps) != 0 {
		t.Errorf("after unexpose: ports %+v %v, want none", ps, err)
	}
	// The bound counts exposed ports.
	for i := range backend.MaxPorts {
		if _, err := m.ExposePort(t.Context(), "ns", "a", uint16(1000+i), 0, netip.Addr{}); err != nil {
			t.Fatalf("expose %d: %v", i, err)
		}
	}
	if _, err := m.ExposePort(t.Context(), "ns", "a", 999, 0, netip.Addr{}); !errors.Is(err, errdefs.ErrLimit) {
		t.Errorf("expose beyond %d: %v, want limit", backend.MaxPorts, err)
	}
}

// TestRestartConfigTakesExposedPort: a restart whose config publishes a
// host port a port exposed earlier had replaces that exposed port rather
// than failing on it.
func TestRestartConfigTakesExposedPort(t *testing.T) {
	m := newEnv(t, sandbox.Options{Egress: egress.NewRegistry()}).manager(t)
	mustStart(t, m, "a", spec)
	x, err := m.ExposePort(t.Context(), "ns", "a", 81, 0, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	s := spec
	s.Ports = []backend.PortMapping{{Host: x.Host, Guest: 80}}
	mustStart(t, m, "a", s)
	if ps, err := m.Ports("ns", "a"); err != nil || len(ps) != 1 || !ps[0].FromSpec || ps[0].Guest != 80 || !listening(x.Host) {
		t.Errorf("ports %+v %v, want the config's %d:80 only", ps, err, x.Host)
	}
}
