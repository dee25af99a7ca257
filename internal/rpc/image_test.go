package rpc_test

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
)

// TestImagePullOverRPC pulls an image from a registry on loopback through
// image.pull, lists it, and starts a sandbox from it.
func TestImagePullOverRPC(t *testing.T) {
	e := newEnv(t, false, nil)
	ref := greetingImage(t, nil)
	var pulled struct {
		Name   string `json:"name"`
		ID     string `json:"id"`
		Layers int    `json:"layers"`
	}
	e.must("image.pull", map[string]any{"ref": ref, "name": "greeting"}, &pulled)
	if pulled.Name != "greeting" || pulled.Layers != 1 || !strings.HasPrefix(pulled.ID, "sha256:") {
		t.Fatalf("pull: %+v", pulled)
	}
	var list struct {
		Images []struct {
			Name string `json:"name"`
		} `json:"images"`
	}
	e.must("image.list", map[string]any{}, &list)
	if len(list.Images) != 1 || list.Images[0].Name != "greeting" {
		t.Fatalf("list: %+v", list)
	}
	if r := e.call("image.pull", map[string]any{"ref": strings.TrimSuffix(ref, "/test/greeting:1") + "/test/missing:1"}); r.Status != 400 || r.Error == nil {
		t.Fatalf("pull of a missing image: %s; want 400 (the request's: not found)", r.Raw)
	}
	// A registry that cannot be reached is unavailable, not the server's
	// own failure (internal).
	if r := e.call("image.pull", map[string]any{"ref": "127.0.0.1:1/x:latest"}); r.Status != 503 || r.Error == nil {
		t.Fatalf("pull from an unreachable registry: %s; want 503 (unavailable)", r.Raw)
	}
	e.must("sandbox.create", map[string]any{"name": "fromimg", "image": "greeting"}, nil)
	var rd struct {
		Data string `json:"data"`
	}
	e.must("sandbox.file.read", map[string]any{"sandbox": "fromimg", "path": "/etc/greeting"}, &rd)
	if b, _ := base64.StdEncoding.DecodeString(rd.Data); string(b) != "hello\n" {
		t.Fatalf("file from the image: %q", b)
	}
	if r := e.call("sandbox.create", map[string]any{"name": "noimg", "image": "nope"}); r.Status != 400 || !strings.Contains(r.Error.Message, "nope") {
		t.Fatalf("unknown image: %s", r.Raw)
	}

	// The sandbox pins its image: the name cannot be removed, and once the
	// name points to another image the sandbox still restarts on its own.
	if err := e.images.Remove("greeting"); !errors.Is(err, image.ErrInUse) || !strings.Contains(err.Error(), "fromimg") {
		t.Fatalf("image rm while a sandbox uses it: %v", err)
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "greeting"), []byte("replaced\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.images.Import(context.Background(), root, "greeting"); err != nil {
		t.Fatal(err)
	}
	if freed, err := e.images.Prune(); err != nil || freed != 0 {
		t.Fatalf("prune while the sandbox's image is in use: %d, %v", freed, err)
	}
	e.must("sandbox.stop", map[string]any{"sandbox": "fromimg"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "fromimg"}, nil)
	e.must("sandbox.file.read", map[string]any{"sandbox": "fromimg", "path": "/etc/greeting"}, &rd)
	if b, _ := base64.StdEncoding.DecodeString(rd.Data); string(b) != "hello\n" {
		t.Fatalf("restarted sandbox sees %q, want its own image's file", b)
	}
	e.must("sandbox.remove", map[string]any{"sandbox": "fromimg"}, nil)
	if freed, err := e.images.Prune(); err != nil || freed == 0 {
		t.Fatalf("prune after the sandbox went: %d, %v", freed, err)
	}
}
