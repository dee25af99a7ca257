package diskquota

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Dirs is where a backend keeps its sandboxes' directories, and how it
// makes, measures, limits and removes them: limited directories on a
// prepared pool (OpenDirs), or plain ones (a nil *Dirs: limits off). Both
// backends use it, so a sandbox's disk is the same whatever its tier.
//
// A directory made before limits were on is a plain directory on the
// pool's file system: it keeps working, uncapped and measured by walking
// its files.
type Dirs struct {
	dir string // the pool's directory, where Prepare found or made btrfs
	how string // OnDataDir or OnImage
}

// OpenDirs prepares dir as a pool (Prepare's arguments) and returns it.
func OpenDirs(dir, image string, size int64, ignore ...string) (*Dirs, error) {
	how, err := Prepare(dir, image, size, ignore...)
	if err != nil {
		return nil, err
	}
	return &Dirs{dir: dir, how: how}, nil
}

// Mechanism is OnDataDir or OnImage, "" for a nil Dirs (limits off).
func (d *Dirs) Mechanism() string {
	if d == nil {
		return ""
	}
	return d.how
}

// Sub is a directory of the pool named name (made if missing), for
// another backend's sandboxes or another kind of limited directory: on
// the same file system, under the same quotas. A name starting with "."
// keeps it out of the parent's listing of sandboxes. nil, nil for a nil
// Dirs.
func (d *Dirs) Sub(name string) (*Dirs, error) {
	if d == nil {
		return nil, nil
	}
	p := filepath.Join(d.dir, name)
	if err := os.Mkdir(p, 0o711); err != nil && !errors.Is(err, fs.ErrExist) { //nolint:gosec // 0711: sandboxes' roots below must be traversable
		return nil, err
	}
	return &Dirs{dir: p, how: d.how}, nil
}

// Dir is the pool's directory ("" for a nil Dirs).
func (d *Dirs) Dir() string {
	if d == nil {
		return ""
	}
	return d.dir
}

// Make makes dir: a limited directory capped at maxBytes (0: measured,
// uncapped) with limits on, else a plain one of mode perm. It fails with
// fs.ErrExist when dir exists.
func (d *Dirs) Make(dir string, maxBytes int64, perm os.FileMode) error {
	if d == nil {
		return os.Mkdir(dir, perm)
	}
	return CreateDir(dir, maxBytes)
}

// Remove deletes dir and everything in it (and its quota group).
func (d *Dirs) Remove(dir string) error {
	if d == nil {
		return os.RemoveAll(dir)
	}
	return Remove(dir)
}

// Reap frees the quota groups of directories whose removal a crash cut
// short (on the whole file system: every backend's on the pool).
func (d *Dirs) Reap() error {
	if d == nil {
		return nil
	}
	_, err := Reap(d.dir)
	return err
}

// Limited reports whether dir carries a limit: a subvolume of its own,
// not a directory made before limits were on.
func (d *Dirs) Limited(dir string) bool {
	if d == nil {
		return false
	}
	id, err := SubvolumeID(dir)
	return err == nil && id != TopLevel
}

// Usage is what dir holds and its cap (0: none), as the file system
// accounts them; ok is false when dir is not limited.
func (d *Dirs) Usage(dir string) (used, limit int64, ok bool) {
	if !d.Limited(dir) {
		return 0, 0, false
	}
	used, limit, err := Usage(dir)
	if err != nil {
		return 0, 0, false
	}
	return used, limit, true
}

// SetLimit caps dir at maxBytes (0: none); a directory without a limit of
// its own (made before limits) is left as it is.
func (d *Dirs) SetLimit(dir string, maxBytes int64) error {
	if !d.Limited(dir) {
		return nil
	}
	return SetLimit(dir, maxBytes)
}

// MountHeadroom is how close to its cap a directory's files may be
// before LiftFull lifts the cap for an overlay mount: overlay's work
// directory, made again at every mount, takes a few of btrfs's metadata
// reservations (16 KiB nodes), far less than this.
const MountHeadroom = 4 << 20

// LiftFull lifts the cap of dir when its files are within MountHeadroom
// of it, until restore puts it back. Why: overlay makes its work
// directory again at every mount, and refused the space (EDQUOT) it
// mounts the root read-only, where the sandbox cannot delete a file to
// free any: a sandbox that filled its disk would never be writable again.
// A caller lifts it while the root is mounted, before any sandbox code
// runs; a crash in between is mended by applying the configured cap
// again at the next start. restore is never nil.
func (d *Dirs) LiftFull(dir string) (restore func() error, err error) {
	used, limit, ok := d.Usage(dir)
	if !ok || limit == 0 || used+MountHeadroom < limit {
		return func() error { return nil }, nil
	}
	if err := SetLimit(dir, 0); err != nil {
		return func() error { return nil }, err
	}
	return func() error { return SetLimit(dir, limit) }, nil
}

// maxWalk bounds the files DiskUsage visits, so a sandbox that made
// millions of files cannot make a metrics call expensive.
const maxWalk = 200000

// DiskUsage is the space dir takes on the host, in bytes: what the quota
// group accounts when dir is limited, else the allocated blocks of the
// files under dir/layer (the writable layer; hard links counted once; at
// most maxWalk files).
func (d *Dirs) DiskUsage(dir, layer string) (int64, error) {
	if used, _, ok := d.Usage(dir); ok {
		return used, nil
	}
	var total int64
	seen := map[uint64]bool{}
	n := 0
	err := filepath.WalkDir(filepath.Join(dir, layer), func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil //nolint:nilerr // a file that vanished mid-walk takes no space
		}
		if n++; n > maxWalk {
			return filepath.SkipAll
		}
		fi, err := e.Info()
		if err != nil {
			return nil //nolint:nilerr // as above
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if st.Nlink > 1 && !fi.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}
