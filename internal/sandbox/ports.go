package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/portfwd"
)

// Published ports: a TCP port of a running sandbox, reachable at its link's
// address from the host, served on a host address (portfwd). Invariants:
//   - a sandbox's ports are published only while it runs with a link: the
//     spec's (Spec.Ports, microsandbox's "ports") are bound before the
//     backend starts it, so a host port that is taken fails the start
//     before anything runs, and served once its address is known; ports
//     exposed live (ExposePort) last for this run only;
//   - they are unpublished, and every connection through them or through
//     the HTTP route (DialPort) closed, BEFORE the sandbox's address goes
//     (netDown, which every stop path calls first): no connection can
//     outlive its sandbox and reach the next holder of its address;
//   - host addresses are the server's publish address (Options.
//     PublishAddress, loopback by default) or loopback: a caller cannot
//     publish on an address the operator did not choose.

// PublishedPort is one port of a sandbox published on the host.
type PublishedPort struct {
	Address netip.Addr // the host address
	Host    uint16     // the host port
	Guest   uint16     // the sandbox's port
	// FromSpec: from the sandbox's spec (published at every start), not
	// exposed live (this run only).
	FromSpec bool
}

// published is a PublishedPort and its forwarder.
type published struct {
	PublishedPort
	fwd *portfwd.Forwarder
}

// DefaultPublishAddress is where ports are published unless the server
// says otherwise.
var DefaultPublishAddress = netip.MustParseAddr("127.0.0.1")

// maxDialed bounds a sandbox's connections through the HTTP route.
const maxDialed = 256

// portState is what a running sandbox holds of the host's ports. Guarded
// by Manager.mu; changed holding the entry's life too.
type portState struct {
	ports  []*published
	dialed map[*dialedConn]struct{}
}

func (m *Manager) publishAddress() netip.Addr {
	if m.opts.PublishAddress.IsValid() {
		return m.opts.PublishAddress
	}
	return DefaultPublishAddress
}

// portError is a start refused for its ports: like a refusal, it leaves
// nothing of a new sandbox behind.
type portError struct{ error }

func (e portError) Unwrap() error { return e.error }

// listen binds a forwarder on addr:host for guest; a taken port is a
// conflict naming it.
func (m *Manager) listen(addr netip.Addr, host, guest uint16, fromSpec bool) (*published, error) {
	f, err := portfwd.Listen(netip.AddrPortFrom(addr, host), m.opts.PortLimits)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, errdefs.Errorf(errdefs.ErrConflict, "host port %d on %s (for sandbox port %d) is taken: choose another", host, addr, guest)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "address %s is not one of this host's", addr)
	case err != nil:
		return nil, fmt.Errorf("publish port %d on %s: %w", host, addr, err)
	}
	p := &published{fwd: f, PublishedPort: PublishedPort{Address: addr, Host: f.Addr().Port(), Guest: guest, FromSpec: fromSpec}}
	return p, nil
}

// bindPorts binds the spec's ports before a start; on an error none stays
// bound.
func (m *Manager) bindPorts(ps []backend.PortMapping) ([]*published, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	if !m.networking() {
		return nil, portError{errNoPorts(ps)}
	}
	var out []*published
	for _, p := range ps {
		pp, err := m.listen(m.publishAddress(), p.Host, p.Guest, true)
		if err != nil {
			closePorts(out)
			return nil, portError{err}
		}
		out = append(out, pp)
	}
	return out, nil
}

func errNoPorts(ps []backend.PortMapping) error {
	list := make([]string, len(ps))
	for i, p := range ps {
		list[i] = p.String()
	}
	return errdefs.Errorf(errdefs.ErrInvalid, "ports %v: publishing ports needs the sandbox network, which this server does not give (warren serve --network off, or the host cannot: see warren doctor)", list)
}

func closePorts(ps []*published) {
	for _, p := range ps {
		_ = p.fwd.Close()
	}
}

// portsUp serves ps (bound by bindPorts) to e's address; e runs, with its
// network up (netUp). On an error ps are closed.
func (m *Manager) portsUp(e *entry, ps []*published) error {
	if len(ps) == 0 {
		return nil
	}
	m.mu.Lock()
	addr := e.netAddr
	if !addr.IsValid() {
		m.mu.Unlock()
		closePorts(ps)
		return errdefs.Errorf(errdefs.ErrInvalid, "ports: this sandbox has no network link to publish them from")
	}
	for _, p := range ps {
		p.fwd.Serve(netip.AddrPortFrom(addr, p.Guest), e.use)
	}
	e.net.ports = append(e.net.ports, ps...)
	m.mu.Unlock()
	for _, p := range ps {
		e.logf("port %d published on %s", p.Guest, netip.AddrPortFrom(p.Address, p.Host))
	}
	return nil
}

// portsDown unpublishes e's ports and closes every connection to it made
// for the host; before its address goes (netDown).
func (m *Manager) portsDown(e *entry) {
	m.mu.Lock()
	ps, dialed := e.net.ports, e.net.dialed
	e.net = portState{}
	m.mu.Unlock()
	closePorts(ps)
	for c := range dialed {
		_ = c.Conn.Close()
	}
}

// ExposePort publishes port guest of the running sandbox ns/name on the
// host, for this run: on addr (the zero Addr: the server's publish
// address) and port host (0: any free one).
func (m *Manager) ExposePort(ns, name string, guest, host uint16, addr netip.Addr) (PublishedPort, error) {
	if guest == 0 {
		return PublishedPort{}, errdefs.Errorf(errdefs.ErrInvalid, "guest port: want 1-65535")
	}
	if !addr.IsValid() {
		addr = m.publishAddress()
	}
	if err := m.checkPublishAddress(addr); err != nil {
		return PublishedPort{}, err
	}
	e, unlock, err := m.runningEntry(ns, name)
	if err != nil {
		return PublishedPort{}, err
	}
	defer unlock()
	m.mu.Lock()
	n, netAddr := len(e.net.ports), e.netAddr
	m.mu.Unlock()
	if !netAddr.IsValid() {
		return PublishedPort{}, errdefs.Errorf(errdefs.ErrInvalid, "sandbox %q has no network link to publish a port from (this server gives sandboxes none)", name)
	}
	if n >= backend.MaxPorts {
		return PublishedPort{}, errdefs.Errorf(errdefs.ErrLimit, "sandbox %q has %d ports published, the maximum; unexpose some", name, n)
	}
	p, err := m.listen(addr, host, guest, false)
	if err != nil {
		return PublishedPort{}, err
	}
	if err := m.portsUp(e, []*published{p}); err != nil {
		return PublishedPort{}, err
	}
	return p.PublishedPort, nil
}

// checkPublishAddress: loopback, or the address the operator chose (any,
// when that is the unspecified address).
func (m *Manager) checkPublishAddress(addr netip.Addr) error {
	pub := m.publishAddress()
	if addr.IsLoopback() || addr == pub || (pub.IsUnspecified() && pub.Is4() == addr.Is4()) {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrForbidden, "address %s: this server publishes ports on %s and loopback only (warren serve --publish-address)", addr, pub)
}

// runningEntry holds ns/name's life if it runs; unlock releases it.
func (m *Manager) runningEntry(ns, name string) (*entry, func(), error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	m.mu.Unlock()
	if e == nil {
		return nil, nil, notFound(ns, name)
	}
	e.life.Lock()
	m.mu.Lock()
	removed, st := e.removed, e.state
	m.mu.Unlock()
	if removed {
		e.life.Unlock()
		return nil, nil, notFound(ns, name)
	}
	if st != Running {
		e.life.Unlock()
		return nil, nil, errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is %s: ports are published while it runs", name, ns, st)
	}
	return e, e.life.Unlock, nil
}

// Ports lists ns/name's published ports (none while it is stopped).
func (m *Manager) Ports(ns, name string) ([]PublishedPort, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key{ns, name}]
	if e == nil || e.removed {
		return nil, notFound(ns, name)
	}
	out := make([]PublishedPort, len(e.net.ports))
	for i, p := range e.net.ports {
		out[i] = p.PublishedPort
	}
	return out, nil
}

// UnexposePort unpublishes ns/name's host port (on addr only, when it is
// valid) and returns what it unpublished. A port from the spec is
// published again at the next start.
func (m *Manager) UnexposePort(ns, name string, host uint16, addr netip.Addr) ([]PublishedPort, error) {
	e, unlock, err := m.runningEntry(ns, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	m.mu.Lock()
	var gone []*published
	e.net.ports = slices.DeleteFunc(e.net.ports, func(p *published) bool {
		match := p.Host == host && (!addr.IsValid() || p.Address == addr)
		if match {
			gone = append(gone, p)
		}
		return match
	})
	m.mu.Unlock()
	if len(gone) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %q has no port published on host port %d", name, host)
	}
	closePorts(gone)
	out := make([]PublishedPort, len(gone))
	for i, p := range gone {
		out[i] = p.PublishedPort
		e.logf("port %d unpublished from %s", p.Guest, netip.AddrPortFrom(p.Address, p.Host))
	}
	return out, nil
}

// DialPort connects to port of the running sandbox ns/name from the host
// (the HTTP route). The connection is closed when the sandbox stops.
func (m *Manager) DialPort(ctx context.Context, ns, name string, port uint16) (net.Conn, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	if e == nil || e.removed {
		m.mu.Unlock()
		return nil, notFound(ns, name)
	}
	addr, st := e.netAddr, e.state
	n := len(e.net.dialed)
	m.mu.Unlock()
	switch {
	case st != Running:
		return nil, errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is %s: start it first", name, ns, st)
	case !addr.IsValid():
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "sandbox %q has no network link (this server gives sandboxes none)", name)
	case n >= maxDialed:
		return nil, errdefs.Errorf(errdefs.ErrLimit, "sandbox %q has %d connections through the HTTP route, the maximum", name, n)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "nothing answers on port %d of sandbox %q: %w", port, name, err)
	}
	dc := &dialedConn{Conn: c}
	m.mu.Lock()
	// Still the same run? A stop between the dial and here has closed the
	// others already: this one must not survive it.
	if e.state != Running || e.netAddr != addr {
		m.mu.Unlock()
		_ = c.Close()
		return nil, errdefs.Errorf(errdefs.ErrConflict, "sandbox %q stopped", name)
	}
	if e.net.dialed == nil {
		e.net.dialed = map[*dialedConn]struct{}{}
	}
	e.net.dialed[dc] = struct{}{}
	dc.release = func() {
		m.mu.Lock()
		delete(e.net.dialed, dc)
		m.mu.Unlock()
	}
	m.mu.Unlock()
	return dc, nil
}

// dialedConn is a connection DialPort made; closing it forgets it.
type dialedConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *dialedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// republish publishes the spec's ports of e, reattached after a restart
// (ports exposed live went with the last server); a port taken meanwhile
// is logged, the sandbox kept.
func (m *Manager) republish(e *entry) {
	ps, err := m.bindPorts(e.spec.Ports)
	if err == nil {
		err = m.portsUp(e, ps)
	}
	if err != nil {
		e.logf("reattached without its published ports: %v", err)
		m.log.Warn("sandbox reattached without its published ports", "namespace", e.ns, "name", e.name, "err", err.Error())
	}
}

// use counts a connection through a published port as a use of e, like a
// lease: no idle stop while it is open, the idle time counted from its end.
func (e *entry) use() func() {
	e.busy.Add(1)
	e.touch()
	return func() {
		e.touch()
		e.busy.Add(-1)
	}
}
