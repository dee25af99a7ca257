package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/confined"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// Dir is the local store: a workspace's content is its directory
// <Root>/<ns>/<name>.
type Dir struct{ Root string }

// Kind is "dir".
func (d *Dir) Kind() string { return "dir" }

// Dir is <Root>/<ns>/<name>.
func (d *Dir) Dir(ns, name string) string { return filepath.Join(d.Root, ns, name) }

// Pull does nothing: the directory is the content.
func (d *Dir) Pull(context.Context, string, string, *confined.Root) (SyncStats, error) {
	return SyncStats{}, nil
}

// Push does nothing: the directory is the content.
func (d *Dir) Push(context.Context, string, string, *confined.Root) (SyncStats, error) {
	return SyncStats{}, nil
}

// Delete does nothing beyond the directory, which Manager.Remove removes.
func (d *Dir) Delete(context.Context, string, string) error { return nil }

// withWriter runs f with dir opened confined, on an OS thread of its own
// whose file-system ids are the sandboxes' root's (Options.UID/GID), so
// that what f creates in the workspace is owned as if a sandbox had
// written it, and whose effective capabilities are those sandbox root has
// over its own files (override of permission bits, ownership checks):
// root of a sandbox can read and replace anything its users wrote, and so
// can the server for it, confined to dir. The thread is never unlocked:
// it ends with the goroutine, its ids with it.
func (m *Manager) withWriter(dir string, f func(*confined.Root) (SyncStats, error)) (SyncStats, error) {
	root, err := confined.Open(dir)
	if err != nil {
		return SyncStats{}, fmt.Errorf("open workspace: %w", err)
	}
	defer func() { _ = root.Close() }()
	type result struct {
		s   SyncStats
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := becomeSandboxRoot(m.opts.UID, m.opts.GID); err != nil {
			done <- result{err: err}
			return
		}
		s, err := f(root)
		done <- result{s, err}
	}()
	r := <-done
	return r.s, r.err
}

// sandboxRootCaps are the capabilities the writer thread keeps: what root
// of a user namespace has over files of ids mapped in it.
var sandboxRootCaps = []uint{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER, unix.CAP_CHOWN}

func becomeSandboxRoot(uid, gid int) error {
	if uid == 0 && gid == 0 {
		return nil
	}
	_, _ = unix.SetfsgidRetGid(gid) // checked below
	_, _ = unix.SetfsuidRetUid(uid)
	// The calls report the previous ids, not errors: asked again with
	// an invalid id, they say what is in force.
	if g, _ := unix.SetfsgidRetGid(-1); g != gid {
		return fmt.Errorf("set the writer's file-system gid to %d: still %d", gid, g)
	}
	if u, _ := unix.SetfsuidRetUid(-1); u != uid {
		return fmt.Errorf("set the writer's file-system uid to %d: still %d", uid, u)
	}
	// Changing the fs uid from 0 cleared the file capabilities from the
	// thread's effective set; they stay permitted, and come back here.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("writer capabilities: %w", err)
	}
	for _, c := range sandboxRootCaps {
		data[c/32].Effective |= 1 << (c % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("writer capabilities: %w", err)
	}
	return nil
}

// Upload extracts the tar stream r into ns/name (package confined's
// hostile-archive rules), within what is left of its quota: an archive
// that would pass it fails with limit, the entries before it kept.
func (m *Manager) Upload(ns, name string, r io.Reader) (confined.TarStats, error) {
	if err := checkNames(ns, name); err != nil {
		return confined.TarStats{}, err
	}
	// Under the workspace's lock: two uploads cannot both take the
	// quota's last bytes; an object store's sync does not run meanwhile.
	defer m.lock(ns, name)()
	info, err := m.read(ns, name)
	if err != nil {
		return confined.TarStats{}, err
	}
	_, dir, err := m.place(info)
	if err != nil {
		return confined.TarStats{}, err
	}
	used, err := Usage(dir)
	if err != nil {
		return confined.TarStats{}, fmt.Errorf("workspace %q: usage: %w", name, err)
	}
	left := info.Quota - used
	if left <= 0 {
		return confined.TarStats{}, quotaErr(name, used, info.Quota)
	}
	var stats confined.TarStats
	_, err = m.withWriter(dir, func(root *confined.Root) (SyncStats, error) {
		var err error
		stats, err = root.ExtractTar(r, "/", confined.TarLimits{MaxBytes: left})
		return SyncStats{}, err
	})
	if err != nil {
		if confined.Kind(err) == wire.ErrTooLarge {
			return stats, errdefs.Errorf(errdefs.ErrLimit, "workspace %q: the archive's files pass its quota of %d bytes (%d used before it): %v", name, info.Quota, used, err)
		}
		return stats, confinedErr(err)
	}
	return stats, nil
}

func quotaErr(name string, used, quota int64) error {
	return errdefs.Errorf(errdefs.ErrLimit, "workspace %q uses %d bytes of its quota of %d bytes", name, used, quota)
}

// confinedErr maps package confined's kinds to errdefs'.
func confinedErr(err error) error {
	switch confined.Kind(err) {
	case wire.ErrInvalid:
		return errdefs.Errorf(errdefs.ErrInvalid, "%w", err)
	case wire.ErrNotFound:
		return errdefs.Errorf(errdefs.ErrNotFound, "%w", err)
	case wire.ErrLimit:
		return errdefs.Errorf(errdefs.ErrLimit, "%w", err)
	case wire.ErrTooLarge:
		return errdefs.Errorf(errdefs.ErrTooLarge, "%w", err)
	}
	return err
}

// Download writes ns/name's files to w as a tar stream (package
// confined's WriteTar: symlinks kept, special files skipped).
func (m *Manager) Download(ns, name string, w io.Writer) error {
	if err := checkNames(ns, name); err != nil {
		return err
	}
	info, err := m.read(ns, name)
	if err != nil {
		return err
	}
	_, dir, err := m.place(info)
	if err != nil {
		return err
	}
	_, err = m.withWriter(dir, func(root *confined.Root) (SyncStats, error) {
		return SyncStats{}, root.WriteTar(w, "/")
	})
	return err
}

// Usage limits: a tree deeper or larger than this is not counted (an
// error) rather than walked without end.
const (
	maxUsageDepth   = 256
	maxUsageEntries = 10_000_000
)

// Usage is the bytes the files under dir take on disk (allocated blocks,
// as disk quotas count them; a file with several links counted once). The
// walk never follows a symlink nor re-resolves a path: each directory is
// opened relative to its parent's descriptor with O_NOFOLLOW.
func Usage(dir string) (int64, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	u := &usage{seen: map[[2]uint64]bool{}}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, err
	}
	u.bytes = st.Blocks * 512
	err = u.dir(fd, 0)
	return u.bytes, err
}

type usage struct {
	bytes   int64
	entries int
	seen    map[[2]uint64]bool // hard-linked files counted
}

// dir counts what directory fd holds, and closes fd.
func (u *usage) dir(fd, depth int) error {
	f := os.NewFile(uintptr(fd), "dir")
	defer func() { _ = f.Close() }()
	if depth > maxUsageDepth {
		return fmt.Errorf("directories nested deeper than %d", maxUsageDepth)
	}
	for {
		names, err := f.Readdirnames(1024)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, n := range names {
			if u.entries++; u.entries > maxUsageEntries {
				return fmt.Errorf("more than %d entries", maxUsageEntries)
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue // removed meanwhile
				}
				return err
			}
			if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				k := [2]uint64{st.Dev, st.Ino}
				if u.seen[k] {
					continue
				}
				u.seen[k] = true
			}
			u.bytes += st.Blocks * 512
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				continue // replaced meanwhile
			}
			if err != nil {
				return err
			}
			if err := u.dir(sub, depth+1); err != nil {
				return err
			}
		}
	}
}
