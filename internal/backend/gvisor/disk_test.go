package gvisor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// diskBackend is a backend of its own whose sandboxes are limited on a
// disk pool (a btrfs image mounted on <base>/pool/sandboxes, as the
// server's native backend prepares it), removed with the test.
func diskBackend(t testing.TB) (*gvisor.Backend, *conformance.Harness, *diskquota.Dirs) {
	t.Helper()
	b, dirs := openDisk(t, t.TempDir(), true)
	if b.DiskLimits() != diskquota.OnImage {
		t.Fatalf("DiskLimits = %q (%s), want %q", b.DiskLimits(), b.DiskLimitsOff(), diskquota.OnImage)
	}
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	return b, &conformance.Harness{Backend: b, Image: img}, dirs
}

// openDisk opens a backend on base, on a disk pool there when withPool says
// so, closed (and the pool unmounted) with the test.
func openDisk(t testing.TB, base string, withPool bool) (*gvisor.Backend, *diskquota.Dirs) {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	if !withPool {
		return newDiskless(t, base, nil), nil
	}
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
	return newDiskless(t, base, dirs), dirs
}

// newDiskless opens a backend on base with disk (nil: none), closed with
// the test.
func newDiskless(t testing.TB, base string, disk *diskquota.Dirs) *gvisor.Backend {
	t.Helper()
	b, err := gvisor.New(gvisor.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
		RunscPath: testenv.RunscBinary(t), AgentPath: testenv.AgentBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-gvisor-test-disk-%d", os.Getpid()),
		Disk:         disk,
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
	return b
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

// TestDiskLimitsOverOldSandboxes: gvisor sandboxes made before disk limits
// keep working, uncapped, where they are: limits stay off for the backend
// (it says why) rather than hide them, and a limit asked for is refused.
func TestDiskLimitsOverOldSandboxes(t *testing.T) {
	base := t.TempDir()
	old, _ := openDisk(t, base, false)
	img, err := old.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := old.Create(ctx, backend.Config{ID: "made-before", Image: img}); err != nil {
		t.Fatal(err)
	}
	b, _ := openDisk(t, base, true)
	if b.DiskLimits() != "" || !strings.Contains(b.DiskLimitsOff(), "made before disk limits") {
		t.Fatalf("limits %q (off: %q) over a sandbox made before them", b.DiskLimits(), b.DiskLimitsOff())
	}
	sb, err := b.Open(ctx, backend.Config{ID: "made-before", Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(ctx) }()
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo works > /root/f && cat /root/f"); r.Stdout != "works\n" {
		t.Fatalf("the old sandbox: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	if l := sb.(backend.DiskLimiter).DiskLimit(); l != 0 {
		t.Errorf("DiskLimit of an uncapped sandbox = %d", l)
	}
	if _, err := b.Create(ctx, backend.Config{ID: "capped", Image: img, DiskBytes: 32 << 20}); err == nil {
		t.Error("a disk limit accepted with limits off")
	}
}

// BenchmarkColdCycleDisk: what a disk limit costs gVisor's cycle (create,
// start, exec /bin/true, remove): a sandbox capped at 1 GiB on a disk
// pool against one on a backend without limits, alternating, medians
// reported as limited-ns and none-ns.
func BenchmarkColdCycleDisk(b *testing.B) {
	limited, h, _ := diskBackend(b)
	none := harness(b)
	timed := func(be backend.Backend, img *image.Image, id string, disk int64) time.Duration {
		start := time.Now()
		cycle(b, be, backend.Config{ID: id, Image: img, DiskBytes: disk})
		return time.Since(start)
	}
	var on, off []time.Duration
	for i := range b.N {
		on = append(on, timed(limited, h.Image, fmt.Sprintf("bench-disk-%d", i), 1<<30))
		off = append(off, timed(none.Backend, none.Image, fmt.Sprintf("bench-nodisk-%d", i), 0))
	}
	med := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Nanoseconds())
	}
	b.ReportMetric(med(on), "limited-ns")
	b.ReportMetric(med(off), "none-ns")
	b.ReportMetric(med(on)/med(off), "ratio")
}
