package diskquota_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// pool prepares a fresh image-backed directory for one test; it is
// unmounted at the end.
func pool(t testing.TB) string {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs)")
	base := t.TempDir()
	dir := filepath.Join(base, "sandboxes")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	how, err := diskquota.Prepare(dir, filepath.Join(base, "disk.img"), diskquota.MinImageBytes)
	testenv.Require(t, err == nil, "a btrfs image with quotas: "+errString(err))
	if how != diskquota.OnImage {
		t.Fatalf("Prepare = %q, want %q", how, diskquota.OnImage)
	}
	t.Cleanup(func() {
		if err := diskquota.Unmount(dir); err != nil {
			t.Error(err)
		}
	})
	return dir
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// fill writes 1 MiB blocks to p until a write fails or max MiB are
// written; it returns the MiB written and the error.
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

func TestLimitStopsWritesThere(t *testing.T) {
	dir := pool(t)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := diskquota.CreateDir(a, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := diskquota.CreateDir(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := diskquota.CreateDir(a, 1<<20); !errors.Is(err, os.ErrExist) {
		t.Fatalf("CreateDir of an existing dir: %v, want ErrExist", err)
	}
	n, err := fill(filepath.Join(a, "big"), 64)
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a: wrote %d MiB, err %v; want EDQUOT before 8 MiB", n, err)
	}
	if n > 8 {
		t.Fatalf("a: wrote %d MiB past its 8 MiB limit", n)
	}
	if n, err := fill(filepath.Join(b, "big"), 16); err != nil || n != 16 {
		t.Fatalf("b (no limit) beside a full a: wrote %d MiB, %v", n, err)
	}
	used, limit, err := diskquota.Usage(a)
	if err != nil {
		t.Fatal(err)
	}
	if limit != 8<<20 || used < 4<<20 || used > 8<<20 {
		t.Fatalf("Usage(a) = %d of %d, want ~8 MiB of 8 MiB", used, limit)
	}
	// A raised limit lets the writer go on.
	if err := diskquota.SetLimit(a, 32<<20); err != nil {
		t.Fatal(err)
	}
	if n, err := fill(filepath.Join(a, "more"), 8); err != nil {
		t.Fatalf("after raising the limit: wrote %d MiB, %v", n, err)
	}
}

func TestSmallFilesStopAtTheLimit(t *testing.T) {
	dir := pool(t)
	a := filepath.Join(dir, "a")
	if err := diskquota.CreateDir(a, 1<<20); err != nil {
		t.Fatal(err)
	}
	// Most of the room taken first: the small files fill the rest in a
	// few hundred (near the limit each costs btrfs a commit).
	if err := os.WriteFile(filepath.Join(a, "pad"), make([]byte, 768<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Sync()
	var err error
	i := 0
	for ; i < 200000 && err == nil; i++ {
		err = os.WriteFile(filepath.Join(a, strconv.Itoa(i)), []byte("x"), 0o600)
		if i%1000 == 999 && err == nil {
			syscall.Sync() // accounting is settled at each commit
		}
	}
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("%d small files in a 1 MiB directory: %v, want EDQUOT", i, err)
	}
	t.Logf("%d files fit beside 768 KiB in 1 MiB", i)
}

func TestRemoveFreesTheQgroup(t *testing.T) {
	t.Parallel() // waits for the kernel's cleaner
	dir := pool(t)
	a := filepath.Join(dir, "a")
	if err := diskquota.CreateDir(a, 4<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := fill(filepath.Join(a, "f"), 2); err != nil {
		t.Fatal(err)
	}
	id, err := diskquota.SubvolumeID(a)
	if err != nil {
		t.Fatal(err)
	}
	before := qgroups(t, dir)
	if err := diskquota.Remove(a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Remove: %v", err)
	}
	if !before[id] {
		t.Fatalf("qgroup 0/%d not listed while its directory exists", id)
	}
	// The kernel drops a deleted subvolume's tree in the background;
	// its qgroup can go once that is done (a transaction or two).
	t0 := time.Now()
	for qgroups(t, dir)[id] {
		if time.Since(t0) > 90*time.Second {
			t.Fatalf("qgroup 0/%d still there 90 s after Remove", id)
		}
		if _, err := diskquota.Reap(dir); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("qgroup freed %v after Remove", time.Since(t0))
}

// qgroups lists the subvolume qgroups of dir's file system.
func qgroups(t *testing.T, dir string) map[uint64]bool {
	t.Helper()
	ids, err := diskquota.Qgroups(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint64]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// BenchmarkCreateRemove is one sandbox directory's life on the limited
// file system: a limited subvolume, against a plain directory beside it.
func BenchmarkCreateRemove(b *testing.B) {
	dir := pool(b)
	for _, limited := range []bool{false, true} {
		name := "plain"
		if limited {
			name = "limited"
		}
		b.Run(name, func(b *testing.B) {
			for i := range b.N {
				p := filepath.Join(dir, name+strconv.Itoa(i))
				var err error
				if limited {
					err = diskquota.CreateDir(p, 1<<30)
				} else {
					err = os.Mkdir(p, 0o700)
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p, "f"), []byte("x"), 0o600); err != nil {
					b.Fatal(err)
				}
				if limited {
					err = diskquota.Remove(p)
				} else {
					err = os.RemoveAll(p)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestPrepareAgain: a restart finds the image mounted and reuses it; after
// an unmount (a reboot) it mounts the same image again, files and limits
// kept; a directory that holds entries made before limits is not covered.
func TestPrepareAgain(t *testing.T) {
	dir := pool(t)
	base := filepath.Dir(dir)
	img := filepath.Join(base, "disk.img")
	a := filepath.Join(dir, "a")
	if err := diskquota.CreateDir(a, 4<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "kept"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if how, err := diskquota.Prepare(dir, img, diskquota.MinImageBytes); err != nil || how != diskquota.OnImage {
		t.Fatalf("Prepare on the mounted image: %q, %v", how, err)
	}
	if got := diskquota.MountedImage(dir); got != img {
		t.Fatalf("MountedImage = %q, want %q", got, img)
	}
	if err := diskquota.Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if how, err := diskquota.Prepare(dir, img, diskquota.MinImageBytes); err != nil || how != diskquota.OnImage {
		t.Fatalf("Prepare after an unmount: %q, %v", how, err)
	}
	if _, err := os.Stat(filepath.Join(a, "kept")); err != nil {
		t.Fatalf("a file after the remount: %v", err)
	}
	if _, limit, err := diskquota.Usage(a); err != nil || limit != 4<<20 {
		t.Fatalf("limit after the remount: %d, %v", limit, err)
	}

	old := filepath.Join(t.TempDir(), "sandboxes")
	if err := os.MkdirAll(filepath.Join(old, "made-before"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := diskquota.Prepare(old, filepath.Join(filepath.Dir(old), "disk.img"), diskquota.MinImageBytes); !errors.Is(err, diskquota.ErrNotEmpty) {
		t.Fatalf("Prepare over a directory in use: %v, want ErrNotEmpty", err)
	}
	if diskquota.IsBtrfs(old) {
		t.Fatal("mounted over a directory in use")
	}
}
