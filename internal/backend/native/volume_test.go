package native_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
)

// TestVolumes: host directories and files are bound read-write or
// read-only; the sandbox's root writes as the mapped host uid; a source
// that is a symlink by the time the agent mounts it fails the start.
func TestVolumes(t *testing.T) {
	h := harness(t)
	// The sandbox's root is an unprivileged host uid: every directory
	// above a volume must be searchable by others.
	host := t.TempDir()
	for _, d := range []string{filepath.Dir(host), host} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rw := filepath.Join(host, "rw")
	ro := filepath.Join(host, "ro")
	file := filepath.Join(host, "file.txt")
	for _, d := range []string{rw, ro} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ro, "in"), []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("one file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := h.Sandbox(t, backend.Config{Volumes: []backend.Volume{
		{Source: rw, Target: "/data"},
		{Source: ro, Target: "/srv/in", ReadOnly: true},
		{Source: file, Target: "/etc/extra.txt", ReadOnly: true},
	}})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo out > /data/out && cat /srv/in/in /etc/extra.txt"); r.Code != 0 || r.Stdout != "from host\none file\n" {
		t.Fatalf("use volumes: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	b, err := os.ReadFile(filepath.Join(rw, "out"))
	if err != nil || string(b) != "out\n" {
		t.Fatalf("written in the sandbox, on the host: %q %v", b, err)
	}
	st, err := os.Stat(filepath.Join(rw, "out"))
	if err != nil {
		t.Fatal(err)
	}
	if m := h.Backend.(*native.Backend).UserNS(); m != nil {
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid != m.Host {
			t.Errorf("file written by sandbox root is owned by host uid %d, want %d", uid, m.Host)
		}
	}
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo x > /srv/in/new"); r.Code == 0 || !strings.Contains(r.Stderr, "Read-only") {
		t.Errorf("write to a read-only volume: %+v %q", r.ExitStatus, r.Stderr)
	}
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo x > /etc/extra.txt"); r.Code == 0 {
		t.Errorf("write to a read-only file volume succeeded")
	}

	// A source whose path passes through a symlink is refused by
	// whichever resolves it (the host with per-sandbox uid ranges, else
	// the agent), without following symlinks.
	link := filepath.Join(host, "link")
	if err := os.Symlink("/etc", link); err != nil {
		t.Fatal(err)
	}
	sb2, err := h.Backend.Create(context.Background(), backend.Config{ID: "vol-symlink", Image: h.Image,
		Volumes: []backend.Volume{{Source: link, Target: "/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb2.Remove(context.Background()) }()
	if err := sb2.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "bind source") && !strings.Contains(err.Error(), "symbolic links") {
		t.Errorf("start with a symlinked volume source: want a bind source error, got %v", err)
	}

	// A sandbox that replaced a volume's target with a symlink (here to
	// its own /proc) gets a failed start on its next start, not a volume
	// over its /proc.
	cfg := backend.Config{ID: "vol-planted", Image: h.Image}
	sb3, err := h.Backend.Create(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb3.Remove(context.Background()) }()
	if err := sb3.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb3, 0, "/bin/ln", "-s", "/proc", "/data"); r.Code != 0 {
		t.Fatalf("plant symlink: %+v %q", r.ExitStatus, r.Stderr)
	}
	if err := sb3.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg.Volumes = []backend.Volume{{Source: rw, Target: "/data"}}
	sb4, err := h.Backend.(*native.Backend).Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb4.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("volume onto a planted symlink: want a symlink error, got %v", err)
		_ = sb4.Stop(context.Background())
	}

	// A volume the sandbox's root could not reach is refused up front,
	// saying why. With per-sandbox uid ranges the host opens volumes, and
	// it is no matter.
	if be := h.Backend.(*native.Backend); be.UserNS() != nil && !be.UIDRanges() {
		hidden := filepath.Join(host, "hidden")
		if err := os.MkdirAll(filepath.Join(hidden, "v"), 0o700); err != nil {
			t.Fatal(err)
		}
		_, err := h.Backend.Create(context.Background(), backend.Config{ID: "vol-hidden", Image: h.Image,
			Volumes: []backend.Volume{{Source: filepath.Join(hidden, "v"), Target: "/x"}}})
		if !errors.Is(err, backend.ErrVolumeNotAllowed) || !strings.Contains(err.Error(), "not searchable") {
			t.Errorf("unreachable volume: %v", err)
		}
	}
}

func TestCheckVolumeSource(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "a"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(root, "a", "out")); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	roots := []string{root}
	for _, c := range []struct {
		src string
		ok  bool
	}{
		{root, true},
		{filepath.Join(root, "a", "b"), true},
		{filepath.Join(root, "link"), false},      // a symlink itself
		{filepath.Join(root, "link", "b"), false}, // through a symlink
		{filepath.Join(root, "a", "out"), false},  // a symlink out of the root
		{filepath.Join(root, "missing"), false},   // does not exist
		{other, false},                            // outside the roots
		{root + "x", false},                       // a sibling sharing the prefix
		{root + "/a/../a", false},                 // not clean
		{"/dev/null", false},                      // outside, and not a dir or file
	} {
		err := backend.CheckVolumeSource(roots, backend.Volume{Source: c.src, Target: "/x"})
		if (err == nil) != c.ok {
			t.Errorf("%s: ok=%v, err=%v", c.src, c.ok, err)
		}
	}
	if err := backend.CheckVolumeSource(nil, backend.Volume{Source: "/dev/null", Target: "/x"}); err == nil {
		t.Error("a device node was accepted as a volume")
	}
	for _, s := range []string{"relative:/x", "/a:b", "/a:/", "/a:/proc/x", "/a:/dev", "/a:/x:rx", "/a", "/a:/x:ro:z", "/a/../b:/x"} {
		if _, err := backend.ParseVolume(s); err == nil {
			t.Errorf("ParseVolume(%q) accepted", s)
		}
	}
	if v, err := backend.ParseVolume("/a:/b:ro"); err != nil || !v.ReadOnly || v.String() != "/a:/b:ro" {
		t.Errorf("ParseVolume: %+v %v", v, err)
	}
}
