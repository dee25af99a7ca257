package gvisor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// diskBackend is a backend of its own whose sandboxes are limited on a
// disk pool (a btrfs image mounted on <base>/pool/sandboxes, as the
// server's native backend prepares it), removed with the test.
func diskBackend(t *testing.T) (*gvisor.Backend, *conformance.Harness, *diskquota.Dirs) {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	base := t.TempDir()
	pool := filepath.Join(base, "pool", "sandboxes")
	if err := os.MkdirAll(pool, 0o700); err != nil {
		t.Fatal(err)
	}
	dirs, err := diskquota.OpenDirs(pool, filepath.Join(base, "pool", "disk.img"), diskquota.MinImageBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := diskquota.Unmount(pool); err != nil {
			t.Error(err)
		}
	})
	b, err := gvisor.New(gvisor.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
		RunscPath: testenv.RunscBinary(t), AgentPath: testenv.AgentBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-gvisor-test-disk-%d", os.Getpid()),
		Disk:         dirs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := b.ReapOrphans(nil); err != nil {
			t.Error(err)
		}
		_ = b.Close()
	})
	if b.DiskLimits() != diskquota.OnImage {
		t.Fatalf("DiskLimits = %q (%s), want %q", b.DiskLimits(), b.DiskLimitsOff(), diskquota.OnImage)
	}
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	return b, &conformance.Harness{Backend: b, Image: img}, dirs
}

// TestDiskLimit runs the conformance suite's disk checks on gVisor
// sandboxes kept on a disk pool; removal frees the sandbox's quota group.
func TestDiskLimit(t *testing.T) {
	b, h, dirs := diskBackend(t)
	conformance.RunDisk(t, h)

	ctx := context.Background()
	sb, err := b.Create(ctx, backend.Config{ID: "disk-removed", Image: h.Image, DiskBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dirs.Dir(), ".gvisor", sb.ID())
	id, err := diskquota.SubvolumeID(dir)
	if err != nil || id == diskquota.TopLevel {
		t.Fatalf("the sandbox's directory %s is no subvolume of the pool: %d %v", dir, id, err)
	}
	if err := sb.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s after Remove: %v", dir, err)
	}
}

// TestDiskLimitRefusedWithoutPool: without a disk pool a disk limit is
// refused, never ignored.
func TestDiskLimitRefusedWithoutPool(t *testing.T) {
	h := harness(t)
	if got := h.Backend.(*gvisor.Backend).DiskLimits(); got != "" {
		t.Fatalf("DiskLimits without a pool = %q", got)
	}
	_, err := h.Backend.Create(context.Background(), backend.Config{ID: "disk-refused", Image: h.Image, DiskBytes: 32 << 20})
	if err == nil || !strings.Contains(err.Error(), "disk limits") {
		t.Fatalf("Create with a disk limit and no pool: %v", err)
	}
}
