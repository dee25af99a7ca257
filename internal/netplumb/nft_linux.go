package netplumb

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The table (family inet, named Config.Prefix) holds every rule; it matches
// a sandbox's interface by the name prefix all of this Host's veths share,
// so an interface of this prefix is policed from the moment it exists, even
// before its anti-spoof element is in (it drops until then: fail closed).
// One inet table instead of ip+ip6 ones: one transaction, one place, and
// IPv6 is dropped by the same chain that checks IPv4 sources.
//
//	prerouting (filter, -150): from ours: ip6 drop; iifname . ip saddr not in @spoof drop;
//	                           the gate: a new TCP flow not to port 53 nor to a local
//	                           address, from a saddr not in @bypass, whose saddr . daddr
//	                           is not in @pins: log (rate-limited) and reject with reset
//	prerouting (nat, -100):    from ours: udp/tcp dport 53 redirect to :ResolverPort,
//	                           other tcp redirect to :ProxyPort
//	prerouting (filter, 0):    from ours: ct established,related accept; a new flow
//	                           beyond MaxConns of its interface's: reject; ct status
//	                           dnat accept (redirected); to a local address, udp/tcp
//	                           dport ResolverPort accept; reject the rest
//	input (filter, 0):         from ours: ct established,related accept; tcp dport
//	                           ProxyPort accept; udp/tcp dport ResolverPort accept;
//	                           tcp reject with reset; the rest reject admin-prohibited;
//	                           from elsewhere: to ProxyPort or ResolverPort of a
//	                           transparent socket (Listen's) drop
//	forward (filter, 0):       from or to ours: reject (nothing is routed)
const (
	spoofSet = "spoof"
	connSet  = "conns"
)

// Registers: NFT_REG_1 is 16 bytes, the same storage as NFT_REG32_00..03,
// so a concatenation of an interface name (16 bytes) and an IPv4 address
// loads the name into reg 1 and the address into NFT_REG32_04.
const (
	reg1    = 1
	reg3204 = unix.NFT_REG32_04
)

const ifNameSize = unix.IFNAMSIZ

func (h *Host) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: h.cfg.Prefix}
}

func (h *Host) spoof() *nftables.Set {
	return &nftables.Set{
		Table:         h.table(),
		Name:          spoofSet,
		KeyType:       nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr),
		Concatenation: true,
	}
}

func (h *Host) conns() *nftables.Set {
	return &nftables.Set{Table: h.table(), Name: connSet, KeyType: nftables.TypeIFName, Dynamic: true, Size: 65535}
}

// spoofKey is the set key for (interface name, address).
func spoofKey(ifname string, addr netip.Addr) []byte {
	k := make([]byte, ifNameSize+4)
	copy(k, ifname)
	a := addr.As4()
	copy(k[ifNameSize:], a[:])
	return k
}

// writeTable queues the whole table, replacing an existing one of the same
// name in the same transaction: add (so that the delete cannot fail), delete,
// add. The kernel applies the batch atomically, so there is no moment without
// rules; the anti-spoof elements are gone afterwards (Restore re-adds them),
// and until then the sandboxes' packets are dropped.
func (h *Host) writeTable(c *nftables.Conn) error {
	t := h.table()
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	set := h.spoof()
	if err := c.AddSet(set, nil); err != nil {
		return err
	}
	from := ifMatch(unix.NFT_META_IIFNAME, h.vethPrefix)
	to := ifMatch(unix.NFT_META_OIFNAME, h.vethPrefix)
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}

	pre := c.AddChain(&nftables.Chain{Name: "pre", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle})
	rule(c, pre, from, nfproto(unix.NFPROTO_IPV6), drop)
	rule(c, pre, from, nfproto(unix.NFPROTO_IPV4), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Payload{DestRegister: reg3204, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID, Invert: true},
	}, drop)
	if err := h.writeGate(c, pre, from); err != nil {
		return err
	}

	nat := c.AddChain(&nftables.Chain{Name: "nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	rule(c, nat, from, l4(unix.IPPROTO_UDP), dport(53), redirect(h.cfg.ResolverPort))
	rule(c, nat, from, l4(unix.IPPROTO_TCP), dport(53), redirect(h.cfg.ResolverPort))
	rule(c, nat, from, l4(unix.IPPROTO_TCP), redirect(h.cfg.ProxyPort))

	// After NAT: what was not redirected to the host is rejected here, in
	// prerouting, because with ip_forward off (as it may be) the kernel
	// would drop it before the forward hook and answer with a rate-limited
	// ICMP at best: the sandbox would wait for a timeout.
	gate := c.AddChain(&nftables.Chain{Name: "gate", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter})
	rule(c, gate, from, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
	// Every flow of a sandbox is a conntrack entry (the redirects need
	// them), and the table of entries is the host's: bound each sandbox's
	// share, counted per interface, so that one cannot fill it.
	conns := h.conns()
	if err := c.AddSet(conns, nil); err != nil {
		return err
	}
	rule(c, gate, from, ctState(expr.CtStateBitNEW), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Dynset{SrcRegKey: reg1, SetName: conns.Name, SetID: conns.ID, Operation: unix.NFT_DYNSET_OP_ADD,
			Exprs: []expr.Any{&expr.Connlimit{Count: uint32(h.cfg.MaxConns), Flags: expr.NFT_CONNLIMIT_F_INV}}}, //nolint:gosec // Validate bounds MaxConns to 1..2^20
		&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED},
	})
	rule(c, gate, from, ctStatus(ipsDstNAT), accept)
	// A query straight to the resolver's port on the host (or to port 53
	// of the gateway when that is the resolver's port) is not rewritten,
	// so it carries no dnat status.
	rule(c, gate, from, localDst(), l4(unix.IPPROTO_UDP), dport(h.cfg.ResolverPort), accept)
	rule(c, gate, from, localDst(), l4(unix.IPPROTO_TCP), dport(h.cfg.ResolverPort), accept)
	rejectAll(c, gate, from)

	in := c.AddChain(&nftables.Chain{Name: "in", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	rule(c, in, from, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
	rule(c, in, from, l4(unix.IPPROTO_TCP), dport(h.cfg.ProxyPort), accept)
	rule(c, in, from, l4(unix.IPPROTO_TCP), dport(h.cfg.ResolverPort), accept)
	rule(c, in, from, l4(unix.IPPROTO_UDP), dport(h.cfg.ResolverPort), accept)
	rejectAll(c, in, from)
	// The resolver and the proxy listen on every address (a REDIRECT
	// delivers to the gateway's); from anywhere but a sandbox they are
	// not there. The drop names the port AND a transparent socket (what
	// Listen makes): the table outlives its listeners (a server stopped
	// while sandboxes run, or killed), and their ports go back to the
	// kernel's ephemeral range; whoever binds one next must not find its
	// connections dropped by a table that is not about it.
	notFrom := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte(h.vethPrefix)},
	}
	rule(c, in, notFrom, l4(unix.IPPROTO_TCP), dport(h.cfg.ProxyPort), ours(), drop)
	rule(c, in, notFrom, l4(unix.IPPROTO_TCP), dport(h.cfg.ResolverPort), ours(), drop)
	rule(c, in, notFrom, l4(unix.IPPROTO_UDP), dport(h.cfg.ResolverPort), ours(), drop)

	fwd := c.AddChain(&nftables.Chain{Name: "fwd", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	rejectAll(c, fwd, from)
	rejectAll(c, fwd, to)
	return nil
}

// writeGate queues the gate's sets and rules (gate_linux.go) into pre.
func (h *Host) writeGate(c *nftables.Conn, pre *nftables.Chain, from []expr.Any) error {
	pins, bypass := h.pins(), h.bypass()
	if err := c.AddSet(pins, nil); err != nil {
		return err
	}
	if err := c.AddSet(bypass, nil); err != nil {
		return err
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	newTCP := append(append(append([]expr.Any{}, from...), nfproto(unix.NFPROTO_IPV4)...), l4(unix.IPPROTO_TCP)...)
	newTCP = append(newTCP, ctState(expr.CtStateBitNEW)...)
	saddr := &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}
	rule(c, pre, newTCP, dport(53), accept)
	rule(c, pre, newTCP, localDst(), accept)
	rule(c, pre, newTCP, saddr, &expr.Lookup{SourceRegister: reg1, SetName: bypass.Name, SetID: bypass.ID}, accept)
	rule(c, pre, newTCP, saddr,
		&expr.Payload{DestRegister: unix.NFT_REG32_01, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: reg1, SetName: pins.Name, SetID: pins.ID}, accept)
	if h.log != nil {
		rate := h.refusals()
		if err := c.AddSet(rate, nil); err != nil {
			return err
		}
		rule(c, pre, newTCP, saddr,
			&expr.Dynset{SrcRegKey: reg1, SetName: rate.Name, SetID: rate.ID, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: time.Minute,
				Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: refusedRate, Unit: expr.LimitTimeSecond, Burst: refusedBurst}}},
			&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_SNAPLEN | 1<<unix.NFTA_LOG_QTHRESHOLD,
				Group: h.log.group, Snaplen: logSnap, QThreshold: 1})
	}
	rule(c, pre, newTCP, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	return nil
}

// rejectAll: a TCP reset for TCP, ICMP admin-prohibited for the rest, so a
// denial inside the sandbox is an immediate error, never a timeout.
func rejectAll(c *nftables.Conn, ch *nftables.Chain, match []expr.Any) {
	rule(c, ch, match, l4(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	rule(c, ch, match, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})
}

func rule(c *nftables.Conn, ch *nftables.Chain, parts ...any) {
	var exprs []expr.Any
	for _, p := range parts {
		switch p := p.(type) {
		case []expr.Any:
			exprs = append(exprs, p...)
		case expr.Any:
			exprs = append(exprs, p)
		default:
			panic(fmt.Sprintf("netplumb: rule part %T", p))
		}
	}
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: exprs})
}

// ifMatch matches the interface name's prefix: cmp compares only len(data)
// bytes of the 16 loaded.
func ifMatch(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte(prefix)},
	}
}

// ours matches a packet whose receiving socket is transparent
// (IP_TRANSPARENT, set by Listen); a packet no socket takes does not match.
func ours() []expr.Any {
	return []expr.Any{
		&expr.Socket{Key: expr.SocketKeyTransparent, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{1}},
	}
}

// localDst matches a destination address of this host (fib daddr type local).
func localDst() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}
}

func l4(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, p)},
	}
}

func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.Redir{RegisterProtoMin: reg1},
	}
}

// ipsDstNAT is the conntrack status bit of a destination-NATed connection
// (IPS_DST_NAT): a REDIRECT sets it.
const ipsDstNAT = 1 << 5

func ctState(bits uint32) []expr.Any { return ctBits(expr.CtKeySTATE, bits) }

func ctStatus(bits uint32) []expr.Any { return ctBits(expr.CtKeySTATUS, bits) }

func ctBits(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: key, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}
