package native

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/diskquota"
)

// Disk limits (backend.Config.DiskBytes). Each sandbox's directory,
// <DataDir>/sandboxes/<id>, is a btrfs subvolume whose quota group caps
// what it references: the overlay's upper and work directories are in it,
// so everything the sandbox writes to its root, /tmp included, counts, and
// a write past the cap fails with EDQUOT in the sandbox alone. Where the
// data directory is not on btrfs, the backend makes the sparse image
// <DataDir>/disk.img (Options.DiskPool bytes) once and loop-mounts it on
// <DataDir>/sandboxes; it stays mounted across restarts (a restart finds
// it mounted and reuses it, or mounts it again after a reboot). Why this
// mechanism: docs/policy.md, "Disk limits".
//
// A sandbox directory made before limits were on is a plain directory:
// it keeps working, without a cap. An image is never mounted over such
// directories (they would vanish under it): limits stay off, with a
// warning, until they are removed.

// diskImage is the image's name under the data directory.
const diskImage = "disk.img"

// prepareDisk turns disk limits on when Options.DiskPool asks for them;
// what fails leaves them off with a warning (`warren doctor` says why).
func (b *Backend) prepareDisk() {
	if b.opts.DiskPool <= 0 {
		return
	}
	dir := filepath.Join(b.opts.DataDir, "sandboxes")
	d, err := OpenDiskPool(b.opts.DataDir, b.opts.DiskPool)
	switch {
	case errors.Is(err, diskquota.ErrNotEmpty):
		b.diskOff = "the data directory holds sandboxes made before disk limits (limits come on at the first start after they are removed)"
		b.log.Warn("disk limits off: the data directory holds sandboxes made before disk limits; they keep working without a limit, and limits come on at the first start after they are removed (or use another data directory)", "dir", dir)
	case err != nil:
		b.diskOff = err.Error()
		b.log.Warn("disk limits off: sandboxes can fill the data directory's disk", "reason", err.Error())
	default:
		b.disk = d
		b.log.Info("disk limits on", "mechanism", d.Mechanism(), "dir", dir)
	}
}

// OpenDiskPool prepares the disk pool of the data directory dataDir (its
// sandboxes' directory, on an image of size bytes where it is not on
// btrfs) as the backend does with Options.DiskPool, for a process that
// runs another backend's sandboxes on it without this one (warren run
// --isolation gvisor); diskquota.ErrNotEmpty when sandboxes made before
// limits are there.
func OpenDiskPool(dataDir string, size int64) (*diskquota.Dirs, error) {
	dir := filepath.Join(dataDir, "sandboxes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return diskquota.OpenDirs(dir, filepath.Join(dataDir, diskImage), size, removedDir)
}

// DiskLimits is how the backend enforces disk limits: "btrfs-image" (a
// btrfs image it mounted on the sandboxes' directory), "btrfs-data-dir"
// (the data directory is on btrfs), or "" (off: Config.DiskBytes is not
// enforced).
func (b *Backend) DiskLimits() string { return b.disk.Mechanism() }

// DiskLimitsOff says why disk limits Options.DiskPool asked for are off
// ("" when they are on, or were not asked for).
func (b *Backend) DiskLimitsOff() string { return b.diskOff }

// DiskDirs is the disk pool (nil with limits off), for another backend to
// keep its sandboxes on under the same limits (Dirs.Sub).
func (b *Backend) DiskDirs() *diskquota.Dirs { return b.disk }

// WorkspacePool is where workspaces keep kernel-limited directories
// (package workspace, Options.Pool) when disk limits are on: a directory
// on the disk pool beside the sandboxes', whose name, starting with ".",
// keeps it out of IDs and ReapOrphans; diskquota.Reap passes over its
// subvolumes' quota groups, which reference their root at least. "" with
// limits off.
func (b *Backend) WorkspacePool() string {
	if b.disk == nil {
		return ""
	}
	return filepath.Join(b.disk.Dir(), ".workspaces")
}

// mkSandboxDir makes a sandbox's directory: a subvolume capped at
// maxBytes (0: measured, uncapped) with limits on, else a plain one.
func (b *Backend) mkSandboxDir(dir string, maxBytes int64) error {
	// 0711: the sandbox's root (a uid in the mapped range) must traverse
	// its dir to reach rootfs.
	return b.disk.Make(dir, maxBytes, 0o711)
}

// removeTree deletes a sandbox's directory (a subvolume with limits on).
func (b *Backend) removeTree(dir string) error { return b.disk.Remove(dir) }

// reapDisk frees the quota groups of sandbox directories whose deletion
// a crash cut short.
func (b *Backend) reapDisk() error { return b.disk.Reap() }

// setDiskLimit applies a cap at start (a new one SetConfig gave, or the
// config's after Open, whatever the stored one is).
func (s *Sandbox) setDiskLimit(maxBytes int64) {
	if err := s.b.disk.SetLimit(s.dir, maxBytes); err != nil {
		s.b.log.Warn("change a sandbox's disk limit", "id", s.cfg.ID, "err", err.Error())
		return
	}
	s.diskCap = maxBytes
}

// liftFullCap lifts the cap of a sandbox whose files fill it while the
// agent mounts its root (diskquota.Dirs.LiftFull says why), until the
// returned function puts it back.
func (s *Sandbox) liftFullCap() (restore func()) {
	put, err := s.b.disk.LiftFull(s.dir)
	if err != nil {
		s.b.log.Warn("lift a full sandbox's disk limit for its mount", "id", s.cfg.ID, "err", err.Error())
	}
	return func() {
		if err := put(); err != nil {
			// Not left without a cap: the next start or Open applies it.
			s.diskCap = -1
			s.b.log.Warn("put a sandbox's disk limit back", "id", s.cfg.ID, "err", err.Error())
		}
	}
}

// quotaUsage is what the sandbox's directory holds and its cap (0: none),
// as the file system accounts them; ok is false without a limited
// directory (the caller measures the files instead).
func (s *Sandbox) quotaUsage() (used, limit int64, ok bool) { return s.b.disk.Usage(s.dir) }

// DiskLimit is the cap on what the sandbox keeps on disk, as enforced: 0
// when it has none (limits off, no limit asked, or a directory made
// before limits).
func (s *Sandbox) DiskLimit() int64 {
	_, limit, _ := s.quotaUsage()
	return limit
}
