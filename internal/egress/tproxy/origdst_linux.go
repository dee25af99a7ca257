package tproxy

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// originalDst is the address a REDIRECTed connection was sent to, as
// conntrack remembers it: SO_ORIGINAL_DST for IPv4, IP6T_SO_ORIGINAL_DST
// (the same number, at the IPv6 level) for IPv6.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	v6 := local.Addr().Is6() && !local.Addr().Is4In6()
	var buf [unix.SizeofSockaddrInet6]byte
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		level, size := unix.SOL_IP, uint32(unix.SizeofSockaddrInet4)
		if v6 {
			level, size = unix.SOL_IPV6, uint32(unix.SizeofSockaddrInet6)
		}
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0) // #nosec G103 -- getsockopt fills buf, bounded by size
		if errno != 0 {
			serr = errno
			return
		}
		// sockaddr_in / sockaddr_in6: family (host order), port (network
		// order), then the address (at 4 for v4, 8 for v6).
		port := binary.BigEndian.Uint16(buf[2:4])
		if v6 {
			dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])), port)
		} else {
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	return dst, nil
}

// idleFor is how long the kernel has seen no data in either direction on
// c (TCP_INFO's last_data_recv and last_data_sent), so the proxy can tell
// an idle connection from a busy one without looking at its bytes, which
// splice(2) moves without the proxy seeing them.
func idleFor(c *net.TCPConn) (ms uint32, ok bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	_ = raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			ms, ok = min(info.Last_data_recv, info.Last_data_sent), true
		}
	})
	return ms, ok
}
