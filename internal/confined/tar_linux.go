package confined

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire"
)

// Tar limit defaults.
const (
	DefaultTarMaxBytes   = 1 << 30
	DefaultTarMaxEntries = 100000
)

// TarLimits bound an extraction. Zero fields take the defaults.
type TarLimits struct {
	// MaxBytes bounds the regular-file bytes written in total
	// (DefaultTarMaxBytes). Exceeding it is kind too_large.
	MaxBytes int64
	// MaxEntries bounds the archive's entries, plus the directories created
	// implicitly as parents of entries (DefaultTarMaxEntries). Exceeding
	// it is kind limit.
	MaxEntries int64
	// MaxEntrySize bounds one regular file (MaxBytes). Exceeding it is
	// kind too_large.
	MaxEntrySize int64
}

// TarStats says what an extraction did.
type TarStats struct {
	Files     int64 `json:"files"`
	Dirs      int64 `json:"dirs"`
	Symlinks  int64 `json:"symlinks"`
	Hardlinks int64 `json:"hardlinks"`
	// Skipped counts entries not extracted: devices, FIFOs and unknown
	// types.
	Skipped int64 `json:"skipped"`
	// Bytes is the regular-file data written.
	Bytes int64 `json:"bytes"`
}

// WriteTar writes a tar archive of name to w. A regular file or a symlink
// (name is not followed) is one entry under its base name; a directory is
// its contents, with names relative to it and no entry for itself. The tree
// is walked with directory descriptors and *at calls, never re-joined
// paths; symlinks are stored as symlinks, sockets, FIFOs and devices are
// skipped, and entries that vanish or change type during the walk are
// skipped. Files with several hard links are stored as separate copies. A file that
// shrinks while being read is padded with zeros to the size in its header.
// Mode bits, mtime (to the second) and numeric owner are recorded.
func (r *Root) WriteTar(w io.Writer, name string) error {
	rel, err := cleanPath(name)
	if err != nil {
		return err
	}
	root, err := r.acquire()
	if err != nil {
		return err
	}
	defer r.release()
	tw := &tarWriter{tw: tar.NewWriter(w), buf: make([]byte, 64<<10)}
	if rel == "." {
		fd, oerr := openIn(root, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if oerr != nil {
			return opErr("tar", rel, oerr)
		}
		err = tw.dir(fd, "")
	} else {
		pfd, base, err2 := openParent(root, rel)
		if err2 != nil {
			return opErr("tar", rel, err2)
		}
		err = tw.entry(pfd, base, base, true)
		unix.Close(pfd)
	}
	if err != nil {
		return opErr("tar", rel, err)
	}
	return opErr("tar", rel, tw.tw.Close())
}

type tarWriter struct {
	tw  *tar.Writer
	buf []byte
}

// vanished reports errors meaning an entry was removed or replaced during
// the walk.
func vanished(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// entry writes name in dirfd as tarName. When top, a directory contributes
// only its contents and a vanished or special file is an error.
func (tw *tarWriter) entry(dirfd int, name, tarName string, top bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if !top && vanished(err) {
			return nil
		}
		return err
	}
	hdr := &tar.Header{
		Name:    tarName,
		Mode:    int64(st.Mode & 0o7777),
		ModTime: time.Unix(st.Mtim.Sec, 0),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return tw.file(dirfd, name, hdr, top)
	case unix.S_IFDIR:
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if !top && vanished(err) {
				return nil
			}
			return err
		}
		if top {
			return tw.dir(fd, "")
		}
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		if err := tw.tw.WriteHeader(hdr); err != nil {
			unix.Close(fd)
			return err
		}
		return tw.dir(fd, hdr.Name)
	case unix.S_IFLNK:
		target, err := readlinkAt(dirfd, name)
		if err != nil {
			if !top && (vanished(err) || errors.Is(err, unix.EINVAL)) {
				return nil
			}
			return err
		}
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = target
		return tw.tw.WriteHeader(hdr)
	}
	if top {
		return &Error{Kind: wire.ErrInvalid, Err: errorString("not a regular file, directory or symlink")}
	}
	return nil
}

func (tw *tarWriter) file(dirfd int, name string, hdr *tar.Header, top bool) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if !top && vanished(err) {
			return nil
		}
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		// Swapped for something else since the fstatat.
		unix.Close(fd)
		if top {
			return &Error{Kind: wire.ErrInvalid, Err: errorString("not a regular file")}
		}
		return nil
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer func() { _ = f.Close() }()
	hdr.Typeflag = tar.TypeReg
	hdr.Size = st.Size
	hdr.Mode = int64(st.Mode & 0o7777)
	if err := tw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(tw.tw, io.LimitReader(f, st.Size), tw.buf)
	if err != nil {
		return err
	}
	clear(tw.buf)
	for n < st.Size {
		m, err := tw.tw.Write(tw.buf[:min(int64(len(tw.buf)), st.Size-n)])
		n += int64(m)
		if err != nil {
			return err
		}
	}
	return nil
}

// dir writes the entries of the directory fd (which it closes) with names
// prefixed by prefix.
func (tw *tarWriter) dir(fd int, prefix string) error {
	d := os.NewFile(uintptr(fd), prefix)
	defer func() { _ = d.Close() }()
	for {
		names, err := d.Readdirnames(256)
		slices.Sort(names)
		for _, n := range names {
			if err := tw.entry(fd, n, prefix+n, false); err != nil {
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

// ExtractTar extracts the tar stream src into directory name, which is
// created (with parents, mode 0755) if missing, and says what it did.
//
// The archive is untrusted. The destination directory is the root of the
// extraction: entry names follow the package's path rules relative to it
// (a leading "/" is dropped, so "/abs" becomes dest/abs; a ".." component,
// NUL byte or over-long name fails the whole extraction with kind invalid),
// and every lookup is openat2 RESOLVE_IN_ROOT from it, so symlinks already
// in the destination or created by earlier entries are followed but can
// never lead out of it.
//
// Per entry type:
//   - regular files are written like WriteFile (temporary file, then
//     rename over the name, replacing whatever non-directory was there,
//     a symlink included);
//   - directories are created, or kept if they exist; a non-directory in
//     the way is removed. An entry naming the destination itself ("./")
//     is ignored, and the modes of directories that existed before the
//     extraction are not changed;
//   - symlinks are created with their target verbatim;
//   - hardlinks must name an existing regular file inside the destination
//     (under the same path rules), else the extraction fails with kind
//     invalid; they are made with linkat relative to directory descriptors;
//   - devices, FIFOs and unknown types are skipped and counted in Skipped.
//
// Permission bits are kept, setuid, setgid and sticky are stripped, and
// mtimes are restored on files and created directories; ownership is not
// applied (everything belongs to the caller). Missing parent directories are
// created with mode 0755. Limits are checked against the header before any
// data is written and again while streaming.
//
// On error, entries extracted so far remain (a partially written file
// never does); the error says which entry failed.
func (r *Root) ExtractTar(src io.Reader, name string, lim TarLimits) (TarStats, error) {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultTarMaxBytes
	}
	if lim.MaxEntries <= 0 {
		lim.MaxEntries = DefaultTarMaxEntries
	}
	if lim.MaxEntrySize <= 0 {
		lim.MaxEntrySize = lim.MaxBytes
	}
	rel, err := cleanPath(name)
	if err != nil {
		return TarStats{}, err
	}
	root, err := r.acquire()
	if err != nil {
		return TarStats{}, err
	}
	defer r.release()
	if err := mkdirAll(root, rel, 0o755, nil); err != nil {
		return TarStats{}, opErr("extract", rel, err)
	}
	dest, err := openIn(root, rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return TarStats{}, opErr("extract", rel, err)
	}
	defer unix.Close(dest)
	x := &extractor{dest: dest, destRel: rel, lim: lim, created: map[string]bool{}, meta: map[string]time.Time{}, perm: map[string]uint32{}}
	sr := &srcReader{r: src}
	tr := tar.NewReader(sr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !(errors.Is(err, tar.ErrInsecurePath) && hdr != nil) {
			if sr.err != nil {
				// The stream itself failed; its error (an
				// http.MaxBytesError, say) decides the kind.
				return x.stats, &Error{Op: "extract", Path: display(rel), Err: sr.err}
			}
			return x.stats, &Error{Op: "extract", Path: display(rel), Kind: wire.ErrInvalid, Err: fmt.Errorf("malformed tar: %w", err)}
		}
		if err := x.count(); err != nil {
			return x.stats, err
		}
		if err := x.entry(tr, hdr); err != nil {
			if sr.err != nil {
				return x.stats, &Error{Op: "extract", Path: display(rel), Err: sr.err}
			}
			return x.stats, err
		}
	}
	return x.stats, x.finish()
}

// srcReader remembers the error of the underlying stream, to tell it from
// archive format errors.
type srcReader struct {
	r   io.Reader
	err error
}

func (s *srcReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		s.err = err
	}
	return n, err
}

type extractor struct {
	dest    int    // O_PATH descriptor of the destination, the extraction's root
	destRel string // the destination relative to the Root, for messages
	lim     TarLimits
	stats   TarStats
	entries int64
	// created holds the directories this extraction made; only their
	// metadata is applied, at the end (so read-only modes do not stop
	// later entries).
	created map[string]bool
	perm    map[string]uint32
	meta    map[string]time.Time
}

func (x *extractor) count() error {
	x.entries++
	if x.entries > x.lim.MaxEntries {
		return &Error{Op: "extract", Path: display(x.destRel), Kind: wire.ErrLimit,
			Err: fmt.Errorf("more than %d entries", x.lim.MaxEntries)}
	}
	return nil
}

func (x *extractor) fail(hdrName, kind string, err error) error {
	return &Error{Op: "extract", Path: hdrName, Kind: kind, Err: err}
}

func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) error {
	switch hdr.Typeflag {
	case tar.TypeReg, '\x00', tar.TypeGNUSparse, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeXGlobalHeader:
		return nil
	default:
		x.stats.Skipped++
		return nil
	}
	rel, err := cleanPath(hdr.Name)
	if err != nil {
		return x.fail(hdr.Name, wire.ErrInvalid, err)
	}
	if rel == "." {
		if hdr.Typeflag == tar.TypeDir {
			return nil
		}
		return x.fail(hdr.Name, wire.ErrInvalid, errorString("entry names the destination directory"))
	}
	var ferr error
	switch hdr.Typeflag {
	case tar.TypeDir:
		ferr = x.dir(rel, hdr)
	case tar.TypeSymlink:
		ferr = x.symlink(rel, hdr)
	case tar.TypeLink:
		ferr = x.hardlink(rel, hdr)
	default:
		ferr = x.file(rel, hdr, tr)
	}
	if ferr != nil {
		var fe *Error
		if errors.As(ferr, &fe) && fe.Op == "extract" {
			return fe
		}
		return x.fail(hdr.Name, "", ferr)
	}
	return nil
}

// parent opens the parent directory of rel, creating missing directories.
func (x *extractor) parent(rel string) (int, string, error) {
	dir, base := splitPath(rel)
	fd, err := openIn(x.dest, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) {
		err = mkdirAll(x.dest, dir, 0o755, func(p string) error {
			x.created[p] = true
			return x.count()
		})
		if err == nil {
			fd, err = openIn(x.dest, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		}
	}
	return fd, base, err
}

func (x *extractor) file(rel string, hdr *tar.Header, tr *tar.Reader) error {
	if hdr.Size < 0 {
		return x.fail(hdr.Name, wire.ErrInvalid, errorString("negative size"))
	}
	if hdr.Size > x.lim.MaxEntrySize {
		return x.fail(hdr.Name, wire.ErrTooLarge, fmt.Errorf("entry is %d bytes; the limit is %d", hdr.Size, x.lim.MaxEntrySize))
	}
	left := x.lim.MaxBytes - x.stats.Bytes
	if hdr.Size > left {
		return x.fail(hdr.Name, wire.ErrTooLarge, fmt.Errorf("archive exceeds %d bytes", x.lim.MaxBytes))
	}
	pfd, base, err := x.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	n, err := writeAt(pfd, base, tr, uint32(hdr.Mode)&0o777, min(left, x.lim.MaxEntrySize), hdr.ModTime) //nolint:gosec // masked to 0o777 after the conversion, which keeps the low bits
	if err != nil {
		if Kind(err) == wire.ErrTooLarge {
			return x.fail(hdr.Name, wire.ErrTooLarge, err)
		}
		return err
	}
	x.stats.Bytes += n
	x.stats.Files++
	return nil
}

func (x *extractor) dir(rel string, hdr *tar.Header) error {
	pfd, base, err := x.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.Mkdirat(pfd, base, 0o755)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			// A file or symlink is in the way: replace it.
			if err = unix.Unlinkat(pfd, base, 0); err == nil {
				err = unix.Mkdirat(pfd, base, 0o755)
			}
			if err == nil {
				x.created[rel] = true
			}
		}
	} else if err == nil {
		x.created[rel] = true
	}
	if err != nil {
		return err
	}
	if x.created[rel] {
		x.perm[rel] = uint32(hdr.Mode) & 0o777 //nolint:gosec // masked to 0o777 after the conversion, which keeps the low bits
		x.meta[rel] = hdr.ModTime
	}
	x.stats.Dirs++
	return nil
}

func (x *extractor) symlink(rel string, hdr *tar.Header) error {
	target := hdr.Linkname
	if target == "" || len(target) >= MaxPathLen || strings.IndexByte(target, 0) >= 0 {
		return x.fail(hdr.Name, wire.ErrInvalid, errorString("bad symlink target"))
	}
	pfd, base, err := x.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := replaceWith(pfd, base, func(tmp string) error { return unix.Symlinkat(target, pfd, tmp) }); err != nil {
		return err
	}
	x.stats.Symlinks++
	return nil
}

func (x *extractor) hardlink(rel string, hdr *tar.Header) error {
	lrel, err := cleanPath(hdr.Linkname)
	if err != nil {
		return x.fail(hdr.Name, wire.ErrInvalid, fmt.Errorf("hardlink target: %w", err))
	}
	if lrel == "." {
		return x.fail(hdr.Name, wire.ErrInvalid, errorString("hardlink to the destination directory"))
	}
	badTarget := x.fail(hdr.Name, wire.ErrInvalid, fmt.Errorf("hardlink target %q is not a regular file in the destination", hdr.Linkname))
	tpfd, tbase, err := openParent(x.dest, lrel)
	if err != nil {
		return badTarget
	}
	defer unix.Close(tpfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tpfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return badTarget
	}
	pfd, base, err := x.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	// linkat without AT_SYMLINK_FOLLOW links the entry itself; tbase is
	// one component in a directory inside the destination.
	tmp, err := withTempName(func(tmp string) error { return unix.Linkat(tpfd, tbase, pfd, tmp, 0) })
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return badTarget
		}
		return err
	}
	// The target may have been swapped between the check and the link.
	if err := unix.Fstatat(pfd, tmp, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return badTarget
	}
	err = unix.Renameat(pfd, tmp, pfd, base)
	// rename(2) of two links to the same inode does nothing and succeeds,
	// leaving tmp; remove it in every case.
	_ = unix.Unlinkat(pfd, tmp, 0)
	if err != nil {
		return err
	}
	x.stats.Hardlinks++
	return nil
}

// finish applies the modes and mtimes of directories the extraction
// created, deepest first.
func (x *extractor) finish() error {
	rels := make([]string, 0, len(x.perm))
	for rel := range x.perm {
		rels = append(rels, rel)
	}
	slices.Sort(rels)
	slices.Reverse(rels)
	for _, rel := range rels {
		pfd, base, err := openParent(x.dest, rel)
		if err != nil {
			continue // removed or replaced meanwhile
		}
		err = chmodDir(pfd, base, x.perm[rel])
		if err == nil {
			if mt := x.meta[rel]; !mt.IsZero() {
				ts := unix.NsecToTimespec(mt.UnixNano())
				_ = unix.UtimesNanoAt(pfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
			}
		}
		unix.Close(pfd)
		if err != nil && !vanished(err) {
			return &Error{Op: "extract", Path: display(joinPath(x.destRel, rel)), Err: err}
		}
	}
	return nil
}
