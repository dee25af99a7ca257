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

// TestVolumes: what the native backend adds to the conformance suite's
// volume case (Volumes): the sandbox's root writes as the mapped host
// uid, and a volume that root could not reach is refused up front.
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
	if err := os.Mkdir(rw, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(rw, 0o777); err != nil {
		t.Fatal(err)
	}
	sb := h.Sandbox(t, backend.Config{Volumes: []backend.Volume{{Source: rw, Target: "/data"}}})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo out > /data/out"); r.Code != 0 {
		t.Fatalf("write to a volume: %+v %q", r.ExitStatus, r.Stderr)
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
