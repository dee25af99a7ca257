package netplumb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The gate's refusals reach the Host through an NFLOG group: the table's
// log rule copies the head of each refused SYN (rate-limited per sandbox)
// to the group, which this Host's socket is bound to. Groups are host-wide,
// so an instance takes the first free one of a few derived from its
// prefix.

// NFLOG's netlink constants (linux/netfilter/nfnetlink_log.h), which
// x/sys/unix does not carry.
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd     = 1
	nfulaCfgMode    = 2
	nfulaCfgQthresh = 5

	nfulnlCfgCmdBind = 1

	nfulnlCopyPacket = 2

	nfulaPayload = 9
)

// logSnap is how much of a refused packet is copied: an IPv4 header with
// options (60 bytes at most) and the TCP ports.
const logSnap = 64

// logGroups is how many candidate groups an instance tries.
const logGroups = 32

// nflog is a bound NFLOG group.
type nflog struct {
	c     *netlink.Conn
	group uint16
}

func nflogMsg(msgType uint16, group uint16, attrs []netlink.Attribute) (netlink.Message, error) {
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return netlink.Message{}, err
	}
	hdr := []byte{unix.AF_UNSPEC, 0 /* NFNETLINK_V0 */, 0, 0}
	binary.BigEndian.PutUint16(hdr[2:], group)
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | msgType),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: append(hdr, b...),
	}, nil
}

// openNflog binds the first free group of prefix's candidates.
func openNflog(prefix string) (*nflog, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("nflog: %w", err)
	}
	// Group 0 is the kernel's default for log rules without one; stay
	// clear of it and of the low groups other tools take.
	f := fnv.New32a()
	_, _ = f.Write([]byte(prefix))
	base := 4096 + f.Sum32()%(60000-logGroups)
	for i := range uint32(logGroups) {
		g := uint16(base + i) //nolint:gosec // base+i < 64096
		m, err := nflogMsg(nfulnlMsgConfig, g, []netlink.Attribute{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}})
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		if _, err := c.Execute(m); err != nil {
			if errors.Is(err, unix.EBUSY) {
				continue
			}
			_ = c.Close()
			return nil, fmt.Errorf("nflog: bind group %d: %w", g, err)
		}
		mode := make([]byte, 6)
		binary.BigEndian.PutUint32(mode, logSnap)
		mode[4] = nfulnlCopyPacket
		// One packet per message, sent at once: the kernel's default
		// holds up to 100 for up to a second, and a sandbox's log must
		// have the record by the time its command has returned.
		m, err = nflogMsg(nfulnlMsgConfig, g, []netlink.Attribute{
			{Type: nfulaCfgMode, Data: mode},
			{Type: nfulaCfgQthresh, Data: binary.BigEndian.AppendUint32(nil, 1)},
		})
		if err == nil {
			_, err = c.Execute(m)
		}
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("nflog: group %d copy mode: %w", g, err)
		}
		return &nflog{c: c, group: g}, nil
	}
	_ = c.Close()
	return nil, fmt.Errorf("nflog: groups %d..%d are all taken", base, base+logGroups-1)
}

// serve hands every logged packet's addresses to f until the socket is
// closed. A message it cannot read is skipped.
func (l *nflog) serve(f func(src netip.Addr, dst netip.AddrPort)) {
	for {
		msgs, err := l.c.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				continue // the kernel dropped some: the log is best effort
			}
			return // closed
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
				continue
			}
			if src, dst, ok := packetAddrs(m.Data[4:]); ok {
				f(src, dst)
			}
		}
	}
}

// packetAddrs finds an NFLOG message's payload and reads an IPv4/TCP
// packet's source and destination from it.
func packetAddrs(attrs []byte) (netip.Addr, netip.AddrPort, bool) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return netip.Addr{}, netip.AddrPort{}, false
	}
	for ad.Next() {
		if ad.Type() != nfulaPayload {
			continue
		}
		return tcpAddrs(ad.Bytes())
	}
	return netip.Addr{}, netip.AddrPort{}, false
}

func tcpAddrs(p []byte) (netip.Addr, netip.AddrPort, bool) {
	if len(p) < 20 || p[0]>>4 != 4 || p[9] != unix.IPPROTO_TCP {
		return netip.Addr{}, netip.AddrPort{}, false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || len(p) < ihl+4 {
		return netip.Addr{}, netip.AddrPort{}, false
	}
	src := netip.AddrFrom4([4]byte(p[12:16]))
	dst := netip.AddrFrom4([4]byte(p[16:20]))
	port := binary.BigEndian.Uint16(p[ihl+2:])
	return src, netip.AddrPortFrom(dst, port), true
}

// close closes the socket, which unbinds the group (serve returns).
func (l *nflog) close() { _ = l.c.Close() }
