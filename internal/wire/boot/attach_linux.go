package boot

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/fdpass"
)

// Reattaching (Config.ConnsByFD): a checkpoint of a gVisor sandbox must
// find no host descriptor in it (the restored sandbox would not have them),
// so before one the host asks the agent to detach (AttachListener.Detach
// closes the control socket and every connection that came through it).
// The agent then waits for a new control socket on AttachSocket, a unix
// socket inside the sandbox: the host runs `warren-agent attach` in the
// sandbox (runsc exec, which can pass host descriptors into a running or
// restored sandbox where runsc restore cannot), with the new socket at
// FDAttach; it sends the socket to the agent (Attach) and exits.

// AttachSocket is the abstract unix socket the agent takes new control
// sockets on. Only a root peer is heard (sandbox root can do all the agent
// does anyway), and only while the agent is detached.
const AttachSocket = "@warren-agent-attach"

// FDAttach is the descriptor `warren-agent attach` finds the new control
// socket at.
const FDAttach = 3

// AttachListener serves the connections the host sends on its current
// control socket, which Detach drops and an attach replaces.
type AttachListener struct {
	mu      sync.Mutex
	cur     net.Listener          // nil while detached
	ready   chan struct{}         // closed when cur is set
	conns   map[net.Conn]struct{} // accepted through cur, closed by Detach
	first   net.Conn
	closing bool
	attachL net.Listener // ServeAttach's, closed by Close
}

// NewAttachListener returns a listener for the connections the host sends
// on ctl, handing out first (the connection made at start, nil for none)
// before them. It owns ctl and first.
func NewAttachListener(ctl *os.File, first net.Conn) (*AttachListener, error) {
	cl, err := ConnListener(ctl)
	if err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	close(ready)
	return &AttachListener{cur: cl, ready: ready, conns: map[net.Conn]struct{}{}, first: first}, nil
}

// Accept returns the next connection. The host's end of the control socket
// closing ends the listener, as ConnListener's does, unless Detach closed
// it: then Accept waits for the next attach.
func (l *AttachListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.closing {
			l.mu.Unlock()
			return nil, net.ErrClosed
		}
		cur, ready, first := l.cur, l.ready, l.first
		l.first = nil
		l.mu.Unlock()
		if first != nil {
			return l.track(cur, first), nil
		}
		if cur == nil {
			<-ready
			continue
		}
		c, err := cur.Accept()
		l.mu.Lock()
		detached := l.cur != cur
		l.mu.Unlock()
		if err != nil {
			if detached {
				continue
			}
			return nil, err
		}
		if c = l.track(cur, c); c == nil {
			continue // detached meanwhile: track closed it
		}
		return c, nil
	}
}

// track records c as a connection of cur, to be closed by Detach; nil
// when cur is no longer the current one (c is closed).
func (l *AttachListener) track(cur net.Listener, c net.Conn) net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != cur || cur == nil {
		_ = c.Close()
		return nil
	}
	tc := &trackedConn{Conn: c, l: l}
	l.conns[tc] = struct{}{}
	return tc
}

type trackedConn struct {
	net.Conn
	l    *AttachListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// Detach closes the control socket and every connection accepted through
// it; Accept then waits for an attach. Detaching a detached listener does
// nothing.
func (l *AttachListener) Detach() {
	l.mu.Lock()
	cur, conns := l.cur, l.conns
	if cur == nil {
		l.mu.Unlock()
		return
	}
	l.cur, l.conns, l.ready = nil, map[net.Conn]struct{}{}, make(chan struct{})
	if l.first != nil {
		conns[l.first] = struct{}{}
		l.first = nil
	}
	l.mu.Unlock()
	// The connections first, the control socket last: the host takes the
	// end of its control socket (EOF) for the end of every host
	// descriptor the agent held (a checkpoint must find none open), and
	// each Close returns only once its descriptor is closed.
	for c := range conns {
		_ = c.Close()
	}
	_ = cur.Close()
}

// attach makes ctl the control socket of a detached listener.
func (l *AttachListener) attach(ctl *os.File) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil {
		return errors.New("the agent is attached to a host already")
	}
	cl, err := ConnListener(ctl)
	if err != nil {
		return err
	}
	l.cur = cl
	close(l.ready)
	return nil
}

// Close ends the listener.
func (l *AttachListener) Close() error {
	l.Detach()
	l.mu.Lock()
	l.closing = true
	if l.attachL != nil {
		_ = l.attachL.Close()
	}
	select {
	case <-l.ready:
	default:
		close(l.ready)
	}
	l.mu.Unlock()
	return nil
}

// Addr implements net.Listener.
func (l *AttachListener) Addr() net.Addr { return &net.UnixAddr{Name: "host", Net: "unix"} }

// ServeAttach takes new control sockets on the unix socket name
// (AttachSocket) until the listener is closed, each from a root peer. It returns once the socket listens;
// the serving goes on in the background.
func (l *AttachListener) ServeAttach(name string) error {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return fmt.Errorf("attach socket: %w", err)
	}
	l.mu.Lock()
	l.attachL = ln
	l.mu.Unlock()
	go func() {
		defer func() { _ = ln.Close() }()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			l.serveAttach(c)
		}
	}()
	return nil
}

// serveAttach handles one attach: the answer is "k" or an error message.
func (l *AttachListener) serveAttach(c *net.UnixConn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	answer := func(err error) {
		if err == nil {
			_, _ = c.Write([]byte("k"))
			return
		}
		_, _ = c.Write([]byte(err.Error()))
	}
	if err := rootPeer(c); err != nil {
		answer(err)
		return
	}
	p := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(p, oob)
	if err != nil {
		answer(err)
		return
	}
	fds, err := fdpass.Received(oob[:oobn])
	if err != nil {
		answer(err)
		return
	}
	if len(fds) != 1 || flags&unix.MSG_CTRUNC != 0 || n != 1 {
		fdpass.Close(fds)
		answer(errors.New("want one descriptor"))
		return
	}
	// Non-blocking before os.NewFile, which then waits on the poller.
	_ = unix.SetNonblock(fds[0], true)
	ctl := os.NewFile(uintptr(fds[0]), "control")
	if err := l.attach(ctl); err != nil {
		_ = ctl.Close()
		answer(err)
		return
	}
	answer(nil)
}

// rootPeer fails unless c's peer runs as root.
func rootPeer(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if cred.Uid != 0 {
		return fmt.Errorf("attach from uid %d refused: root only", cred.Uid)
	}
	return nil
}

// Attach sends ctl to the agent's socket name (AttachSocket) and returns
// the agent's answer (what `warren-agent attach` runs).
func Attach(name string, ctl *os.File) error {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return fmt.Errorf("reach the agent: %w", err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// A stream socket carries no descriptor without a byte of data.
	if _, _, err := c.WriteMsgUnix([]byte("a"), unix.UnixRights(int(ctl.Fd())), nil); err != nil {
		return fmt.Errorf("send the control socket: %w", err)
	}
	p := make([]byte, 512)
	n, err := c.Read(p)
	if err != nil {
		return fmt.Errorf("the agent's answer: %w", err)
	}
	if string(p[:n]) != "k" {
		return fmt.Errorf("the agent refused: %s", p[:n])
	}
	return nil
}
