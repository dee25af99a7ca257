package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestRunDiskLimit: `warren run --disk-pool SIZE --disk N` prepares the
// data directory's image on its first start and the sandbox stops at its
// cap; `--read-only` leaves /tmp writable and the rest read-only; doctor
// reports the mechanism.
func TestRunDiskLimit(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	dir := stateDir(t)
	t.Cleanup(func() {
		if diskquota.IsBtrfs(filepath.Join(dir, "data", "sandboxes")) {
			if err := diskquota.Unmount(filepath.Join(dir, "data", "sandboxes")); err != nil {
				t.Error(err)
			}
		}
	})
	r := run(t, warren(t, dir, "run", "--disk-pool", "1G", "--disk", "32M", "--", "/bin/sh", "-c", "dd if=/dev/zero of=/tmp/big bs=1M count=64"), "")
	if r.code == 0 || !strings.Contains(r.stderr+r.stdout, "Disk quota exceeded") {
		t.Fatalf("dd past --disk 32M: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := diskquota.MountedImage(filepath.Join(dir, "data", "sandboxes")); got != filepath.Join(dir, "data", "disk.img") {
		t.Fatalf("image mounted on the sandboxes' directory: %q", got)
	}
	r = run(t, warren(t, dir, "run", "--disk-pool", "1G", "--read-only", "--write-path", "/home/user", "--", "/bin/sh", "-c",
		"echo a > /tmp/a && echo b > /home/user/b && ! echo c > /etc/c"), "")
	if r.code != 0 || !strings.Contains(r.stderr, "Read-only file system") {
		t.Fatalf("--read-only: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, warren(t, dir, "doctor", "--disk-pool", "1G"), "")
	if !strings.Contains(r.stdout, "ok    disk limits") || !strings.Contains(r.stdout, diskquota.OnImage) {
		t.Errorf("doctor:\n%s%s", r.stdout, r.stderr)
	}
	r = run(t, warren(t, dir, "run", "--disk", "32M", "--", "/bin/true"), "")
	if r.code == 0 || !strings.Contains(r.stderr, "disk limits are off") {
		t.Errorf("--disk without --disk-pool: exit %d %s", r.code, r.stderr)
	}
}
