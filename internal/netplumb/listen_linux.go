package netplumb

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// The resolver's and the proxy's sockets are transparent (IP_TRANSPARENT):
// the table's drops of what does not come from a sandbox name both the
// port and a transparent socket, so that they never reach another
// process's socket bound to the same port number after these close
// (nft_linux.go). Transparency changes nothing else here: no TPROXY rule
// delivers to these sockets, and they bind no foreign address. Setting it
// needs CAP_NET_ADMIN, as the table does.
var transparent = net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
	}); err != nil {
		return err
	}
	return serr
}}

// ListenTCP opens a TCP listener for the proxy or the resolver
// ("0.0.0.0:port", port 0 for any).
func ListenTCP(addr string) (net.Listener, error) {
	return transparent.Listen(context.Background(), "tcp4", addr)
}

// ListenUDP opens the resolver's UDP socket.
func ListenUDP(addr string) (net.PacketConn, error) {
	return transparent.ListenPacket(context.Background(), "udp4", addr)
}
