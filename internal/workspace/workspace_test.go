package workspace_test

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/workspace"
)

func local(t *testing.T, root string, tweak func(*workspace.Options)) *workspace.Manager {
	t.Helper()
	o := workspace.Options{Root: root, UID: os.Getuid(), GID: os.Getgid()}
	if tweak != nil {
		tweak(&o)
	}
	m, err := workspace.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func kind(err error) string { return errdefs.Kind(err) }

func TestNamesAndLifecycle(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	m := local(t, root, nil)
	for _, bad := range [][2]string{{"ns", "../x"}, {"ns", ".meta"}, {"../ns", "x"}, {"ns", ""}, {"ns", strings.Repeat("a", 64)}, {"ns", "a/b"}} {
		if _, err := m.Create(ctx, bad[0], bad[1], "", 0); kind(err) != "invalid_params" {
			t.Errorf("create %q: %v", bad, err)
		}
	}
	if _, err := m.Create(ctx, "ns", "w", "nope", 0); kind(err) != "invalid_params" {
		t.Errorf("unknown store: %v", err)
	}
	info, err := m.Create(ctx, "ns", "w", "", 0)
	if err != nil || info.Quota != workspace.DefaultQuota || info.Store != "local" {
		t.Fatalf("create: %+v %v", info, err)
	}
	if _, err := m.Create(ctx, "ns", "w", "", 0); kind(err) != "conflict" {
		t.Errorf("create twice: %v", err)
	}
	if err := m.Remove(ctx, "ns", "w", func() bool { return true }); kind(err) != "conflict" {
		t.Errorf("remove in use: %v", err)
	}
	// A restart: a new manager on the same root finds it.
	m = local(t, root, nil)
	l, err := m.List([]string{"ns", "other"})
	if err != nil || len(l) != 1 || l[0].Name != "w" {
		t.Fatalf("list after restart: %+v %v", l, err)
	}
	if _, err := m.Attach(ctx, "ns", "missing", true); kind(err) != "not_found" {
		t.Errorf("attach missing: %v", err)
	}
	if err := m.Remove(ctx, "ns", "w", func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "ns", "w")); !os.IsNotExist(err) {
		t.Errorf("directory after removal: %v", err)
	}
}

// An upload is a hostile archive: a symlink a sandbox planted toward the
// host, entries with .. and absolute names, links out, stay inside or
// fail; the quota cuts it.
func TestUploadHostile(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	outside := t.TempDir()
	m := local(t, root, nil)
	if _, err := m.Create(ctx, "ns", "w", "", 4<<20); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "ns", "w")
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	up := func(hdrs ...*tar.Header) error {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				_, _ = tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		_ = tw.Close()
		_, err := m.Upload("ns", "w", &b)
		return err
	}
	reg := func(name string, size int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}
	}
	// The link's absolute target is resolved inside the workspace, where
	// it does not exist.
	if err := up(reg("escape/owned", 1)); kind(err) != "not_found" {
		t.Errorf("through a symlink: %v", err)
	}
	if err := up(reg("/abs", 1)); err != nil {
		t.Fatalf("absolute: %v", err)
	}
	if err := up(reg("../up", 1)); kind(err) != "invalid_params" {
		t.Errorf("..: %v", err)
	}
	if err := up(&tar.Header{Name: "hl", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}); err == nil {
		t.Errorf("hard link out: accepted")
	}
	if des, _ := os.ReadDir(outside); len(des) != 0 {
		t.Fatalf("written outside the workspace: %v", des)
	}
	if _, err := os.Stat(filepath.Join(dir, "abs")); err != nil {
		t.Errorf("absolute name lands inside: %v", err)
	}
	if err := up(reg("big", 5<<20)); kind(err) != "limit" {
		t.Errorf("past the quota: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "big")); !os.IsNotExist(err) {
		t.Errorf("a file past the quota was left: %v", err)
	}
}

// With a kernel limit (the disk limits' hook), a workspace's directory is
// made by it, at its quota, and removed by it.
func TestLimitHook(t *testing.T) {
	ctx := context.Background()
	var made, removed []string
	var limit int64
	m := local(t, t.TempDir(), func(o *workspace.Options) {
		o.Limit = func(dir string, max int64) error { made, limit = append(made, dir), max; return os.Mkdir(dir, 0o700) }
		o.Unlimit = func(dir string) error { removed = append(removed, dir); return os.RemoveAll(dir) }
	})
	if _, err := m.Create(ctx, "ns", "w", "", 12345); err != nil {
		t.Fatal(err)
	}
	if len(made) != 1 || limit != 12345 {
		t.Fatalf("limit hook: %v %d", made, limit)
	}
	if fi, err := os.Stat(made[0]); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("limited directory: %v %v", fi.Mode(), err)
	}
	if err := m.Remove(ctx, "ns", "w", nil); err != nil || len(removed) != 1 || removed[0] != made[0] {
		t.Fatalf("unlimit: %v %v", removed, err)
	}
}

// A namespace's own store and quota (the configuration's
// workspace_store, workspace_quota) decide its workspaces'.
func TestNamespacePolicy(t *testing.T) {
	ctx := context.Background()
	m := local(t, t.TempDir(), func(o *workspace.Options) {
		o.Namespace = func(ns string) (string, int64) {
			if ns == "team-a" {
				return "local", 1000
			}
			return "", 0
		}
	})
	info, err := m.Create(ctx, "team-a", "w", "", 0)
	if err != nil || info.Quota != 1000 || info.Store != "local" {
		t.Fatalf("namespace defaults: %+v %v", info, err)
	}
	_, err = m.Create(ctx, "team-a", "big", "", 2000)
	if kind(err) != "limit" || !strings.Contains(err.Error(), "2000 bytes is above namespace \"team-a\"'s workspace_quota of 1000 bytes") {
		t.Errorf("over the namespace's quota: %v", err)
	}
	if _, err := m.Create(ctx, "team-a", "other", "s3", 0); kind(err) != "forbidden" {
		t.Errorf("another store: %v", err)
	}
	if info, err := m.Create(ctx, "team-b", "w", "", 2000); err != nil || info.Quota != 2000 {
		t.Errorf("a namespace without policy: %+v %v", info, err)
	}
}
