package native_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/testenv"
)

var diskSeq atomic.Int64

// diskBackend is a backend with disk limits on, on data and run
// directories of its own; its image is unmounted at the end.
func diskBackend(t testing.TB) (*native.Backend, *conformance.Harness, string) {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	base := t.TempDir()
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	data, run := filepath.Join(base, "data"), filepath.Join(base, "run")
	var logs syncBuffer
	b, err := native.New(native.Options{
		DataDir: data, RunDir: run, AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		// A prefix of its own: another test's backend reaping orphans
		// under a shared one would take this one's sandboxes for its own.
		CgroupPrefix: fmt.Sprintf("warren-test-disk-%d-%d", os.Getpid(), diskSeq.Add(1)), DiskPool: 1 << 30,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = b.ReapOrphans(nil)
		_ = b.Close()
		if err := diskquota.Unmount(filepath.Join(data, "sandboxes")); err != nil {
			t.Error(err)
		}
	})
	testenv.Require(t, b.DiskLimits() == diskquota.OnImage, "disk limits on a btrfs image (log: "+logs.String()+")")
	return b, harnessFor(t, b, data, run), data
}

// TestDiskLimit: the conformance suite's disk checks (EDQUOT in the
// writer alone, the cap kept across restarts); a limited directory
// standing for a workspace stops its writer too; removal frees the
// sandbox's quota group.
func TestDiskLimit(t *testing.T) {
	t.Parallel() // a backend of its own
	b, h, data := diskBackend(t)
	conformance.RunDisk(t, h)
	ctx := context.Background()

	// A directory put under a limit of its own (a workspace) stops its
	// writer too.
	ws := filepath.Join(data, "sandboxes", ".ws-test")
	if err := diskquota.CreateDir(ws, 8<<20); err != nil {
		t.Fatal(err)
	}
	uid, gid := b.RootIDs()
	if err := os.Chown(ws, uid, gid); err != nil {
		t.Fatal(err)
	}
	wsb := h.Sandbox(t, backend.Config{Volumes: []backend.Volume{{Source: ws, Target: "/workspace"}}})
	conformance.WantQuotaExceeded(t, wsb, "fill the workspace", "dd if=/dev/zero of=/workspace/big bs=1M count=16")
	if err := wsb.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := diskquota.Remove(ws); err != nil {
		t.Fatal(err)
	}

	// Removal frees the quota group (once the kernel has dropped the
	// subvolume, which ReapOrphans hastens).
	sb := h.Sandbox(t, backend.Config{DiskBytes: 32 << 20})
	id, err := diskquota.SubvolumeID(filepath.Join(data, "sandboxes", sb.ID()))
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids, err := diskquota.Qgroups(filepath.Join(data, "sandboxes"))
		if err != nil {
			t.Fatal(err)
		}
		if !contains(ids, id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quota group 0/%d still there 20 s after the sandbox's removal", id)
		}
		_, _ = b.ReapOrphans(nil)
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDiskFullRestart: a sandbox that filled its disk starts again with a
// writable root after the server's restart (a new backend, which mounts
// its root afresh): overlay makes its work directory again at every mount
// and, refused the space, would mount the root read-only, where nothing
// could be deleted to free any. The cap holds again once it runs.
func TestDiskFullRestart(t *testing.T) {
	t.Parallel() // a backend of its own
	b, h, data := diskBackend(t)
	const limit = 32 << 20
	ctx := context.Background()
	cfg := backend.Config{ID: fmt.Sprintf("disk-full-%d", os.Getpid()), Image: h.Image, DiskBytes: limit}
	sb, err := b.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	conformance.WantQuotaExceeded(t, sb, "fill the root", "dd if=/dev/zero of=/root/big bs=1M count=64")
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil { // releases the roots it held, as a server's exit does
		t.Fatal(err)
	}
	run := filepath.Join(filepath.Dir(data), "run")
	b2, err := native.New(native.Options{
		DataDir: data, RunDir: run, AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-test-disk-%d-%d", os.Getpid(), diskSeq.Add(1)), DiskPool: 1 << 30,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b2.Close() })
	sb2, err := b2.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb2.Remove(context.Background()) })
	if err := sb2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb2, 60*time.Second, "/bin/sh", "-c", "rm /root/big && echo ok > /root/after && sync"); r.Code != 0 {
		t.Fatalf("a full sandbox after a restart: %+v %s", r.ExitStatus, r.Stderr)
	}
	if got := sb2.(*native.Sandbox).DiskLimit(); got != limit {
		t.Errorf("DiskLimit after the restart = %d, want %d", got, limit)
	}
	conformance.WantQuotaExceeded(t, sb2, "fill the root again", "dd if=/dev/zero of=/root/big bs=1M count=64")
}

// TestDiskLimitInodes: a sandbox making empty files until it is stopped
// stops with EDQUOT (each file's metadata counts in the bytes: btrfs has
// no file count to limit apart from them), while another sandbox and the
// host go on making files. A large file takes most of the room first, so
// the small ones fill the rest in a few thousand.
func TestDiskLimitInodes(t *testing.T) {
	t.Parallel() // a backend of its own; slow near the limit, where btrfs commits to find room
	_, h, _ := diskBackend(t)
	sb := h.Sandbox(t, backend.Config{DiskBytes: backend.MinDiskBytes})
	other := h.Sandbox(t, backend.Config{DiskBytes: backend.MinDiskBytes})
	const many = `
import errno, os, sys
os.mkdir("/root/many")
n = 0
try:
    while n < int(sys.argv[1]):
        open("/root/many/%d" % n, "w").close()
        n += 1
    print("made", n)
except OSError as e:
    print(errno.errorcode[e.errno], n)
`
	r := conformance.Exec(t, sb, 120*time.Second, "/usr/bin/python3", "-c", `
with open("/root/pad", "wb") as f:
    f.write(bytes(15 << 20))
import os
os.sync()
`+many, "1000000")
	if !strings.HasPrefix(r.Stdout, "EDQUOT ") {
		t.Fatalf("many small files in %d MiB: %q %q %+v", backend.MinDiskBytes>>20, r.Stdout, r.Stderr, r.ExitStatus)
	}
	t.Logf("files before EDQUOT: %s", strings.TrimPrefix(strings.TrimSpace(r.Stdout), "EDQUOT "))
	if r := conformance.Exec(t, other, 60*time.Second, "/usr/bin/python3", "-c", many, "5000"); strings.TrimSpace(r.Stdout) != "made 5000" {
		t.Errorf("another sandbox beside one out of room for files: %q %q %+v", r.Stdout, r.Stderr, r.ExitStatus)
	}
	host := t.TempDir()
	for i := range 5000 {
		if err := os.WriteFile(filepath.Join(host, strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatalf("the host beside a sandbox out of room for files: file %d: %v", i, err)
		}
	}
}

func contains(ids []uint64, id uint64) bool {
	for _, v := range ids {
		if v == id {
			return true
		}
	}
	return false
}

// BenchmarkColdCycleDisk is the cold cycle (create, start, exec
// /bin/true, remove) of a sandbox with a 1 GiB disk limit, alternating
// with the same cycle on a backend without limits, whose sandboxes'
// directories are plain ones on the host's file system: each iteration runs one of
// each, and the medians and their ratio are reported (the limit's whole
// cost, under the same load).
//
//	WARREN_TEST_PRIVILEGED=1 go test -run XXX -bench ColdCycleDisk -benchtime 100x ./internal/backend/native/
func BenchmarkColdCycleDisk(b *testing.B) {
	_, limited, _ := diskBackend(b)
	// The same kind of backend, fresh too, without limits: the package's
	// shared one carries other benchmarks' and tests' state.
	base := b.TempDir()
	if err := os.Chmod(base, 0o711); err != nil {
		b.Fatal(err)
	}
	pb, err := native.New(native.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"), AgentPath: testenv.AgentBinary(b), SpawnerPath: testenv.SpawnerBinary(b),
		CgroupPrefix: fmt.Sprintf("warren-test-plain-%d", os.Getpid()),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = pb.ReapOrphans(nil)
		_ = pb.Close()
	})
	plain := harnessFor(b, pb, filepath.Join(base, "data"), filepath.Join(base, "run"))

	ctx := context.Background()
	// Each phase is timed on its own, so a difference shows where it is.
	phases := []string{"create", "start", "exec", "remove"}
	cycle := func(h *conformance.Harness, disk int64, i int) [4]time.Duration {
		var d [4]time.Duration
		t0 := time.Now()
		sb, err := h.Backend.Create(ctx, backend.Config{ID: fmt.Sprintf("bench-%d-%d", disk, i), Image: h.Image, DiskBytes: disk})
		if err != nil {
			b.Fatal(err)
		}
		d[0] = time.Since(t0)
		if err := sb.Start(ctx); err != nil {
			b.Fatal(err)
		}
		d[1] = time.Since(t0) - d[0]
		if r := conformance.Exec(b, sb, 0, "/bin/true"); r.Code != 0 {
			b.Fatalf("exec: %+v", r.ExitStatus)
		}
		d[2] = time.Since(t0) - d[0] - d[1]
		if err := sb.Remove(ctx); err != nil {
			b.Fatal(err)
		}
		d[3] = time.Since(t0) - d[0] - d[1] - d[2]
		return d
	}
	const lim = 1 << 30
	var on, off [5][]time.Duration // the phases, then the whole
	add := func(to *[5][]time.Duration, d [4]time.Duration) {
		var sum time.Duration
		for p, x := range d {
			to[p] = append(to[p], x)
			sum += x
		}
		to[4] = append(to[4], sum)
	}
	for i := range b.N {
		if i%2 == 0 { // which goes first alternates too
			add(&on, cycle(limited, lim, i))
			add(&off, cycle(plain, 0, i))
		} else {
			add(&off, cycle(plain, 0, i))
			add(&on, cycle(limited, lim, i))
		}
	}
	mOn, mOff := median(on[4]), median(off[4])
	// The pairs' own differences too: each pair ran at the same moment,
	// so its difference carries less of the machine's drift.
	pairs := make([]time.Duration, len(on[4]))
	for i := range pairs {
		pairs[i] = on[4][i] - off[4][i]
	}
	b.ReportMetric(float64(median(pairs))/float64(time.Millisecond), "pair-added-ms")
	b.ReportMetric(float64(mOn.Microseconds())/1000, "limited-ms")
	b.ReportMetric(float64(mOff.Microseconds())/1000, "unlimited-ms")
	b.ReportMetric(float64(mOn-mOff)/float64(time.Millisecond), "added-ms")
	b.ReportMetric(float64(mOn)/float64(mOff), "ratio")
	for p, name := range phases {
		b.ReportMetric(float64(median(on[p])-median(off[p]))/float64(time.Millisecond), name+"-added-ms")
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestDiskLimitsOverOldSandboxes: a data directory holding sandboxes made
// before disk limits keeps them working, uncapped: no image is mounted over
// them, and the log says why limits are off.
func TestDiskLimitsOverOldSandboxes(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	base := t.TempDir()
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	data, run := filepath.Join(base, "data"), filepath.Join(base, "run")
	open := func(pool int64, log *syncBuffer) *native.Backend {
		b, err := native.New(native.Options{
			DataDir: data, RunDir: run, AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
			CgroupPrefix: fmt.Sprintf("warren-test-disk-%d-%d", os.Getpid(), diskSeq.Add(1)), DiskPool: pool,
			Logger: slog.New(slog.NewTextHandler(log, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var log syncBuffer
	old := open(0, &log)
	h := harnessFor(t, old, data, run)
	ctx := context.Background()
	sb, err := old.Create(ctx, backend.Config{ID: "made-before", Image: h.Image})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	b := open(1<<30, &log)
	defer func() {
		_ = sb.Remove(ctx)
		_, _ = b.ReapOrphans(nil)
		_ = b.Close()
	}()
	if b.DiskLimits() != "" || diskquota.IsBtrfs(filepath.Join(data, "sandboxes")) {
		t.Fatalf("limits on (%q) over a sandbox made before them", b.DiskLimits())
	}
	if !strings.Contains(log.String(), "made before disk limits") {
		t.Errorf("the log does not say why limits are off:\n%s", log.String())
	}
	sb, err = b.Open(ctx, backend.Config{ID: "made-before", Image: h.Image})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo works > /root/f && cat /root/f"); r.Stdout != "works\n" {
		t.Fatalf("the old sandbox: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	if l := sb.(*native.Sandbox).DiskLimit(); l != 0 {
		t.Errorf("DiskLimit of an uncapped sandbox = %d", l)
	}
}
