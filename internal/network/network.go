// Package network is the host side of sandbox networking, started as one:
// the plumbing that gives each sandbox a link and steers its traffic
// (internal/netplumb), the resolver that answers its DNS queries
// (internal/egress/resolver), the transparent proxy its TCP connections
// reach (internal/egress/tproxy), and the registry through which both
// find the sandbox a packet came from (internal/egress). warren serve
// and warren run each start one; the native backend attaches sandboxes to
// its plumbing, the sandbox manager registers them.
package network

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/egress/resolver"
	"github.com/warren-sandbox/warren/internal/egress/tproxy"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/netplumb"
)

// Options configure a Network.
type Options struct {
	// Prefix names the instance's table and links (the backend's
	// InstancePrefix).
	Prefix string
	// Pool is where sandboxes' link addresses come from; zero: a slot of
	// AutoRange of this instance's own (pool.go).
	Pool netip.Prefix
	// Upstreams are the resolvers names are looked up with (the host's
	// /etc/resolv.conf when empty).
	Upstreams []netip.AddrPort
	// UpstreamRoots verify the destinations the proxy intercepts for
	// sandboxes' secrets (nil: the host's roots).
	UpstreamRoots *x509.CertPool
	Logger        *slog.Logger
}

// Network is a running host side of sandbox networking.
type Network struct {
	Registry *egress.Registry
	Plumb    *netplumb.Host
	Pool     netip.Prefix // where its sandboxes' addresses come from

	poolLock *os.File // held for the process's life: the pool is this instance's

	res   *resolver.Server
	proxy *tproxy.Proxy
	udp   net.PacketConn
	tcp   net.Listener // the resolver's
	pln   net.Listener // the proxy's
	wg    sync.WaitGroup

	refused atomic.Uint64 // connections the gate refused at their SYN

	stopWatch chan struct{} // ends watchHostLocal
}

// Start listens for the resolver and the proxy, then opens the plumbing
// steering sandboxes' traffic to them.
func Start(opts Options) (_ *Network, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	// Not the named result: a failed Start returns nil, and the deferred
	// close must still see the listeners.
	n := &Network{Registry: egress.NewRegistry()}
	defer func() {
		if err != nil {
			n.closeListeners()
		}
	}()
	// The listeners take any address: the plumbing redirects a
	// sandbox's packets to its link's gateway address, which is on a
	// link made later. What does not come from a registered sandbox is
	// refused by both (Lookup answers nil).
	if n.udp, n.tcp, err = listenPair(); err != nil {
		return nil, fmt.Errorf("network: resolver: %w", err)
	}
	if n.pln, err = netplumb.ListenTCP("0.0.0.0:0"); err != nil {

		return nil, fmt.Errorf("network: proxy: %w", err)
	}
	reg := n.Registry
	if n.res, err = resolver.New(resolver.Config{
		Lookup: func(a netip.Addr) resolver.Sandbox {
			if s := reg.Lookup(a); s != nil {
				return s
			}
			return nil // not a typed nil
		},
		Upstreams: opts.Upstreams,
	}); err != nil {
		return nil, fmt.Errorf("network: resolver: %w", err)
	}
	n.proxy = tproxy.New(tproxy.Config{
		UpstreamRoots: opts.UpstreamRoots,
		Lookup: func(a netip.Addr) tproxy.Sandbox {
			if s := reg.Lookup(a); s != nil {
				return s
			}
			return nil
		},
	})
	cfg := netplumb.Config{Prefix: opts.Prefix, Pool: opts.Pool, ResolverPort: port(n.tcp.Addr()), ProxyPort: port(n.pln.Addr()),
		Refused: n.refusedAt}
	if opts.Pool.IsValid() {
		n.Plumb, err = netplumb.Open(cfg)
	} else {
		n.Plumb, n.poolLock, err = openAuto(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	n.Pool = n.Plumb.Pool()
	reg.SetGate(n.Plumb.Gate())
	reg.OnRemove(n.res.Forget)
	// The host's own addresses and every sandbox link are reached only by
	// a rule naming exactly that address (egress.Special).
	egress.SetHostLocal(hostLocal(n.Pool))
	n.watchHostLocal(opts.Logger)
	n.serve(opts.Logger, "resolver (udp)", func() error { return n.res.ServeUDP(n.udp) })
	n.serve(opts.Logger, "resolver (tcp)", func() error { return n.res.ServeTCP(n.tcp) })
	n.serve(opts.Logger, "proxy", func() error { return n.proxy.Serve(n.pln) })
	return n, nil
}

func (n *Network) serve(log *slog.Logger, what string, f func() error) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := f(); err != nil && !errors.Is(err, net.ErrClosed) {
			log.Error("network: "+what+" stopped", "err", err.Error())
		}
	}()
}

// listenPair listens on one port number for both UDP and TCP (the
// plumbing redirects DNS over either to one port).
func listenPair() (net.PacketConn, net.Listener, error) {
	var last error
	for range 16 {
		ln, err := netplumb.ListenTCP("0.0.0.0:0")
		if err != nil {
			return nil, nil, err
		}
		pc, err := netplumb.ListenUDP("0.0.0.0:" + strconv.Itoa(int(port(ln.Addr()))))
		if err == nil {
			return pc, ln, nil
		}
		last = err
		_ = ln.Close()
	}
	return nil, nil, fmt.Errorf("no port free for both udp and tcp: %w", last)
}

// hostLocalEvery is how often the host's addresses are read again when no
// change was announced (a missed netlink message, a full socket buffer).
const hostLocalEvery = 30 * time.Second

// watchHostLocal keeps the policy's host-local addresses current: read
// again when the kernel announces an address of the host's outside the
// sandboxes' pool (their gateways are in it), and every hostLocalEvery.
func (n *Network) watchHostLocal(log *slog.Logger) {
	n.stopWatch = make(chan struct{})
	updates := make(chan netlink.AddrUpdate, 64)
	err := netlink.AddrSubscribeWithOptions(updates, n.stopWatch, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case <-n.stopWatch: // the socket closing under it
			default:
				log.Warn("network: watching the host's addresses", "err", err.Error())
			}
		},
	})
	if err != nil {
		log.Warn("network: cannot watch the host's addresses; reading them every "+hostLocalEvery.String(), "err", err.Error())
		updates = nil
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		tick := time.NewTicker(hostLocalEvery)
		defer tick.Stop()
		for {
			select {
			case <-n.stopWatch:
				return
			case <-tick.C:
			case u, ok := <-updates:
				if !ok {
					updates = nil // closed on error: the ticker goes on
					continue
				}
				if a, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok && n.Pool.Contains(a.Unmap()) {
					continue
				}
			}
			egress.SetHostLocal(hostLocal(n.Pool))
		}
	}()
}

// hostLocal is the host's addresses, as read now, and the sandboxes'
// pool.
func hostLocal(pool netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	if pool.IsValid() {
		out = append(out, pool)
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Addr().Unmap().BitLen()))
		}
	}
	return out
}

func port(a net.Addr) uint16 {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Port()
	}
	return 0
}

// refusedAt logs a connection the gate refused in its sandbox's log, with
// the reason the policy gives.
func (n *Network) refusedAt(src netip.Addr, dst netip.AddrPort) {
	n.refused.Add(1)
	sb := n.Registry.Lookup(src)
	if sb == nil {
		return
	}
	reason := "not opened by this sandbox's resolver"
	if v := sb.Decide(dst, "", ""); !v.Allow {
		reason = v.Reason
	}
	sb.Record(egress.Record{Time: time.Now(), Kind: "tcp", Addr: dst.Addr().String(), Port: dst.Port(),
		Verdict: "deny", Reason: "refused at connect: " + reason})
}

// Register adds the network's counters to reg. No namespace label: only a
// key for every namespace sees them.
func (n *Network) Register(reg *metrics.Registry) {
	reg.CounterFunc("warren_egress_dns_queries_total", "DNS queries of sandboxes by outcome (allowed, denied: not allowed or rebinding, refused: a type or rate refused, servfail, malformed, unknown: not from a sandbox).", []string{"outcome"},
		func(emit func(float64, ...string)) {
			st := n.res.Stats()
			emit(float64(st.Allowed), "allowed")
			emit(float64(st.Denied), "denied")
			emit(float64(st.Refused+st.RateLimited), "refused")
			emit(float64(st.ServFail), "servfail")
			emit(float64(st.Malformed), "malformed")
			emit(float64(st.Unknown), "unknown")
		})
	reg.CounterFunc("warren_egress_connections_total", "TCP connections of sandboxes by verdict (unknown: not from a sandbox).", []string{"verdict"},
		func(emit func(float64, ...string)) {
			st := n.proxy.Stats()
			emit(float64(st.Allowed), "allowed")
			emit(float64(st.Denied+n.refused.Load()), "denied")
			emit(float64(st.Unknown), "unknown")
		})
	reg.CounterFunc("warren_egress_bytes_total", "Bytes carried for sandboxes' allowed connections, by direction (out: sandbox to remote).", []string{"direction"},
		func(emit func(float64, ...string)) {
			st := n.proxy.Stats()
			emit(float64(st.BytesOut), "out")
			emit(float64(st.BytesIn), "in")
		})
	reg.GaugeFunc("warren_egress_connections_active", "Sandboxes' TCP connections the proxy carries now.", nil,
		func(emit func(float64, ...string)) { emit(float64(n.proxy.Stats().Active)) })
}

// Close stops the resolver and the proxy (ending the connections it
// carries). The plumbing stays: sandboxes outlive the server, and the
// next one on the same directories takes it over (netplumb.Open).
func (n *Network) Close() error { return n.close(false) }

// CloseAndRemove is Close for a server that leaves no sandbox running: the
// plumbing's table and links go too.
func (n *Network) CloseAndRemove() error { return n.close(true) }

func (n *Network) close(remove bool) error {
	var errs []error
	if n.res != nil {
		errs = append(errs, n.res.Close())
	}
	if n.proxy != nil {
		errs = append(errs, n.proxy.Close())
	}
	n.closeListeners()
	if n.stopWatch != nil {
		close(n.stopWatch)
	}
	n.wg.Wait()
	switch {
	case n.Plumb == nil:
	case remove:
		errs = append(errs, n.Plumb.Remove())
	default:
		errs = append(errs, n.Plumb.Close())
	}
	if n.poolLock != nil {
		_ = n.poolLock.Close()
	}
	return errors.Join(errs...)
}

func (n *Network) closeListeners() {
	if n.udp != nil {
		_ = n.udp.Close()
	}
	if n.tcp != nil {
		_ = n.tcp.Close()
	}
	if n.pln != nil {
		_ = n.pln.Close()
	}
}
