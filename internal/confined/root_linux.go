package confined

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire"
)

// DefaultListLimit is List's entry limit when none is given.
const DefaultListLimit = 10000

// Root is a directory that confines every operation on it. Its methods are
// safe for concurrent use.
type Root struct {
	mu sync.RWMutex // held for reading by every operation, for writing by Close
	fd int          // O_PATH|O_DIRECTORY descriptor of the root; -1 once closed
}

// Open opens dir as a Root. dir itself is trusted (it comes from the agent,
// not a client) and may be reached through symlinks. It fails when the
// kernel lacks openat2(2) with RESOLVE_IN_ROOT (Linux 5.6) or a seccomp
// filter blocks it, since nothing could be confined without it.
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &Error{Op: "open root", Path: dir, Err: err}
	}
	probe, err := openIn(fd, ".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		unix.Close(fd)
		return nil, &Error{Op: "open root", Path: dir, Kind: wire.ErrInternal,
			Err: fmt.Errorf("openat2 with RESOLVE_IN_ROOT unavailable: %w", err)}
	}
	unix.Close(probe)
	return &Root{fd: fd}, nil
}

// Close releases the root's descriptor. It waits for operations in flight;
// later calls fail.
func (r *Root) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fd < 0 {
		return os.ErrClosed
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// acquire returns the root descriptor, held until release.
func (r *Root) acquire() (int, error) {
	r.mu.RLock()
	if r.fd < 0 {
		r.mu.RUnlock()
		return -1, &Error{Op: "root", Kind: wire.ErrInternal, Err: os.ErrClosed}
	}
	return r.fd, nil
}

func (r *Root) release() { r.mu.RUnlock() }

func opErr(op, rel string, err error) error {
	if err == nil {
		return nil
	}
	if fe := (*Error)(nil); errors.As(err, &fe) && fe.Path == "" {
		fe.Op, fe.Path = op, display(rel)
		return fe
	}
	return &Error{Op: op, Path: display(rel), Err: err}
}

func kindErr(op, rel, kind, msg string) error {
	return &Error{Op: op, Path: display(rel), Kind: kind, Err: errorString(msg)}
}

// Stat describes name without following a final symlink (lstat); Target is
// set for symlinks.
func (r *Root) Stat(name string) (wire.FileInfo, error) {
	rel, err := cleanPath(name)
	if err != nil {
		return wire.FileInfo{}, err
	}
	root, err := r.acquire()
	if err != nil {
		return wire.FileInfo{}, err
	}
	defer r.release()
	fd, err := openIn(root, rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return wire.FileInfo{}, opErr("stat", rel, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return wire.FileInfo{}, opErr("stat", rel, err)
	}
	var target string
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		if target, err = readlinkAt(fd, ""); err != nil {
			return wire.FileInfo{}, opErr("stat", rel, err)
		}
	}
	return makeInfo(rel, &st, target), nil
}

// List describes the entries of directory name (a final symlink is
// followed, inside the root), sorted by name, each as Stat would. A
// directory with more than limit entries (DefaultListLimit when limit <= 0)
// is an error of kind too_large; only limit+1 names are ever read.
func (r *Root) List(name string, limit int) ([]wire.FileInfo, error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, 1<<30) // limit+1 must not overflow
	rel, err := cleanPath(name)
	if err != nil {
		return nil, err
	}
	root, err := r.acquire()
	if err != nil {
		return nil, err
	}
	defer r.release()
	fd, err := openIn(root, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, opErr("list", rel, err)
	}
	dir := os.NewFile(uintptr(fd), display(rel))
	defer func() { _ = dir.Close() }()
	names, err := dir.Readdirnames(limit + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, opErr("list", rel, err)
	}
	if len(names) > limit {
		return nil, kindErr("list", rel, wire.ErrTooLarge, fmt.Sprintf("directory has more than %d entries", limit))
	}
	infos := make([]wire.FileInfo, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			return nil, opErr("list", joinPath(rel, n), err)
		}
		var target string
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if target, err = readlinkAt(fd, n); err != nil {
				if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
					continue // removed or replaced meanwhile
				}
				return nil, opErr("list", joinPath(rel, n), err)
			}
		}
		infos = append(infos, makeInfo(joinPath(rel, n), &st, target))
	}
	slices.SortFunc(infos, func(a, b wire.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos, nil
}

// Open opens the regular file name for reading, following a final symlink
// inside the root, and describes it (the file reached, under the name
// asked for). Anything else — directories, FIFOs, devices, sockets — is
// refused with kind invalid without blocking: the type is checked on an
// O_PATH descriptor before the file is opened, and again (fstat) after the
// O_NONBLOCK|O_NOCTTY open, in case it was swapped in between.
func (r *Root) Open(name string) (*os.File, wire.FileInfo, error) {
	rel, err := cleanPath(name)
	if err != nil {
		return nil, wire.FileInfo{}, err
	}
	root, err := r.acquire()
	if err != nil {
		return nil, wire.FileInfo{}, err
	}
	defer r.release()
	var st unix.Stat_t
	pfd, err := openIn(root, rel, unix.O_PATH, 0)
	if err != nil {
		return nil, wire.FileInfo{}, opErr("open", rel, err)
	}
	err = unix.Fstat(pfd, &st)
	unix.Close(pfd)
	if err != nil {
		return nil, wire.FileInfo{}, opErr("open", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, wire.FileInfo{}, notRegular("open", rel, st.Mode)
	}
	fd, err := openIn(root, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, wire.FileInfo{}, opErr("open", rel, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, wire.FileInfo{}, opErr("open", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, wire.FileInfo{}, notRegular("open", rel, st.Mode)
	}
	// A regular file never blocks; os.NewFile must see a blocking
	// descriptor or reads would fail with EAGAIN.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, wire.FileInfo{}, opErr("open", rel, err)
	}
	return os.NewFile(uintptr(fd), display(rel)), makeInfo(rel, &st, ""), nil
}

func notRegular(op, rel string, mode uint32) error {
	what := "not a regular file"
	if mode&unix.S_IFMT == unix.S_IFDIR {
		what = "is a directory"
	}
	return kindErr(op, rel, wire.ErrInvalid, what)
}

// WriteFile atomically replaces name with the contents of src: the data goes
// to a new temporary file in the same directory (created with O_EXCL, so
// never through a symlink), which is renamed over name once complete. A
// symlink at name is replaced, not followed. The parent directory must exist
// (intermediate symlinks are followed inside the root). The file gets
// exactly mode's permission bits (setuid, setgid and sticky are dropped;
// no umask). More than max bytes (wire.MaxFileWrite when max <= 0) fails
// with kind too_large and leaves nothing behind; so does any other error.
// It returns the bytes written.
func (r *Root) WriteFile(name string, src io.Reader, mode os.FileMode, max int64) (int64, error) {
	if max <= 0 {
		max = wire.MaxFileWrite
	}
	rel, err := cleanPath(name)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, kindErr("write", rel, wire.ErrInvalid, "is the root directory")
	}
	root, err := r.acquire()
	if err != nil {
		return 0, err
	}
	defer r.release()
	pfd, base, err := openParent(root, rel)
	if err != nil {
		return 0, opErr("write", rel, err)
	}
	defer unix.Close(pfd)
	n, err := writeAt(pfd, base, src, uint32(mode.Perm()), max, time.Time{})
	return n, opErr("write", rel, err)
}

// Mkdir creates directory name with exactly mode's permission bits (no
// umask; setuid, setgid and sticky dropped). Without parents the parent must
// exist (not_found) and name must not (exists). With parents, missing
// intermediate directories are created with mode 0755 and an existing
// directory at name is not an error.
func (r *Root) Mkdir(name string, parents bool, mode os.FileMode) error {
	rel, err := cleanPath(name)
	if err != nil {
		return err
	}
	root, err := r.acquire()
	if err != nil {
		return err
	}
	defer r.release()
	perm := uint32(mode.Perm())
	if parents {
		return opErr("mkdir", rel, mkdirAll(root, rel, perm, nil))
	}
	if rel == "." {
		return opErr("mkdir", rel, unix.EEXIST)
	}
	pfd, base, err := openParent(root, rel)
	if err != nil {
		return opErr("mkdir", rel, err)
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, perm); err != nil {
		return opErr("mkdir", rel, err)
	}
	return opErr("mkdir", rel, chmodDir(pfd, base, perm))
}

// Remove removes name; a final symlink is removed, not followed. A
// non-empty directory needs recursive (otherwise kind invalid). The
// recursive walk works on descriptors, never follows symlinks and does not
// descend into other mounted file systems (removing such a tree fails with
// kind permission once the mount point is reached). Removing the root
// itself is refused with kind permission.
func (r *Root) Remove(name string, recursive bool) error {
	rel, err := cleanPath(name)
	if err != nil {
		return err
	}
	if rel == "." {
		return kindErr("remove", rel, wire.ErrPermission, "refusing to remove the root")
	}
	root, err := r.acquire()
	if err != nil {
		return err
	}
	defer r.release()
	pfd, base, err := openParent(root, rel)
	if err != nil {
		return opErr("remove", rel, err)
	}
	defer unix.Close(pfd)
	if recursive {
		return opErr("remove", rel, removeAll(pfd, base, 0, false))
	}
	err = unix.Unlinkat(pfd, base, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return kindErr("remove", rel, wire.ErrInvalid, "directory not empty (remove it recursively)")
		}
	}
	return opErr("remove", rel, err)
}

// removeAll removes name in dirfd and, if it is a directory, everything
// below it. Directories on another device than dev (when haveDev) are not
// entered.
func removeAll(dirfd int, name string, dev uint64, haveDev bool) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	for range 8 {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			// Replaced by a non-directory meanwhile.
			if err := unix.Unlinkat(dirfd, name, 0); !errors.Is(err, unix.EISDIR) {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		dir := os.NewFile(uintptr(fd), name)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			_ = dir.Close()
			return err
		}
		if haveDev && st.Dev != dev {
			_ = dir.Close()
			return &Error{Op: "remove", Kind: wire.ErrPermission, Err: errorString("refusing to cross a mount point")}
		}
		err = removeChildren(dir, fd, st.Dev)
		_ = dir.Close()
		if err != nil {
			return err
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return err
		}
		// Something was created meanwhile: go again.
	}
	return unix.ENOTEMPTY
}

func removeChildren(dir *os.File, fd int, dev uint64) error {
	for {
		names, err := dir.Readdirnames(256)
		for _, n := range names {
			if err := removeAll(fd, n, dev, true); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Move renames from to to, with rename(2) semantics: an existing file at to
// is replaced, a directory may replace an empty directory, and a final
// symlink at either end is the entry itself, not its target. Moving the root
// or onto the root is refused with kind invalid.
func (r *Root) Move(from, to string) error {
	frel, err := cleanPath(from)
	if err != nil {
		return err
	}
	trel, err := cleanPath(to)
	if err != nil {
		return err
	}
	if frel == "." || trel == "." {
		return kindErr("move", ".", wire.ErrInvalid, "cannot move the root or onto it")
	}
	root, err := r.acquire()
	if err != nil {
		return err
	}
	defer r.release()
	fpfd, fbase, err := openParent(root, frel)
	if err != nil {
		return opErr("move", frel, err)
	}
	defer unix.Close(fpfd)
	tpfd, tbase, err := openParent(root, trel)
	if err != nil {
		return opErr("move", trel, err)
	}
	defer unix.Close(tpfd)
	if err := unix.Renameat(fpfd, fbase, tpfd, tbase); err != nil {
		return &Error{Op: "move", Path: display(frel) + " -> " + display(trel), Err: err}
	}
	return nil
}
