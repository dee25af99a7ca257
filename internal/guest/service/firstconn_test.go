package service

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/guest/httpd"
	"github.com/warren-sandbox/warren/internal/wire"
)

// TestFirstConn: the connection made at spawn serves the host's first
// request, with no dial (the client's socket path leads nowhere until the
// end), and the listener goes on serving connections of its own.
func TestFirstConn(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "conn")
		defer func() { _ = f.Close() }()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	agentEnd, hostEnd := conn(fds[0]), conn(fds[1])
	mux := &httpd.Mux{}
	mux.HandleFunc("GET /v1/health", func(w httpd.ResponseWriter, r *httpd.Request) {
		writeJSON(w, wire.Health{Version: wire.Version, Pid: 42})
	})
	go func() { _ = httpd.Serve(FirstConn(l, agentEnd), mux) }()
	t.Cleanup(func() { _ = l.Close() })

	ctx := context.Background()
	c := agent.NewClientConn(filepath.Join(dir, "nowhere.sock"), hostEnd)
	for i := 0; i < 2; i++ { // the second reuses the kept-alive connection
		if h, err := c.Health(ctx); err != nil || h.Pid != 42 {
			t.Fatalf("request %d over the first connection: %+v, %v", i, h, err)
		}
	}
	c.Close() // drops the first connection: the next request must dial
	if _, err := c.Health(ctx); err == nil {
		t.Fatal("a request after the first connection closed did not dial the (missing) socket")
	}
	if h, err := agent.NewClient(sock).Health(ctx); err != nil || h.Pid != 42 {
		t.Fatalf("listener after the first connection: %+v, %v", h, err)
	}
}
