package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/confined"
)

// Binds: a sandbox's volumes and the writable paths of its read-only root
// are binds in the OCI spec, which runsc's gofer mounts from their host
// paths, following symlinks on the host. Both kinds of path can be the
// sandbox's to change: a writable path lies in its own writable layer
// (where it may have left a symlink to /etc), and a volume's host path may
// lie in a directory another sandbox writes to. So before runsc starts,
// the backend resolves each once without following symlinks (a writable
// path inside the root, a volume on the host) and pins what it found as a
// mount at <RunDir>/.binds/<id>/<n>, which only this process can change;
// the spec names the pin. The targets inside the root are made (and
// checked) the same way, so a planted symlink fails the start rather than
// leading the gofer's mount elsewhere in the sandbox.

// bindsDir is where the pins live, beside (never inside) the bundles: a
// bundle's removal (os.RemoveAll) never walks into a pinned volume.
const bindsDir = ".binds"

func (b *Backend) pinDir(id string) string { return filepath.Join(b.opts.RunDir, bindsDir, id) }

// pinBinds pins spec's writable-path binds (a relative source: a path in
// the root) and its last nVolumes mounts (the volumes) and points the spec
// at the pins. On error what it pinned stays for unpinBinds (release).
func (b *Backend) pinBinds(id string, spec *specs.Spec, rootfs string, nVolumes int) error {
	rootFD, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the root: %w", err)
	}
	defer unix.Close(rootFD)
	dir := b.pinDir(id)
	first := len(spec.Mounts) - nVolumes
	for i := range spec.Mounts {
		m := &spec.Mounts[i]
		writable := m.Type == "bind" && !filepath.IsAbs(m.Source)
		if !writable && i < first {
			continue // the image's and the standard mounts: the host's own
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		var src int
		if writable {
			src, err = confined.EnsureInRoot(rootFD, m.Source, false, true)
		} else {
			src, err = unix.Openat2(unix.AT_FDCWD, m.Source, &unix.OpenHow{
				Flags:   unix.O_PATH | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
			})
			if errors.Is(err, unix.ELOOP) {
				err = errors.New("it passes through a symbolic link")
			}
		}
		if err != nil {
			return fmt.Errorf("bind source %s: %w", m.Source, err)
		}
		pin, err := pinFD(src, filepath.Join(dir, strconv.Itoa(i)), slices.Contains(m.Options, "ro"))
		unix.Close(src)
		if err != nil {
			return fmt.Errorf("bind source %s: %w", m.Source, err)
		}
		// The target, made in the root now (by the host, inside the
		// root, no symlink followed) so that the gofer finds it made.
		dst, err := confined.EnsureInRoot(rootFD, m.Destination, !pin.dir, true)
		if err != nil {
			return fmt.Errorf("bind target %s: %w", m.Destination, err)
		}
		unix.Close(dst)
		m.Source = pin.path
	}
	return nil
}

type pinned struct {
	path string
	dir  bool
}

// pinFD binds the file or directory open at fd onto a new mount point at
// p (nosuid, nodev, and read-only with ro).
func pinFD(fd int, p string, ro bool) (pinned, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return pinned{}, err
	}
	pin := pinned{path: p, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR}
	if pin.dir {
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return pin, err
		}
	} else {
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return pin, errors.New("not a directory or regular file")
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o600) //nolint:gosec // p is under the backend's own RunDir
		if err != nil {
			return pin, err
		}
		_ = f.Close()
	}
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(fd), p, "", unix.MS_BIND, ""); err != nil {
		return pin, fmt.Errorf("pin at %s: %w", p, err)
	}
	// A bind remount sets every per-mount flag: the source mount's
	// own (read-only, noexec, atime) are kept, nosuid and nodev added.
	var sfs unix.Statfs_t
	if err := unix.Statfs(p, &sfs); err != nil {
		return pin, err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	for _, f := range []struct{ st, ms uintptr }{
		{unix.ST_RDONLY, unix.MS_RDONLY}, {unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if uintptr(sfs.Flags)&f.st != 0 { //nolint:gosec // G115: mount flags, non-negative
			flags |= f.ms
		}
	}
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", p, "", flags, ""); err != nil {
		return pin, fmt.Errorf("remount the pin at %s: %w", p, err)
	}
	return pin, nil
}

// unpinBinds unmounts and removes the sandbox's pins. Entries are removed
// one by one (never RemoveAll): one still mounted stays, with an error,
// rather than its volume's files being deleted through it.
func (b *Backend) unpinBinds(id string) error {
	dir := b.pinDir(id)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		for isMounted(p) {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unpin %s: %w", p, err))
				break
			}
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
