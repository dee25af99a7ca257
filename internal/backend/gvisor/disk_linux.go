package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/warren-sandbox/warren/internal/backend"
)

// Disk limits (backend.Config.DiskBytes), as on the native backend and on
// the same pool (Options.Disk, the native backend's): each sandbox's
// directory is a btrfs subvolume under a quota group, in the pool's
// directory gvisorDisk. Its writable layer (upper, work) and so /tmp
// (bound from it, buildSpec) are in it; runsc's gofer writes them as
// host files, and passes the host's EDQUOT to the writer in the sandbox.
//
// Sandboxes made before limits were on, in <DataDir>/sandboxes, keep
// working there without a cap: limits stay off (DiskLimitsOff says why)
// until they are removed, as the native backend does.

// gvisorDisk is this backend's directory on the pool; its leading "."
// keeps it out of the native backend's sandboxes.
const gvisorDisk = ".gvisor"

// openDisk chooses where sandboxes' directories go (b.sandboxes) and
// whether they are limited (b.disk).
func (b *Backend) openDisk() error {
	plain := filepath.Join(b.opts.DataDir, "sandboxes")
	b.sandboxes = plain
	if b.opts.Disk == nil {
		return nil
	}
	ents, err := os.ReadDir(plain)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			b.diskOff = "the data directory holds gvisor sandboxes made before disk limits (limits come on at the first start after they are removed)"
			b.log.Warn("gvisor disk limits off: sandboxes made before disk limits keep working without a limit; limits come on at the first start after they are removed", "dir", plain)
			return nil
		}
	}
	d, err := b.opts.Disk.Sub(gvisorDisk)
	if err != nil {
		return fmt.Errorf("disk pool: %w", err)
	}
	b.disk, b.sandboxes = d, d.Dir()
	return nil
}

// DiskLimits is how the backend enforces disk limits (the pool's
// mechanism, diskquota.OnImage or OnDataDir), "" when it does not: the
// sandbox manager then gives its sandboxes none by default, and Create
// refuses one asked for (checkDisk).
func (b *Backend) DiskLimits() string { return b.disk.Mechanism() }

// DiskLimitsOff says why disk limits Options.Disk asked for are off ("" when
// they are on, or were not asked for).
func (b *Backend) DiskLimitsOff() string { return b.diskOff }

// checkDisk refuses a disk limit the backend cannot enforce, rather than
// start a sandbox without it.
func (b *Backend) checkDisk(cfg backend.Config) error {
	if cfg.DiskBytes > 0 && b.disk == nil {
		return fmt.Errorf("isolation gvisor: disk limits are off on this server (--disk-pool; warren doctor says why): %w", backend.ErrUnsupported)
	}
	return nil
}

// mountLimitedRoot mounts the sandbox's root with its disk limit applied
// (a new one SetConfig gave, or the same), the cap lifted while overlay
// mounts when the files fill it (diskquota.Dirs.LiftFull says why).
func (s *Sandbox) mountLimitedRoot(cfg backend.Config, dir string, layers []string) error {
	d := s.b.disk
	if err := d.SetLimit(dir, cfg.DiskBytes); err != nil {
		return err
	}
	restore, err := d.LiftFull(dir)
	if err != nil {
		return err
	}
	err = mountRoot(filepath.Join(dir, "rootfs"), layers, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if rerr := restore(); rerr != nil && err == nil {
		// The sandbox would run uncapped: refused (release unmounts).
		err = fmt.Errorf("put the disk limit back: %w", rerr)
	}
	return err
}

// DiskUsage implements backend.DiskUser: what the sandbox's directory
// holds as its quota group accounts it, or its writable layer's files
// without a limited directory.
func (s *Sandbox) DiskUsage() (int64, error) {
	return s.b.disk.DiskUsage(s.b.sandboxDir(s.id), "upper")
}

// DiskLimit implements backend.DiskLimiter: the cap in force on the
// sandbox's directory (0: none).
func (s *Sandbox) DiskLimit() int64 {
	_, limit, _ := s.b.disk.Usage(s.b.sandboxDir(s.id))
	return limit
}
