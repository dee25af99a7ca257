package boot

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func pair(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
}

// TestConnListener: each connection sent arrives, in order; a message
// without a descriptor is dropped; the host's end closing ends Accept.
func TestConnListener(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	host := os.NewFile(uintptr(fds[0]), "host")
	// Non-blocking before it becomes a File, as the agent's inherited
	// descriptors are: the runtime's poller then waits on it.
	_ = syscall.SetNonblock(fds[1], true)
	l, err := ConnListener(os.NewFile(uintptr(fds[1]), "ctl"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	var mine []net.Conn
	for range 3 {
		near, far := pair(t)
		if err := SendConn(host, far); err != nil {
			t.Fatal(err)
		}
		_ = far.Close()
		c, err := net.FileConn(near)
		_ = near.Close()
		if err != nil {
			t.Fatal(err)
		}
		mine = append(mine, c)
	}
	// Noise: a byte without a descriptor.
	if _, err := host.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	for i, c := range mine {
		got, err := l.Accept()
		if err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
		msg := []byte{byte('0' + i)}
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(got, b); err != nil || b[0] != msg[0] {
			t.Fatalf("connection %d carried %q, %v; want %q", i, b, err, msg)
		}
		_ = got.Close()
		_ = c.Close()
	}
	_ = host.Close()
	if c, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after the host's end closed: %v, %v; want net.ErrClosed", c, err)
	}
}
