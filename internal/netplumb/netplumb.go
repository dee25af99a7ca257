// Package netplumb owns the host side of a sandbox's network: a veth pair
// into the sandbox's network namespace, an address from a pool, and the
// nftables table that steers everything the sandbox sends: DNS to the
// resolver's port, every other TCP connection to the transparent proxy's
// port (both on the sandbox's gateway address), and nothing else anywhere
// (rejected, so that a denial is fast). It decides no policy: the resolver
// and the proxy do, knowing the sandbox by its source address, which the
// table's anti-spoof check makes trustworthy. docs/network.md has the
// design and the measurements behind it.
package netplumb

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Config is one server instance's plumbing.
type Config struct {
	// Prefix names the nftables table and, hashed, the veths: one per server
	// instance (e.g. "warren-1a2b3c4d", the cgroup prefix).
	Prefix string
	// Pool is where the sandboxes' /30s come from (.1 the host side and
	// gateway, .2 the sandbox). Default DefaultPool.
	Pool netip.Prefix
	// ResolverPort and ProxyPort are the host ports, on each sandbox's
	// gateway address, that DNS (UDP and TCP port 53) and every other TCP
	// connection are redirected to. The services must listen on the
	// wildcard address (or on each gateway).
	ResolverPort, ProxyPort uint16
	// MaxConns bounds each sandbox's flows tracked at once (conntrack
	// entries, a host-wide table); a new one beyond it is rejected.
	// Default DefaultMaxConns.
	MaxConns int
	// Refused, when set, is told of new TCP connections the gate refused
	// (at most refusedRate a second per sandbox), for the sandbox's log.
	// It runs on one goroutine: it must not block.
	Refused func(src netip.Addr, dst netip.AddrPort)
}

// DefaultMaxConns is the default of Config.MaxConns: 64 sandboxes at their
// bound fill the kernel's default table on a machine with 4 GB or more.
const DefaultMaxConns = 4096

// DefaultPool is the default address pool: 16384 sandboxes.
var DefaultPool = netip.MustParsePrefix("10.201.0.0/16")

// Link is a sandbox's side of the plumbing, kept with the sandbox so that a
// restarted server can Restore it.
type Link struct {
	HostIf  string     `json:"host_if"` // the host side of the veth
	Gateway netip.Addr `json:"gateway"` // the host side's address, the sandbox's default route
	Addr    netip.Addr `json:"addr"`    // eth0's address in the sandbox
}

// Bounds: a veth's alias, "<prefix> <id>", must fit the kernel's 255 bytes.
const (
	maxPrefix = 64
	maxID     = 128
)

func validID(id string) error {
	if id == "" || len(id) > maxID || strings.ContainsRune(id, 0) {
		return fmt.Errorf("netplumb: sandbox id %q must be 1..%d bytes without NUL", id, maxID)
	}
	return nil
}

// Validate reports every problem of c at once (after defaults).
func (c *Config) Validate() error {
	var errs []error
	if c.Prefix == "" || len(c.Prefix) > maxPrefix || strings.ContainsAny(c.Prefix, " \x00") {
		errs = append(errs, fmt.Errorf("netplumb: prefix %q must be 1..%d bytes without spaces", c.Prefix, maxPrefix))
	}
	if !c.Pool.IsValid() || !c.Pool.Addr().Is4() || c.Pool.Bits() > 30 || c.Pool.Bits() < 8 || c.Pool.Masked() != c.Pool {
		errs = append(errs, fmt.Errorf("netplumb: pool %v must be an IPv4 network from /8 to /30", c.Pool))
	}
	if c.MaxConns < 1 || c.MaxConns > 1<<20 {
		errs = append(errs, fmt.Errorf("netplumb: max conns %d must be 1..%d", c.MaxConns, 1<<20))
	}
	if c.ResolverPort == 0 || c.ProxyPort == 0 || c.ResolverPort == c.ProxyPort {
		errs = append(errs, errors.New("netplumb: resolver and proxy ports must be distinct and non-zero"))
	}
	return errors.Join(errs...)
}
