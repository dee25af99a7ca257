package confined

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire"
)

// resolveFlags confine every lookup to the directory it starts from.
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// openIn opens rel (a cleaned relative path) with openat2(2) relative to
// dirfd, which acts as "/" for the whole resolution. O_CLOEXEC is always
// added. EAGAIN (a concurrent rename anywhere on the system while the walk
// crossed "..") and EINTR are retried.
func openIn(dirfd int, rel string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveFlags} //nolint:gosec // open flags and a mode are non-negative bit sets; widening keeps every bit
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && i < 128 {
			continue
		}
		return fd, err
	}
}

// openParent resolves the directory holding rel's final component and
// returns an O_PATH descriptor of it with the final component. rel must not
// be ".".
func openParent(dirfd int, rel string) (int, string, error) {
	dir, base := splitPath(rel)
	fd, err := openIn(dirfd, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	return fd, base, err
}

// mkdirAll creates rel and its missing parents below dirfd, resolving every
// prefix inside dirfd. New intermediate directories get mode 0755 (less the
// umask); a newly created final directory gets exactly perm. created, if not
// nil, is called after each directory this call made and may veto going on.
// An existing non-directory at the final component is EEXIST.
func mkdirAll(dirfd int, rel string, perm uint32, created func(rel string) error) error {
	if rel == "." {
		return nil
	}
	if fd, err := openIn(dirfd, rel, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		unix.Close(fd)
		return nil
	}
	cur, err := openIn(dirfd, ".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer func() { unix.Close(cur) }()
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		last := i == len(comps)-1
		prefix := strings.Join(comps[:i+1], "/")
		next, err := openIn(dirfd, prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
		if errors.Is(err, unix.ENOENT) {
			mode := uint32(0o755)
			if last {
				mode = perm
			}
			// cur is prefix's parent as resolved above; c is a single
			// plain component, so mkdirat cannot leave it.
			err = unix.Mkdirat(cur, c, mode)
			switch {
			case err == nil:
				if last {
					if err := chmodDir(cur, c, perm); err != nil {
						return err
					}
				}
				if created != nil {
					if err := created(prefix); err != nil {
						return err
					}
				}
			case !errors.Is(err, unix.EEXIST):
				return err
			}
			next, err = openIn(dirfd, prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
		}
		if errors.Is(err, unix.ENOTDIR) && last {
			err = unix.EEXIST
		}
		if err != nil {
			return err
		}
		unix.Close(cur)
		cur = next
	}
	return nil
}

// chmodDir sets the mode of directory name in dirfd without following a
// symlink there (a swapped-in symlink makes it fail instead).
func chmodDir(dirfd int, name string, perm uint32) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, perm)
}

// withTempName calls create with fresh random names until it stops failing
// with EEXIST, and returns the name that worked. The names are short and
// fixed-length, so they fit however long the target's name is.
func withTempName(create func(name string) error) (string, error) {
	var b [8]byte
	for range 64 {
		// getrandom directly: crypto/rand would bring the FIPS module's
		// start-up work into every agent.
		_, _ = unix.Getrandom(b[:], 0)
		name := ".warren-" + hex.EncodeToString(b[:]) + ".tmp"
		err := create(name)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		return name, err
	}
	return "", unix.EEXIST
}

// writeAt atomically replaces base in the directory dirfd with the contents
// of src: it copies into a new temporary file there (O_EXCL, so never through
// a symlink), applies perm and mtime, and renames it over base. More than max
// bytes is ErrTooLarge; on any failure the temporary file is removed and base
// is untouched. It returns the bytes written.
func writeAt(dirfd int, base string, src io.Reader, perm uint32, max int64, mtime time.Time) (int64, error) {
	var fd int
	tmp, err := withTempName(func(name string) (err error) {
		fd, err = unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		return err
	})
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), tmp)
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	lim := max
	if lim < math.MaxInt64 {
		lim++
	}
	n, err := io.Copy(f, io.LimitReader(src, lim))
	if err != nil {
		return n, err
	}
	if n > max {
		return n, &Error{Op: "write", Kind: wire.ErrTooLarge, Err: fmt.Errorf("more than %d bytes", max)}
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return n, err
	}
	if !mtime.IsZero() {
		ts := unix.NsecToTimespec(mtime.UnixNano())
		_ = unix.UtimesNanoAt(dirfd, tmp, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	}
	done = true
	if err := f.Close(); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return n, err
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return n, err
	}
	return n, nil
}

// replaceWith creates a new entry under a temporary name with create and
// renames it over base in dirfd, so an existing entry (a symlink included)
// is replaced, never written through.
func replaceWith(dirfd int, base string, create func(tmp string) error) error {
	tmp, err := withTempName(create)
	if err != nil {
		return err
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	return nil
}

// readlinkAt reads the target of symlink name in dirfd ("" for dirfd itself,
// an O_PATH|O_NOFOLLOW descriptor of a symlink).
func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size || size >= 1<<16 {
			return string(buf[:n]), nil
		}
	}
}

// fileMode converts a stat mode to an os.FileMode.
func fileMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= os.ModeDir
	case unix.S_IFLNK:
		mode |= os.ModeSymlink
	case unix.S_IFIFO:
		mode |= os.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= os.ModeSocket
	case unix.S_IFCHR:
		mode |= os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		mode |= os.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

func fileType(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

// makeInfo builds the FileInfo of rel from its stat.
func makeInfo(rel string, st *unix.Stat_t, target string) wire.FileInfo {
	name := "/"
	if rel != "." {
		_, name = splitPath(rel)
	}
	return wire.FileInfo{
		Name:    name,
		Path:    display(rel),
		Size:    st.Size,
		Mode:    uint32(fileMode(st.Mode)),
		Type:    fileType(st.Mode),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Target:  target,
	}
}
