package boot

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// ctlPair is a control socket pair: the host's end, and the agent's made
// non-blocking as the agent's inherited ones are.
func ctlPair(t *testing.T) (host, agent *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.SetNonblock(fds[1], true) // read by NewFile
	return os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "ctl")
}

// roundTrip sends a connection on host and checks it arrives at l.
func roundTrip(t *testing.T, host *os.File, l net.Listener) net.Conn {
	t.Helper()
	mine, far := pair(t)
	if err := SendConn(host, far); err != nil {
		t.Fatal(err)
	}
	_ = far.Close()
	got, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mine.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(got, b); err != nil || b[0] != 'x' {
		t.Fatalf("read %q, %v", b, err)
	}
	_ = mine.Close()
	return got
}

// TestAttachListener: the first connection comes first; Detach closes the
// control socket and every connection through it but does not end
// Accept; an attach on the socket brings the next control socket, whose
// connections arrive; an attach while attached is refused; the host's end
// closing without a detach ends Accept.
func TestAttachListener(t *testing.T) {
	testenv.RequireRoot(t) // the attach socket hears root peers only
	name := fmt.Sprintf("@warren-attach-test-%d", os.Getpid())
	host, agentEnd := ctlPair(t)
	firstHost, firstFar := pair(t)
	first, err := net.FileConn(firstFar)
	if err != nil {
		t.Fatal(err)
	}
	_ = firstFar.Close()
	l, err := NewAttachListener(agentEnd, first)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	if err := l.ServeAttach(name); err != nil {
		t.Fatal(err)
	}
	c0, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c1 := roundTrip(t, host, l)

	// Attached: a second control socket is refused.
	_, other := pair(t)
	if err := Attach(name, other); err == nil || !strings.Contains(err.Error(), "attached") {
		t.Fatalf("attach while attached: %v", err)
	}

	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	l.Detach()
	for i, c := range []net.Conn{c0, c1} {
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("connection %d still open after Detach", i)
		}
	}
	if _, err := firstHost.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the first connection's host end reads %v, want EOF", err)
	}
	if err := SendConn(host, other); err == nil {
		// The agent's end is closed: the send fails, or what it sent is
		// never accepted (checked below by the next accept's socket).
		t.Log("send on the detached control socket did not fail")
	}

	host2, far2 := ctlPair(t)
	if err := Attach(name, far2); err != nil {
		t.Fatal(err)
	}
	_ = far2.Close()
	mine, far := pair(t)
	if err := SendConn(host2, far); err != nil {
		t.Fatal(err)
	}
	_ = far.Close()
	select {
	case c := <-accepted:
		if _, err := mine.Write([]byte("y")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil || b[0] != 'y' {
			t.Fatalf("after attach: read %q, %v", b, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no connection after the attach")
	}

	// The host's end closing, without a detach, ends the listener.
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		errc <- err
	}()
	_ = host2.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Accept went on after the host's end closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept did not end when the host's end closed")
	}
}
