package boot

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/fdpass"
)

// Connections by descriptor (Config.ConnsByFD): the host makes a socket
// pair per connection and sends one end on the agent's control socket,
// one byte carrying one descriptor. The control socket is a connected
// unix stream socket the host passed at start; when the host's end
// closes, the agent's listener ends, and with it the agent.

// SendConn sends conn, one end of a connected unix socket pair, to the
// agent on ctl. The caller keeps its own copy of conn and closes it.
func SendConn(ctl *os.File, conn *os.File) error {
	rc, err := ctl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), []byte{'c'}, unix.UnixRights(int(conn.Fd())), nil, 0)
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return err
	}
	return serr
}

// ConnListener returns the agent's listener for connections the host
// sends on ctl (SendConn). It owns ctl.
func ConnListener(ctl *os.File) (net.Listener, error) {
	rc, err := ctl.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &connListener{ctl: ctl, rc: rc}, nil
}

type connListener struct {
	ctl       *os.File
	rc        syscall.RawConn
	closeOnce sync.Once
}

// Accept returns the next connection the host sent. A message without
// exactly one descriptor is dropped (its descriptors closed); the host's
// end closing ends the listener (net.ErrClosed).
func (l *connListener) Accept() (net.Conn, error) {
	for {
		p := make([]byte, 1)
		oob := make([]byte, unix.CmsgSpace(4*4)) // room to see a few too many
		var n, oobn, flags int
		var rerr error
		if err := l.rc.Read(func(fd uintptr) bool {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), p, oob, unix.MSG_CMSG_CLOEXEC)
			return !errors.Is(rerr, unix.EAGAIN)
		}); err != nil {
			return nil, err
		}
		if rerr != nil {
			return nil, fmt.Errorf("receive a connection: %w", rerr)
		}
		fds, err := fdpass.Received(oob[:oobn])
		if err != nil {
			continue
		}
		if n == 0 && len(fds) == 0 {
			return nil, net.ErrClosed
		}
		if len(fds) != 1 || flags&unix.MSG_CTRUNC != 0 {
			fdpass.Close(fds)
			continue
		}
		f := os.NewFile(uintptr(fds[0]), "conn")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			continue
		}
		return c, nil
	}
}

func (l *connListener) Close() error {
	var err error
	l.closeOnce.Do(func() { err = l.ctl.Close() })
	return err
}

func (l *connListener) Addr() net.Addr { return &net.UnixAddr{Name: "host", Net: "unix"} }
