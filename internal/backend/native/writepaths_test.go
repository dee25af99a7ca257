package native_test

import (
	"context"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/conformance"
)

// TestReadOnlyRoot: a read-only root refuses writes with EROFS outside
// /tmp, /workspace and the listed paths, which take writes into the
// writable layer and keep them across a restart.
func TestReadOnlyRoot(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{ReadOnlyRoot: true, WritablePaths: []string{"/home/user", "/var/cache/app"}})
	for _, p := range []string{"/etc/x", "/root/x", "/x", "/usr/x", "/var/x"} {
		r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo x > "+p)
		if r.Code == 0 || !strings.Contains(r.Stderr, "Read-only file system") {
			t.Errorf("write %s: %+v %q; want EROFS", p, r.ExitStatus, r.Stderr)
		}
	}
	write := "set -e; for d in /tmp /workspace /home/user /var/cache/app; do echo kept > $d/f; done; mkdir -p /home/user/sub && echo y > /home/user/sub/g"
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", write); r.Code != 0 {
		t.Fatalf("writes to the writable paths: %+v %q", r.ExitStatus, r.Stderr)
	}
	// Nothing mounted inside may be remounted writable by the sandbox.
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "mount -o remount,rw / 2>&1; echo x > /etc/x"); r.Code == 0 {
		t.Errorf("the sandbox made its root writable: %q", r.Stdout)
	}
	ctx := context.Background()
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r := conformance.Exec(t, sb, 0, "/bin/cat", "/tmp/f", "/workspace/f", "/home/user/f", "/var/cache/app/f", "/home/user/sub/g")
	if r.Stdout != "kept\nkept\nkept\nkept\ny\n" {
		t.Errorf("after a restart: %q %q", r.Stdout, r.Stderr)
	}
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo x > /etc/x"); r.Code == 0 {
		t.Errorf("root writable after a restart")
	}

	// A writable path the sandbox made a symlink (to /etc) fails the
	// next start rather than making /etc writable.
	if r := conformance.Exec(t, sb, 0, "/bin/ln", "-s", "/etc", "/home/user/etc"); r.Code != 0 {
		t.Fatalf("ln: %+v %q", r.ExitStatus, r.Stderr)
	}
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	sb.(backend.Reconfigurer).SetConfig(backend.Config{Image: h.Image, ReadOnlyRoot: true, WritablePaths: []string{"/home/user/etc"}})
	if err := sb.Start(ctx); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("start with a writable path through a symlink: %v", err)
	}
}
