package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
)

// readOnlyRoot: a read-only root refuses writes with EROFS outside /tmp,
// /workspace and the listed paths, which take writes into the writable
// layer and keep them across a restart; a writable path the sandbox made
// a symlink fails the next start rather than making its target writable.
func (h *Harness) readOnlyRoot(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{ReadOnlyRoot: true, WritablePaths: []string{"/home/user", "/var/cache/app"}})
	for _, p := range []string{"/etc/x", "/root/x", "/x", "/usr/x", "/var/x"} {
		r := Exec(t, sb, 0, "/bin/sh", "-c", "echo x > "+p)
		if r.Code == 0 || !strings.Contains(r.Stderr, "Read-only file system") {
			t.Errorf("write %s: %+v %q; want EROFS", p, r.ExitStatus, r.Stderr)
		}
	}
	write := "set -e; for d in /tmp /workspace /home/user /var/cache/app; do echo kept > $d/f; done; mkdir -p /home/user/sub && echo y > /home/user/sub/g"
	if r := Exec(t, sb, 0, "/bin/sh", "-c", write); r.Code != 0 {
		t.Fatalf("writes to the writable paths: %+v %q", r.ExitStatus, r.Stderr)
	}
	// Nothing mounted inside may be remounted writable by the sandbox.
	if r := Exec(t, sb, 0, "/bin/sh", "-c", "mount -o remount,rw / 2>&1; echo x > /etc/x"); r.Code == 0 {
		t.Errorf("the sandbox made its root writable: %q", r.Stdout)
	}
	ctx := context.Background()
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r := Exec(t, sb, 0, "/bin/cat", "/tmp/f", "/workspace/f", "/home/user/f", "/var/cache/app/f", "/home/user/sub/g")
	if r.Stdout != "kept\nkept\nkept\nkept\ny\n" {
		t.Errorf("after a restart: %q %q", r.Stdout, r.Stderr)
	}
	if r := Exec(t, sb, 0, "/bin/sh", "-c", "echo x > /etc/x"); r.Code == 0 {
		t.Errorf("root writable after a restart")
	}

	// A writable path the sandbox made a symlink (to /etc) fails the
	// next start rather than making /etc writable.
	if r := Exec(t, sb, 0, "/bin/ln", "-s", "/etc", "/home/user/etc"); r.Code != 0 {
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

// volumes: host directories and files are bound read-write or read-only;
// a source that is a symlink by the time the backend mounts it fails the
// start, and so does a target the sandbox replaced with a symlink.
func (h *Harness) volumes(t *testing.T) {
	// The sandbox's root may be an unprivileged host uid: every
	// directory above a volume must be searchable by others.
	host := t.TempDir()
	for _, d := range []string{filepath.Dir(host), host} {
		if err := os.Chmod(d, 0o755); err != nil { //nolint:gosec // searchable by the sandbox's root uid
			t.Fatal(err)
		}
	}
	rw := filepath.Join(host, "rw")
	ro := filepath.Join(host, "ro")
	file := filepath.Join(host, "file.txt")
	for _, d := range []string{rw, ro} {
		if err := os.Mkdir(d, 0o777); err != nil { //nolint:gosec // writable by the sandbox's root uid
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil { //nolint:gosec // writable by the sandbox's root uid
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ro, "in"), []byte("from host\n"), 0o644); err != nil { //nolint:gosec // read by the sandbox
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("one file\n"), 0o644); err != nil { //nolint:gosec // read by the sandbox
		t.Fatal(err)
	}
	sb := h.Sandbox(t, backend.Config{Volumes: []backend.Volume{
		{Source: rw, Target: "/data"},
		{Source: ro, Target: "/srv/in", ReadOnly: true},
		{Source: file, Target: "/etc/extra.txt", ReadOnly: true},
	}})
	if r := Exec(t, sb, 0, "/bin/sh", "-c", "echo out > /data/out && cat /srv/in/in /etc/extra.txt"); r.Code != 0 || r.Stdout != "from host\none file\n" {
		t.Fatalf("use volumes: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	b, err := os.ReadFile(filepath.Join(rw, "out")) //nolint:gosec // the test's own directory
	if err != nil || string(b) != "out\n" {
		t.Fatalf("written in the sandbox, on the host: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(rw, "later"), []byte("from the host, later\n"), 0o644); err != nil { //nolint:gosec // read by the sandbox
		t.Fatal(err)
	}
	if r := Exec(t, sb, 0, "/bin/cat", "/data/later"); r.Stdout != "from the host, later\n" {
		t.Errorf("a host write after the start, inside: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	if r := Exec(t, sb, 0, "/bin/sh", "-c", "echo x > /srv/in/new"); r.Code == 0 || !strings.Contains(r.Stderr, "Read-only") {
		t.Errorf("write to a read-only volume: %+v %q", r.ExitStatus, r.Stderr)
	}
	if r := Exec(t, sb, 0, "/bin/sh", "-c", "echo x > /etc/extra.txt"); r.Code == 0 {
		t.Errorf("write to a read-only file volume succeeded")
	}

	// A source whose path passes through a symlink is refused by
	// whichever resolves it, without following symlinks.
	link := filepath.Join(host, "link")
	if err := os.Symlink("/etc", link); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := fmt.Sprintf("vol-%d", seq.Add(1))
	sb2, err := h.Backend.Create(ctx, backend.Config{ID: id + "-symlink", Image: h.Image,
		Volumes: []backend.Volume{{Source: link, Target: "/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb2.Remove(ctx) }()
	if err := sb2.Start(ctx); err == nil || !strings.Contains(err.Error(), "bind source") && !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("start with a symlinked volume source: want a bind source error, got %v", err)
	}

	// A sandbox that replaced a volume's target with a symlink (here to
	// its own /proc) gets a failed start on its next start, not a volume
	// over its /proc.
	cfg := backend.Config{ID: id + "-planted", Image: h.Image}
	sb3, err := h.Backend.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb3.Remove(ctx) }()
	if err := sb3.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r := Exec(t, sb3, 0, "/bin/ln", "-s", "/proc", "/data"); r.Code != 0 {
		t.Fatalf("plant symlink: %+v %q", r.ExitStatus, r.Stderr)
	}
	if err := sb3.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.Volumes = []backend.Volume{{Source: rw, Target: "/data"}}
	sb3.(backend.Reconfigurer).SetConfig(cfg)
	if err := sb3.Start(ctx); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("volume onto a planted symlink: want a symlink error, got %v", err)
		_ = sb3.Stop(ctx)
	}
}

// tmpKept: /tmp is the sandbox's disk (its writable layer), not memory:
// what is written there is kept across a stop and a start.
func (h *Harness) tmpKept(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	if r := Exec(t, sb, 0, "/bin/sh", "-c", "echo kept > /tmp/f"); r.Code != 0 {
		t.Fatalf("write /tmp/f: %+v %q", r.ExitStatus, r.Stderr)
	}
	ctx := context.Background()
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r := Exec(t, sb, 0, "/bin/cat", "/tmp/f"); r.Stdout != "kept\n" {
		t.Errorf("/tmp/f after a restart: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
}
