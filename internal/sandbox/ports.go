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
//     spec's (Spec.Ports, microsandbox's "ports"; Spec.Exposed, those
//     exposed live) are bound before the backend starts it, so a host port
//     that is taken fails the start before anything runs (the sandbox is
//     left in error naming the port), and served once its address is
//     known;
//   - the spec is the record: a port exposed live is written to it (and
//     the store) before it is served, one unexposed is taken out of it, so
//     a stop, a restart or the server's own restart publishes exactly what
//     was published before;
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
	// FromSpec: from the spec's Ports (the start's config), not exposed
	// live (ExposePort). Both are published at every start.
	FromSpec bool
	// Published: served now. A stopped sandbox's ports are listed
	// unpublished, as its next start will publish them.
	Published bool
}

// ExposedPort is a port ExposePort published, as the spec keeps it: the
// host port it got (also when any free one was asked for).
type ExposedPort struct {
	Address netip.Addr `json:"address"`
	Host    uint16     `json:"host"`
	Guest   uint16     `json:"guest"`
}

// checkExposed checks a spec's exposed ports (the store's, so perhaps
// written by an older server) and bounds all of its ports together.
func checkExposed(ports []backend.PortMapping, exposed []ExposedPort) error {
	if n := len(ports) + len(exposed); n > backend.MaxPorts {
		return fmt.Errorf("ports: %d published, at most %d", n, backend.MaxPorts)
	}
	seen := map[netip.AddrPort]bool{}
	for _, x := range exposed {
		ap := netip.AddrPortFrom(x.Address, x.Host)
		if !x.Address.IsValid() || x.Host == 0 || x.Guest == 0 || seen[ap] {
			return fmt.Errorf("exposed port %s for %d: want an address, ports 1-65535, each host port once", ap, x.Guest)
		}
		seen[ap] = true
	}
	return nil
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

// bindPorts binds the ports of sandbox name's spec before a start; on an
// error none stays bound.
func (m *Manager) bindPorts(name string, spec Spec) ([]*published, error) {
	if len(spec.Ports)+len(spec.Exposed) == 0 {
		return nil, nil
	}
	if !m.networking() {
		return nil, portError{errNoPorts(spec.Ports, spec.Exposed)}
	}
	var out []*published
	for _, p := range spec.Ports {
		pp, err := m.listen(m.publishAddress(), p.Host, p.Guest, true)
		if err != nil {
			closePorts(out)
			return nil, portError{err}
		}
		out = append(out, pp)
	}
	for _, x := range spec.Exposed {
		pp, err := m.bindExposed(name, x)
		if err != nil {
			closePorts(out)
			return nil, portError{err}
		}
		out = append(out, pp)
	}
	return out, nil
}

// bindExposed binds a port exposed in an earlier run: where it was, if
// that is still allowed and free; otherwise an error saying how to start
// without it.
func (m *Manager) bindExposed(name string, x ExposedPort) (*published, error) {
	err := m.checkPublishAddress(x.Address)
	var pp *published
	if err == nil {
		pp, err = m.listen(x.Address, x.Host, x.Guest, false)
	}
	if err != nil {
		// Its kind (conflict: taken; forbidden: no longer allowed) stays.
		return nil, fmt.Errorf("port %d exposed on %s: %w (warren ports unexpose %s %d: start without it)", x.Guest, netip.AddrPortFrom(x.Address, x.Host), err, name, x.Host)
	}
	return pp, nil
}

func errNoPorts(ps []backend.PortMapping, xs []ExposedPort) error {
	list := make([]string, 0, len(ps)+len(xs))
	for _, p := range ps {
		list = append(list, p.String())
	}
	for _, x := range xs {
		list = append(list, fmt.Sprintf("%d:%d", x.Host, x.Guest))
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
		p.Published = true
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
// host, on addr (the zero Addr: the server's publish address) and port
// host (0: any free one), and records it in the sandbox's spec: its later
// starts publish it again on the same host port, until UnexposePort.
func (m *Manager) ExposePort(ctx context.Context, ns, name string, guest, host uint16, addr netip.Addr) (PublishedPort, error) {
	if guest == 0 {
		return PublishedPort{}, errdefs.Errorf(errdefs.ErrInvalid, "guest port: want 1-65535")
	}
	if !addr.IsValid() {
		addr = m.publishAddress()
	}
	if err := m.checkPublishAddress(addr); err != nil {
		return PublishedPort{}, err
	}
	e, unlock, err := m.lockedEntry(ns, name, true)
	if err != nil {
		return PublishedPort{}, err
	}
	defer unlock()
	m.mu.Lock()
	n, netAddr := max(len(e.net.ports), len(e.spec.Ports)+len(e.spec.Exposed)), e.netAddr
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
	// Recorded before it is served: a port that is served is one the
	// next start publishes again.
	x := ExposedPort{Address: addr, Host: p.Host, Guest: guest}
	if err := m.setExposed(ctx, e, func(xs []ExposedPort) []ExposedPort { return append(slices.Clip(xs), x) }); err != nil {
		closePorts([]*published{p})
		return PublishedPort{}, err
	}
	if err := m.portsUp(e, []*published{p}); err != nil {
		return PublishedPort{}, err
	}
	return p.PublishedPort, nil
}

// setExposed replaces e's exposed ports with change's of them (a slice of
// its own), in its spec and the store; on an error the old ones stay.
// Holds e.life.
func (m *Manager) setExposed(ctx context.Context, e *entry, change func([]ExposedPort) []ExposedPort) error {
	m.mu.Lock()
	old := e.spec.Exposed
	e.spec.Exposed = change(old)
	m.mu.Unlock()
	if err := m.persistErr(ctx, e); err != nil {
		m.mu.Lock()
		e.spec.Exposed = old
		m.mu.Unlock()
		return err
	}
	return nil
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

// lockedEntry holds ns/name's life if it runs, or (unless running) if it
// is stopped or in error; unlock releases it.
func (m *Manager) lockedEntry(ns, name string, running bool) (*entry, func(), error) {
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
	if st != Running && (running || (st != Stopped && st != Error)) {
		e.life.Unlock()
		return nil, nil, errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is %s: ports are published while it runs", name, ns, st)
	}
	return e, e.life.Unlock, nil
}

// Ports lists ns/name's ports: while it runs, those published (a port its
// start could not publish again after a server restart is missing); else
// those its next start will publish.
func (m *Manager) Ports(ns, name string) ([]PublishedPort, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key{ns, name}]
	if e == nil || e.removed {
		return nil, notFound(ns, name)
	}
	if e.state == Running {
		out := make([]PublishedPort, len(e.net.ports))
		for i, p := range e.net.ports {
			out[i] = p.PublishedPort
		}
		return out, nil
	}
	return m.specPorts(e.spec), nil
}

// specPorts are the ports a start of spec publishes.
func (m *Manager) specPorts(spec Spec) []PublishedPort {
	out := make([]PublishedPort, 0, len(spec.Ports)+len(spec.Exposed))
	for _, p := range spec.Ports {
		out = append(out, PublishedPort{Address: m.publishAddress(), Host: p.Host, Guest: p.Guest, FromSpec: true})
	}
	for _, x := range spec.Exposed {
		out = append(out, PublishedPort{Address: x.Address, Host: x.Host, Guest: x.Guest})
	}
	return out
}

// UnexposePort unpublishes ns/name's host port (on addr only, when it is
// valid), running or stopped, and takes it out of its spec: no later start
// publishes it, whether it came from the start's config or was exposed.
// It returns what it unpublished.
func (m *Manager) UnexposePort(ctx context.Context, ns, name string, host uint16, addr netip.Addr) ([]PublishedPort, error) {
	e, unlock, err := m.lockedEntry(ns, name, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	match := func(a netip.Addr, h uint16) bool { return h == host && (!addr.IsValid() || a == addr) }
	pub := m.publishAddress()
	m.mu.Lock()
	old := e.spec
	var gone []PublishedPort
	for _, p := range m.specPorts(old) {
		if match(p.Address, p.Host) {
			gone = append(gone, p)
		}
	}
	e.spec.Ports = slices.DeleteFunc(slices.Clone(old.Ports), func(p backend.PortMapping) bool { return match(pub, p.Host) })
	e.spec.Exposed = slices.DeleteFunc(slices.Clone(old.Exposed), func(x ExposedPort) bool { return match(x.Address, x.Host) })
	var closing []*published
	e.net.ports = slices.DeleteFunc(e.net.ports, func(p *published) bool {
		if match(p.Address, p.Host) {
			closing = append(closing, p)
			return true
		}
		return false
	})
	m.mu.Unlock()
	if len(gone) == 0 && len(closing) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %q has no port published on host port %d", name, host)
	}
	closePorts(closing)
	if err := m.persistErr(ctx, e); err != nil {
		// Unpublished now; the store may publish it again at the next start.
		return nil, err
	}
	if len(closing) > 0 {
		gone = gone[:0]
		for _, p := range closing {
			gone = append(gone, p.PublishedPort)
		}
	}
	for _, p := range gone {
		e.logf("port %d unpublished from %s", p.Guest, netip.AddrPortFrom(p.Address, p.Host))
	}
	return gone, nil
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

// republish publishes the ports of e, reattached after a restart, each
// on its own: one taken meanwhile (or no longer allowed) is logged in its
// log and the server's, and left out; the sandbox keeps running.
func (m *Manager) republish(e *entry) {
	m.mu.Lock()
	spec := e.spec
	m.mu.Unlock()
	var ps []*published
	var errs []error
	for _, p := range spec.Ports {
		one := spec
		one.Ports, one.Exposed = []backend.PortMapping{p}, nil
		pp, err := m.bindPorts(e.name, one)
		ps, errs = append(ps, pp...), append(errs, err)
	}
	for _, x := range spec.Exposed {
		one := spec
		one.Ports, one.Exposed = nil, []ExposedPort{x}
		pp, err := m.bindPorts(e.name, one)
		ps, errs = append(ps, pp...), append(errs, err)
	}
	if err := m.portsUp(e, ps); err != nil {
		errs = append(errs, err)
	}
	for _, err := range errs {
		if err != nil {
			e.logf("reattached without a published port: %v", err)
			m.log.Warn("sandbox reattached without a published port", "namespace", e.ns, "name", e.name, "err", err.Error())
		}
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
