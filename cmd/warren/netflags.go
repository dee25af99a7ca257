package main

import (
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"

	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/network"
)

// netFlags choose the sandboxes' network (docs/network.md).
type netFlags struct {
	mode      string // auto, on, off
	upstreams string // comma-separated ADDR[:PORT]
	pool      string // CIDR
	publish   string // the host address sandboxes' ports are published on
	// upstreamCA is a PEM file of CAs the egress proxy trusts besides the
	// host's, verifying a destination it intercepts for secrets.
	upstreamCA string
}

func (n *netFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.mode, "network", envOr("WARREN_NETWORK", "auto"), "sandboxes' network (env WARREN_NETWORK): on = a link of their own whose traffic\nonly leaves as their egress rules allow (deny-all by default); off = loopback only;\nauto = on where the host can (nftables, veth: see warren doctor), else off with a warning")
	n.registerUpstream(fs)
	fs.StringVar(&n.publish, "publish-address", envOr("WARREN_PUBLISH_ADDRESS", "127.0.0.1"), "host address sandboxes' published ports listen on (env WARREN_PUBLISH_ADDRESS);\n0.0.0.0 publishes them on every address of the host, to whoever can reach it")
	fs.StringVar(&n.upstreamCA, "egress-upstream-ca", envOr("WARREN_EGRESS_UPSTREAM_CA", ""), "PEM file of CA certificates the egress proxy trusts besides the host's when it verifies\na destination it intercepts for proxy-mode secrets (env WARREN_EGRESS_UPSTREAM_CA)")
	fs.StringVar(&n.pool, "net-pool", envOr("WARREN_NET_POOL", "auto"), "IPv4 range sandboxes' links are addressed from, a /30 each (env WARREN_NET_POOL);\nauto = a /20 of 10.201.0.0/16 no other server on this host has (1024 sandboxes)")
}

// registerUpstream registers --dns-upstream alone (warren run's only
// network setting besides its rules).
func (n *netFlags) registerUpstream(fs *flag.FlagSet) {
	fs.StringVar(&n.upstreams, "dns-upstream", envOr("WARREN_DNS_UPSTREAM", ""), "resolvers that sandboxes' allowed names are looked up with, comma-separated ADDR[:PORT]\n(env WARREN_DNS_UPSTREAM; default: the host's /etc/resolv.conf)")
}

// start starts the host side of sandbox networking for the backend of
// runDir, or returns nil when it is off (or unavailable under auto).
func (n *netFlags) start(runDir string, log *slog.Logger) (*network.Network, error) {
	switch n.mode {
	case "off":
		return nil, nil
	case "on", "auto":
	default:
		return nil, fmt.Errorf("--network %q: want auto, on or off", n.mode)
	}
	var pool netip.Prefix
	if n.pool != "auto" {
		p, err := netip.ParsePrefix(n.pool)
		if err != nil || !p.Addr().Is4() || p.Bits() > 28 {
			return nil, fmt.Errorf("--net-pool %q: want auto, or an IPv4 range like 10.202.0.0/20, at most /28", n.pool)
		}
		pool = p.Masked()
	}
	ups, err := n.upstreamAddrs()
	if err != nil {
		return nil, err
	}
	roots, err := n.upstreamRoots()
	if err != nil {
		return nil, err
	}
	sweepRuns(runDir, log)
	nw, err := network.Start(network.Options{Prefix: native.InstancePrefix(runDir), Pool: pool, Upstreams: ups, UpstreamRoots: roots, Logger: log})
	if err != nil {
		if n.mode == "on" {
			return nil, fmt.Errorf("%w (--network on; see warren doctor)", err)
		}
		log.Warn("sandboxes get loopback only: their network is unavailable on this host (see warren doctor; --network off silences this)", "err", err.Error())
		return nil, nil
	}
	return nw, nil
}

// upstreamAddrs parses --dns-upstream.
func (n *netFlags) upstreamAddrs() ([]netip.AddrPort, error) {
	var ups []netip.AddrPort
	for _, u := range strings.Split(n.upstreams, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		ap, err := netip.ParseAddrPort(u)
		if err != nil {
			a, aerr := netip.ParseAddr(u)
			if aerr != nil {
				return nil, fmt.Errorf("--dns-upstream %q: want ADDR or ADDR:PORT (IPv6 as [ADDR]:PORT)", u)
			}
			ap = netip.AddrPortFrom(a, 53)
		}
		ups = append(ups, ap)
	}
	return ups, nil
}

// sweepRuns removes the network plumbing (table, links) that `warren run`s
// of runDir killed with SIGKILL left (network.SweepOwned).
func sweepRuns(runDir string, log *slog.Logger) {
	removed, err := network.SweepOwned(native.InstancePrefix(runDir))
	for _, p := range removed {
		log.Info("removed the network of a warren run that is gone", "table", p)
	}
	if err != nil {
		log.Warn("could not remove the network of a warren run that is gone", "err", err.Error())
	}
}

// publishAddress is --publish-address.
func (n *netFlags) publishAddress() (netip.Addr, error) {
	a, err := netip.ParseAddr(n.publish)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("--publish-address %q: want an IP address (127.0.0.1, 0.0.0.0, or one of this host's)", n.publish)
	}
	return a.Unmap(), nil
}

// upstreamRoots is the host's roots plus --egress-upstream-ca's; nil
// (the host's, read by crypto/tls) without the flag.
func (n *netFlags) upstreamRoots() (*x509.CertPool, error) {
	if n.upstreamCA == "" {
		return nil, nil
	}
	b, err := os.ReadFile(n.upstreamCA)
	if err != nil {
		return nil, fmt.Errorf("--egress-upstream-ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--egress-upstream-ca %s: no PEM certificate in it", n.upstreamCA)
	}
	return pool, nil
}
