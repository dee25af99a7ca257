//go:build !linux

package tproxy

import (
	"errors"
	"net"
	"net/netip"
)

func originalDst(*net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("original destination: Linux only")
}

func idleFor(*net.TCPConn) (uint32, bool) { return 0, false }
