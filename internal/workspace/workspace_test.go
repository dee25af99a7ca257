package workspace_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/testenv"
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

// diskPool prepares a btrfs image with quotas on a directory of its own,
// as the native backend does for its sandboxes (unmounted at the end).
func diskPool(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs)")
	base := t.TempDir()
	dir := filepath.Join(base, "sandboxes")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := diskquota.Prepare(dir, filepath.Join(base, "disk.img"), diskquota.MinImageBytes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := diskquota.Unmount(dir); err != nil {
			t.Error(err)
		}
	})
	return filepath.Join(dir, ".workspaces")
}

// With a disk pool, a new workspace's directory is a subvolume on it held
// to its quota by the kernel (a write past it fails with EDQUOT, root's
// too), across a restart; a workspace made before keeps its directory and
// says it has no kernel limit; a server without the pool refuses a
// pooled workspace rather than show it empty; removal frees the quota
// group; a "dir" store at a path of its own keeps its workspaces there.
func TestKernelLimit(t *testing.T) {
	ctx := context.Background()
	pool := diskPool(t)
	root := t.TempDir()
	own := &workspace.Dir{Root: t.TempDir()}
	// A workspace made before disk limits.
	if _, err := local(t, root, nil).Create(ctx, "ns", "old", "", 1<<20); err != nil {
		t.Fatal(err)
	}
	open := func(pool string) *workspace.Manager {
		return local(t, root, func(o *workspace.Options) { o.Pool, o.Stores = pool, map[string]workspace.Store{"own": own} })
	}
	m := open(pool)
	const quota = 4 << 20
	if _, err := m.Create(ctx, "ns", "w", "", quota); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(pool, "local", "ns", "w")
	used, limit, err := diskquota.Usage(dir)
	if err != nil || limit != quota {
		t.Fatalf("the workspace's quota group: used %d, limit %d, %v; want limit %d", used, limit, err, quota)
	}
	info, err := m.Get("ns", "w")
	if err != nil || !info.KernelLimit || info.LimitNote != "" {
		t.Fatalf("get: %+v %v", info, err)
	}
	m = open(pool) // a restart
	if _, err := fill(filepath.Join(dir, "big"), 8); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a write past the quota: %v, want EDQUOT", err)
	}
	if got, err := m.Attach(ctx, "ns", "w", true); err != nil || got != dir {
		t.Fatalf("attach: %q %v", got, err)
	}

	info, err = m.Get("ns", "old")
	if err != nil || info.KernelLimit || !strings.Contains(info.LimitNote, "made before disk limits") {
		t.Errorf("a workspace made before limits: %+v %v", info, err)
	}
	if got, err := m.Attach(ctx, "ns", "old", true); err != nil || got != filepath.Join(root, "ns", "old") {
		t.Errorf("attach a workspace made before limits: %q %v", got, err)
	}
	if _, err := m.Create(ctx, "ns", "o", "own", quota); err != nil {
		t.Fatal(err)
	}
	info, err = m.Get("ns", "o")
	if err != nil || info.KernelLimit || !strings.Contains(info.LimitNote, "a path of its own") {
		t.Errorf("a dir store's workspace: %+v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(own.Root, "ns", "o")); err != nil {
		t.Errorf("a dir store's workspace is not at its path: %v", err)
	}

	// Without the pool (disk limits off), a pooled workspace is
	// unavailable, not an empty directory made elsewhere.
	if _, err := open("").Attach(ctx, "ns", "w", true); kind(err) != "unavailable" {
		t.Errorf("attach without the pool: %v", err)
	}

	id, err := diskquota.SubvolumeID(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(ctx, "ns", "w", nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids, err := diskquota.Qgroups(pool)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ids, id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quota group 0/%d still there 20 s after the workspace's removal", id)
		}
		_, _ = diskquota.Reap(pool)
		time.Sleep(100 * time.Millisecond)
	}
}

// fill writes 1 MiB blocks to p until a write fails or max MiB are
// written.
func fill(p string, max int) (int, error) {
	f, err := os.Create(p) //nolint:gosec // test file
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, 1<<20)
	for i := range max {
		if _, err := f.Write(buf); err != nil {
			return i, err
		}
		if err := f.Sync(); err != nil {
			return i, err
		}
	}
	return max, nil
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
