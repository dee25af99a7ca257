package layer

import (
	"archive/tar"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Default limits.
const (
	DefaultMaxBytes   = 8 << 30
	DefaultMaxEntries = 1_000_000
)

// Errors. Unpack wraps them with the failing entry's name.
var (
	// ErrInvalid marks an entry that breaks the rules: a bad name, a
	// path through a symlink, an invalid whiteout or hardlink, an owner
	// outside the map, a malformed xattr.
	// Of kind invalid_params: the image is at fault, not the server.
	ErrInvalid = errdefs.Errorf(errdefs.ErrInvalid, "invalid layer entry")
	// ErrLimit marks an exceeded MaxBytes or MaxEntries (kind limit).
	ErrLimit = errdefs.Errorf(errdefs.ErrLimit, "layer limit exceeded")
)

// IDMap shifts ownership: id u in the tar becomes HostBase+u on disk. An id
// >= Size fails the unpack. Size zero means no shifting (ids are used as
// they are).
type IDMap struct{ HostBase, Size uint32 }

// DevicePolicy says what to do with device and FIFO entries.
type DevicePolicy int

const (
	// SkipDevices skips character/block devices and FIFOs (the default).
	SkipDevices DevicePolicy = iota
	// CreateDevices makes them with mknod.
	CreateDevices
)

// Options tune Unpack. The zero value is usable.
type Options struct {
	// IDShift shifts file ownership (uids and gids alike), so that the
	// sandbox's root maps to an unprivileged host id.
	IDShift IDMap
	// Devices is the device policy (SkipDevices by default).
	Devices DevicePolicy
	// MaxBytes bounds the regular-file data written (DefaultMaxBytes when
	// <= 0); MaxEntries bounds the tar entries plus implicitly created
	// parent directories (DefaultMaxEntries when <= 0).
	MaxBytes, MaxEntries int64
	// UserXattr writes overlay metadata as user.overlay.* (for overlays
	// mounted with the userxattr option) instead of trusted.overlay.*.
	UserXattr bool
}

// Stats says what Unpack did. Whiteouts counts whiteout entries (".wh.name"),
// Opaque opaque markers; Files includes devices and FIFOs created; Skipped
// counts devices, FIFOs and unknown entry types not created; Bytes is the regular-file data written.
type Stats struct{ Files, Dirs, Symlinks, Hardlinks, Whiteouts, Opaque, Skipped, Bytes int64 }

const (
	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"

	resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

	maxXattrName  = 255
	maxXattrValue = 64 << 10

	maxDevMajor = 1<<12 - 1
	maxDevMinor = 1<<20 - 1
)

// Unpack extracts the layer tar r into dir, which must be an empty
// directory (not a symlink to one), following the rules in the package documentation. On error dir
// holds a partial layer; the caller deletes it.
func Unpack(r io.Reader, dir string, opt Options) (Stats, error) {
	if opt.MaxBytes <= 0 {
		opt.MaxBytes = DefaultMaxBytes
	}
	if opt.MaxEntries <= 0 {
		opt.MaxEntries = DefaultMaxEntries
	}
	if m := opt.IDShift; m.Size > 0 && uint64(m.HostBase)+uint64(m.Size) > math.MaxUint32 {
		return Stats{}, fmt.Errorf("layer: id map %d+%d overflows", m.HostBase, m.Size)
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("layer: open %s: %w", dir, err)
	}
	defer unix.Close(root)
	if err := checkEmpty(root); err != nil {
		return Stats{}, fmt.Errorf("layer: %s: %w", dir, err)
	}
	u := &unpacker{
		root: root, opt: opt,
		dirTimes:  map[string]time.Time{},
		whiteouts: map[string]bool{},
		buf:       make([]byte, 128<<10),
	}
	u.opaqueXattr = "trusted.overlay.opaque"
	if opt.UserXattr {
		u.opaqueXattr = "user.overlay.opaque"
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		// ErrInsecurePath (GODEBUG tarinsecurepath=0) comes with a
		// header; the name rules below decide.
		if err != nil && (hdr == nil || !errors.Is(err, tar.ErrInsecurePath)) {
			return u.stats, fmt.Errorf("layer: read tar: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return u.stats, fmt.Errorf("layer: entry %q: %w", hdr.Name, err)
		}
	}
	if err := u.finishDirs(); err != nil {
		return u.stats, fmt.Errorf("layer: %w", err)
	}
	return u.stats, nil
}

type unpacker struct {
	root        int
	opt         Options
	stats       Stats
	entries     int64
	opaqueXattr string
	// dirTimes holds the mtimes of directory entries, set at the end.
	dirTimes map[string]time.Time
	// whiteouts holds the whiteout devices this layer made.
	whiteouts map[string]bool
	buf       []byte
}

func invalidf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

func checkEmpty(fd int) error {
	d, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(d), ".")
	defer func() { _ = f.Close() }()
	names, err := f.Readdirnames(1)
	if len(names) > 0 {
		return errors.New("directory is not empty")
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// cleanName turns a tar name into path components (none for the root).
func cleanName(name string) ([]string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return nil, invalidf("NUL byte in name")
	}
	var comps []string
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return nil, invalidf("%q has a .. component", name)
		}
		comps = append(comps, c)
	}
	return comps, nil
}

func (u *unpacker) count() error {
	u.entries++
	if u.entries > u.opt.MaxEntries {
		return fmt.Errorf("%w: more than %d entries", ErrLimit, u.opt.MaxEntries)
	}
	return nil
}

func (u *unpacker) shift(id int) (int, error) {
	if id < 0 || id >= math.MaxUint32 {
		return 0, invalidf("owner id %d out of range", id)
	}
	m := u.opt.IDShift
	if m.Size == 0 {
		return id, nil
	}
	if uint64(id) >= uint64(m.Size) {
		return 0, invalidf("owner id %d outside the %d-id map", id, m.Size)
	}
	return int(m.HostBase) + id, nil
}

func (u *unpacker) owner(hdr *tar.Header) (uid, gid int, err error) {
	if uid, err = u.shift(hdr.Uid); err != nil {
		return 0, 0, err
	}
	gid, err = u.shift(hdr.Gid)
	return uid, gid, err
}

func (u *unpacker) entry(hdr *tar.Header, tr io.Reader) error {
	if err := u.count(); err != nil {
		return err
	}
	comps, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	for i, c := range comps {
		if strings.HasPrefix(c, whPrefix) && i < len(comps)-1 {
			return invalidf("whiteout name %q as a directory", c)
		}
	}
	if len(comps) > 0 && strings.HasPrefix(comps[len(comps)-1], whPrefix) {
		return u.whiteout(comps)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(comps, hdr)
	case tar.TypeReg: // the reader turns TypeRegA into TypeReg or TypeDir
		return u.file(comps, hdr, tr)
	case tar.TypeSymlink:
		return u.symlink(comps, hdr)
	case tar.TypeLink:
		return u.hardlink(comps, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return u.device(comps, hdr)
	default:
		u.stats.Skipped++
		return nil
	}
}

// parent opens (creating when missing) the directory holding the last of
// comps, never following a symlink. It returns an O_RDONLY directory fd the
// caller closes, and the last component.
func (u *unpacker) parent(comps []string) (int, string, error) {
	if len(comps) == 0 {
		return -1, "", invalidf("entry names the layer root")
	}
	fd, err := u.openDir(comps[:len(comps)-1])
	return fd, comps[len(comps)-1], err
}

// openDir opens the directory comps, creating missing components.
func (u *unpacker) openDir(comps []string) (int, error) {
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve}
	p := relPath(comps)
	fd, err := unix.Openat2(u.root, p, how)
	if err == nil {
		return fd, nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return -1, pathErr(p, err)
	}
	// Walk component by component, creating what is missing.
	fd, err = unix.Dup(u.root)
	if err != nil {
		return -1, err
	}
	for i, c := range comps {
		next, err := unix.Openat2(fd, c, how)
		if errors.Is(err, unix.ENOENT) {
			if err = u.count(); err != nil {
				unix.Close(fd)
				return -1, err
			}
			if err = unix.Mkdirat(fd, c, 0o755); err == nil {
				uid, gid, _ := u.owner(&tar.Header{})
				if err = unix.Fchownat(fd, c, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err == nil {
					u.stats.Dirs++
					next, err = unix.Openat2(fd, c, how)
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, pathErr(strings.Join(comps[:i+1], "/"), err)
		}
		fd = next
	}
	return fd, nil
}

// relPath joins comps; "." names the root.
func relPath(comps []string) string {
	if len(comps) == 0 {
		return "."
	}
	return strings.Join(comps, "/")
}

func pathErr(p string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return invalidf("path %q crosses a symlink or leaves the layer", p)
	case errors.Is(err, unix.ENOTDIR):
		return invalidf("path %q: a parent is not a directory", p)
	}
	return fmt.Errorf("open %q: %w", p, err)
}

// clear makes room for a new entry at (pfd, base): it removes a
// non-directory, or an empty directory when the new entry is not one. It
// reports whether a directory remains (wantDir only) and whether the
// removed entry was a whiteout of this layer.
func (u *unpacker) clear(pfd int, base, rel string, wantDir bool) (isDir, wasWhiteout bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, false, nil
		}
		return false, false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if wantDir {
			return true, false, nil
		}
		if err := unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR); err != nil {
			if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
				return false, false, invalidf("a non-directory would replace non-empty directory %q", rel)
			}
			return false, false, err
		}
		delete(u.dirTimes, rel)
		return false, false, nil
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return false, false, err
	}
	wasWhiteout = u.whiteouts[rel]
	delete(u.whiteouts, rel)
	return false, wasWhiteout, nil
}

func (u *unpacker) whiteout(comps []string) error {
	base := comps[len(comps)-1]
	dirComps := comps[:len(comps)-1]
	if base == whOpaque {
		fd, err := u.openDir(dirComps)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		u.stats.Opaque++
		return unix.Fsetxattr(fd, u.opaqueXattr, []byte("y"), 0)
	}
	name := strings.TrimPrefix(base, whPrefix)
	if name == "" || name == "." || name == ".." || strings.HasPrefix(name, whPrefix) {
		return invalidf("invalid whiteout %q", base)
	}
	pfd, err := u.openDir(dirComps)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	u.stats.Whiteouts++
	rel := strings.Join(append(slices.Clone(dirComps), name), "/")
	var st unix.Stat_t
	err = unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		// This layer's directory replaces the lower one entirely.
		return u.setOpaque(pfd, name)
	case err == nil:
		return nil // this layer's entry already hides the lower one
	case !errors.Is(err, unix.ENOENT):
		return err
	}
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
		return err
	}
	u.whiteouts[rel] = true
	uid, gid, _ := u.owner(&tar.Header{})
	return unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
}

func (u *unpacker) setOpaque(pfd int, name string) error {
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsetxattr(fd, u.opaqueXattr, []byte("y"), 0)
}

func (u *unpacker) dir(comps []string, hdr *tar.Header) error {
	uid, gid, err := u.owner(hdr)
	if err != nil {
		return err
	}
	xattrs, err := u.xattrs(hdr)
	if err != nil {
		return err
	}
	rel := relPath(comps)
	var fd int
	if len(comps) == 0 {
		if fd, err = unix.Dup(u.root); err != nil {
			return err
		}
	} else {
		pfd, base, err := u.parent(comps)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		isDir, wasWhiteout, err := u.clear(pfd, base, rel, true)
		if err != nil {
			return err
		}
		if !isDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return err
			}
		}
		if fd, err = unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		if wasWhiteout {
			// Whiteout then directory in one layer: the lower
			// directory is gone, this one replaces it.
			if err := unix.Fsetxattr(fd, u.opaqueXattr, []byte("y"), 0); err != nil {
				unix.Close(fd)
				return err
			}
		}
	}
	defer unix.Close(fd)
	if err := u.meta(fd, uid, gid, hdr, xattrs); err != nil {
		return err
	}
	u.stats.Dirs++
	u.dirTimes[rel] = hdr.ModTime
	return nil
}

// permBits is the mode an entry is given: its permission bits and sticky
// bit, and a directory's setgid bit (new entries take its group), but never
// setuid or setgid on anything that can be executed. Inside a sandbox they
// never worked (every sandbox process runs with no_new_privs), and on the
// host they would give whoever reaches a layer the privileges of a sandbox
// uid (issue #18, finding 2).
func permBits(hdr *tar.Header) uint32 {
	keep := int64(0o1777)
	if hdr.Typeflag == tar.TypeDir {
		keep |= 0o2000
	}
	return uint32(hdr.Mode & keep) //nolint:gosec // masked to 0o3777 first, so it fits
}

// meta applies ownership, mode and xattrs to an open file or directory, in
// that order (chown clears setuid/setgid and security.capability).
func (u *unpacker) meta(fd, uid, gid int, hdr *tar.Header, xattrs [][2]string) error {
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, permBits(hdr)); err != nil {
		return err
	}
	for _, x := range xattrs {
		if err := unix.Fsetxattr(fd, x[0], []byte(x[1]), 0); err != nil {
			return fmt.Errorf("set xattr %s: %w", x[0], err)
		}
	}
	return nil
}

func timespecs(t time.Time) []unix.Timespec {
	ts := unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
	return []unix.Timespec{ts, ts}
}

func (u *unpacker) file(comps []string, hdr *tar.Header, tr io.Reader) error {
	uid, gid, err := u.owner(hdr)
	if err != nil {
		return err
	}
	xattrs, err := u.xattrs(hdr)
	if err != nil {
		return err
	}
	if hdr.Size < 0 {
		return invalidf("negative size")
	}
	if hdr.Size > u.opt.MaxBytes-u.stats.Bytes {
		return fmt.Errorf("%w: %d-byte file over the %d-byte budget", ErrLimit, hdr.Size, u.opt.MaxBytes)
	}
	pfd, base, err := u.parent(comps)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, _, err := u.clear(pfd, base, strings.Join(comps, "/"), false); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// The tar reader yields at most hdr.Size bytes and fails on a short
	// body; the budget is checked again on what is actually written.
	for {
		n, rerr := tr.Read(u.buf)
		if n > 0 {
			u.stats.Bytes += int64(n)
			if u.stats.Bytes > u.opt.MaxBytes {
				return fmt.Errorf("%w: more than %d bytes", ErrLimit, u.opt.MaxBytes)
			}
			if err := writeAll(fd, u.buf[:n]); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if err := u.meta(fd, uid, gid, hdr, xattrs); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(pfd, base, timespecs(hdr.ModTime), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	u.stats.Files++
	return nil
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func (u *unpacker) symlink(comps []string, hdr *tar.Header) error {
	uid, gid, err := u.owner(hdr)
	if err != nil {
		return err
	}
	if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return invalidf("empty symlink target or NUL byte in it")
	}
	pfd, base, err := u.parent(comps)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, _, err := u.clear(pfd, base, strings.Join(comps, "/"), false); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return err
	}
	if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(pfd, base, timespecs(hdr.ModTime), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	u.stats.Symlinks++
	return nil
}

func (u *unpacker) hardlink(comps []string, hdr *tar.Header) error {
	tcomps, err := cleanName(hdr.Linkname)
	if err != nil {
		return err
	}
	if len(tcomps) == 0 {
		return invalidf("hardlink to the layer root")
	}
	if slices.Equal(tcomps, comps) {
		return invalidf("hardlink to itself")
	}
	tfd, err := unix.Openat2(u.root, relPath(tcomps[:len(tcomps)-1]),
		&unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve})
	if err != nil {
		return invalidf("hardlink target %q: %v", hdr.Linkname, err)
	}
	defer unix.Close(tfd)
	tbase := tcomps[len(tcomps)-1]
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return invalidf("hardlink target %q: %v", hdr.Linkname, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return invalidf("hardlink target %q is not a regular file", hdr.Linkname)
	}
	pfd, base, err := u.parent(comps)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, _, err := u.clear(pfd, base, strings.Join(comps, "/"), false); err != nil {
		return err
	}
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return err
	}
	u.stats.Hardlinks++
	return nil
}

func (u *unpacker) device(comps []string, hdr *tar.Header) error {
	if u.opt.Devices != CreateDevices || (hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0) {
		u.stats.Skipped++
		return nil
	}
	uid, gid, err := u.owner(hdr)
	if err != nil {
		return err
	}
	// The kernel's dev_t holds a 12-bit major and a 20-bit minor; mknod
	// drops higher bits, so 4096/0 would be made as 0/0, a whiteout.
	if hdr.Devmajor < 0 || hdr.Devmajor > maxDevMajor || hdr.Devminor < 0 || hdr.Devminor > maxDevMinor {
		return invalidf("device number out of range")
	}
	mode := permBits(hdr)
	switch hdr.Typeflag {
	case tar.TypeChar:
		mode |= unix.S_IFCHR
	case tar.TypeBlock:
		mode |= unix.S_IFBLK
	default:
		mode |= unix.S_IFIFO
	}
	pfd, base, err := u.parent(comps)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, _, err := u.clear(pfd, base, strings.Join(comps, "/"), false); err != nil {
		return err
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))   //nolint:gosec // within the kernel's range, checked above
	if err := unix.Mknodat(pfd, base, mode, int(dev)); err != nil { //nolint:gosec // dev fits in 32 bits (the range checked above)
		return err
	}
	if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	// mknod applied the umask and chown cleared setuid/setgid: set the
	// mode again. The node was just made by us in a directory nobody else
	// writes, and fchmodat cannot follow a device.
	if err := unix.Fchmodat(pfd, base, mode&0o7777, 0); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(pfd, base, timespecs(hdr.ModTime), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	u.stats.Files++
	return nil
}

// xattrs returns the xattrs of hdr to apply, sorted by name.
func (u *unpacker) xattrs(hdr *tar.Header) ([][2]string, error) {
	var out [][2]string
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "user.overlay."):
			continue
		case strings.HasPrefix(name, "user."):
		case name == "security.capability":
			c, err := u.caps([]byte(v))
			if err != nil {
				return nil, err
			}
			v = string(c)
		default:
			continue
		}
		if len(name) > maxXattrName || len(v) > maxXattrValue || strings.IndexByte(name, 0) >= 0 {
			return nil, invalidf("xattr %.40q too large or malformed", name)
		}
		out = append(out, [2]string{name, v})
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out, nil
}

// File capability xattr layout (linux/capability.h).
const (
	capRevMask = 0xFF000000
	capRev2    = 0x02000000
	capRev3    = 0x03000000
	capSize2   = 20
	capSize3   = 24
)

// caps shifts a security.capability value: the root id it is valid for
// (0 for v2) is shifted like an owner.
func (u *unpacker) caps(v []byte) ([]byte, error) {
	if len(v) < 4 {
		return nil, invalidf("malformed security.capability")
	}
	magic := binary.LittleEndian.Uint32(v)
	var rootid uint32
	switch {
	case magic&capRevMask == capRev2 && len(v) == capSize2:
	case magic&capRevMask == capRev3 && len(v) == capSize3:
		rootid = binary.LittleEndian.Uint32(v[capSize2:])
	default:
		return nil, invalidf("unsupported security.capability (revision %#x, %d bytes)", magic&capRevMask, len(v))
	}
	host, err := u.shift(int(rootid))
	if err != nil {
		return nil, err
	}
	flags := magic &^ capRevMask
	if host == 0 {
		out := slices.Clone(v[:capSize2])
		binary.LittleEndian.PutUint32(out, capRev2|flags)
		return out, nil
	}
	out := make([]byte, capSize3)
	binary.LittleEndian.PutUint32(out, capRev3|flags)
	copy(out[4:capSize2], v[4:capSize2])
	binary.LittleEndian.PutUint32(out[capSize2:], uint32(host)) //nolint:gosec // shift returns ids below 2^32 (Unpack checks HostBase+Size)
	return out, nil
}

// finishDirs sets directory mtimes once nothing more is written into them.
func (u *unpacker) finishDirs() error {
	for rel, t := range u.dirTimes {
		fd, err := unix.Openat2(u.root, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve})
		if err != nil {
			return fmt.Errorf("directory %q: %w", rel, err)
		}
		err = unix.UtimesNanoAt(fd, "", timespecs(t), unix.AT_EMPTY_PATH)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("set mtime of %q: %w", rel, err)
		}
	}
	return nil
}
