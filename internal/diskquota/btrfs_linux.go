// Package diskquota limits what a directory may hold on the host's disk:
// each limited directory is a btrfs subvolume with a quota group (qgroup)
// capping the bytes it references, on a btrfs file system Warren prepares
// (a sparse image loop-mounted over the sandboxes' directory) when the data
// directory's own file system is not btrfs. A write past the limit fails
// with EDQUOT in the writer; the rest of the host never notices, since the
// image is the only file system that fills.
//
// Why btrfs: the measurement in docs/policy.md ("Disk limits"). This
// machine's kernel, like many, has no quota formats for ext4
// (CONFIG_QFMT_V2) and no XFS quota (CONFIG_XFS_QUOTA), so project quotas
// are out; a file system per sandbox costs 165-300 ms of mount; a btrfs
// subvolume and its limit cost a fraction of a millisecond.
//
// Invariants:
//   - a limited directory is a subvolume whose qgroup 0/<subvolume id>
//     carries the limit; removing the directory (rmdir of the emptied
//     subvolume, or Remove) frees the qgroup, and Reap frees qgroups whose
//     subvolume is gone (a crash between the two);
//   - inodes have no separate limit on btrfs (it allocates them as it
//     needs, from the same bytes): each file's metadata counts against the
//     byte limit, so many small files stop at it too.
package diskquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// btrfs ioctls (include/uapi/linux/btrfs.h): _IOC(dir, 0x94, nr, size).
const (
	iocSubvolCreate = 1<<30 | 4096<<16 | 0x94<<8 | 14 // _IOW vol_args
	iocSnapDestroy  = 1<<30 | 4096<<16 | 0x94<<8 | 15 // _IOW vol_args
	iocInoLookup    = 3<<30 | 4096<<16 | 0x94<<8 | 18 // _IOWR ino_lookup_args
	iocFSInfo       = 2<<30 | 1024<<16 | 0x94<<8 | 31 // _IOR fs_info_args
	iocSync         = 0x94<<8 | 8                     // _IO
	iocQuotaCtl     = 3<<30 | 16<<16 | 0x94<<8 | 40   // _IOWR quota_ctl_args
	iocQgroupCreate = 1<<30 | 16<<16 | 0x94<<8 | 42   // _IOW qgroup_create_args
	iocQgroupLimit  = 2<<30 | 48<<16 | 0x94<<8 | 43   // _IOR qgroup_limit_args

	quotaCtlEnable = 1

	limitMaxRfer = 1 // BTRFS_QGROUP_LIMIT_MAX_RFER

	firstFreeObjectID = 256 // a subvolume's root directory
	btrfsSuperMagic   = 0x9123683e
)

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// IsBtrfs reports whether dir is on btrfs.
func IsBtrfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == btrfsSuperMagic
}

// volArgs is struct btrfs_ioctl_vol_args: an fd and a NUL-terminated name.
type volArgs struct {
	fd   int64
	name [4088]byte
}

func newVolArgs(name string) (*volArgs, error) {
	a := &volArgs{}
	if name == "" || len(name) >= len(a.name) || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("subvolume name %q: want one path element", name)
	}
	copy(a.name[:], name)
	return a, nil
}

// CreateDir makes dir (whose parent must be on a btrfs file system with
// quotas enabled, see EnableQuota) a directory limited to maxBytes
// (0: unlimited, but measured by Usage), mode 0700 owned by root. It fails
// with fs.ErrExist when dir exists.
func CreateDir(dir string, maxBytes int64) error {
	parent, name := filepath.Split(filepath.Clean(dir))
	a, err := newVolArgs(name)
	if err != nil {
		return err
	}
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := ioctl(pfd, iocSubvolCreate, unsafe.Pointer(a)); err != nil { //nolint:gosec // G103: a btrfs ioctl argument, laid out as the kernel's struct
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create %s: %w", dir, os.ErrExist)
		}
		return fmt.Errorf("create subvolume %s: %w", dir, err)
	}
	if err := SetLimit(dir, maxBytes); err != nil {
		_ = Remove(dir)
		return err
	}
	return nil
}

// subvolID is the id of the subvolume dir is in (its qgroup is 0/id).
func subvolID(fd int) (uint64, error) {
	var a struct {
		treeid   uint64
		objectid uint64
		name     [4080]byte
	}
	a.objectid = firstFreeObjectID
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&a)); err != nil { //nolint:gosec // G103: a btrfs ioctl argument, laid out as the kernel's struct
		return 0, fmt.Errorf("subvolume id: %w", err)
	}
	return a.treeid, nil
}

// SetLimit caps what the subvolume at dir references at maxBytes (0:
// no cap).
func SetLimit(dir string, maxBytes int64) error {
	if maxBytes < 0 {
		return errors.New("negative limit")
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		return err
	}
	a := struct {
		qgroupid                                  uint64
		flags, maxRfer, maxExcl, rsvRfer, rsvExcl uint64
	}{qgroupid: id, flags: limitMaxRfer, maxRfer: uint64(maxBytes)} //nolint:gosec // G115: not negative (checked above)
	if maxBytes == 0 {
		a.maxRfer = ^uint64(0) // the kernel's "none"
	}
	if err := ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)); err != nil { //nolint:gosec // G103: a btrfs ioctl argument, laid out as the kernel's struct
		return fmt.Errorf("limit %s: %w", dir, err)
	}
	return nil
}

// Remove deletes the limited directory dir and everything in it, and its
// qgroup. A missing dir is not an error.
func Remove(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// Emptied first: destroying a subvolume is then immediate, and its
	// qgroup has nothing left to account.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	id, err := subvolID(fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	parent, name := filepath.Split(filepath.Clean(dir))
	a, err := newVolArgs(name)
	if err != nil {
		return err
	}
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := ioctl(pfd, iocSnapDestroy, unsafe.Pointer(a)); err != nil { //nolint:gosec // G103: a btrfs ioctl argument, laid out as the kernel's struct
		if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
			return os.Remove(dir) // a plain directory (made before limits)
		}
		return fmt.Errorf("delete subvolume %s: %w", dir, err)
	}
	_ = destroyQgroup(pfd, id) // Reap retries what is still in use
	return nil
}

func destroyQgroup(fd int, id uint64) error {
	a := struct{ create, qgroupid uint64 }{0, id}
	return ioctl(fd, iocQgroupCreate, unsafe.Pointer(&a)) //nolint:gosec // G103: a btrfs ioctl argument, laid out as the kernel's struct
}

// EnableQuota turns on btrfs quota accounting on the file system of dir
// (a no-op when it is on).
func EnableQuota(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	a := struct{ cmd, status uint64 }{cmd: quotaCtlEnable}
	if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)); err != nil { //nolint:gosec // G103: a btrfs ioctl argument, laid out as the kernel's struct
		return fmt.Errorf("enable btrfs quotas on %s: %w", dir, err)
	}
	return nil
}

// sysfsDir is /sys/fs/btrfs/<fsid> of dir's file system, where the kernel
// shows each qgroup's usage and limit.
func sysfsDir(fd int) (string, error) {
	var a [1024]byte
	if err := ioctl(fd, iocFSInfo, unsafe.Pointer(&a)); err != nil { //nolint:gosec // G103: a btrfs ioctl argument, laid out as the kernel's struct
		return "", fmt.Errorf("btrfs fs info: %w", err)
	}
	id := a[16:32]
	return fmt.Sprintf("/sys/fs/btrfs/%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16]), nil
}

// Usage is what the limited directory dir references on disk (its files'
// data and metadata) and its limit (0: none), as the kernel accounts them
// (current to the last transaction commit, at most 30 s old).
func Usage(dir string) (used, limit int64, err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		return 0, 0, err
	}
	sys, err := sysfsDir(fd)
	if err != nil {
		return 0, 0, err
	}
	q := filepath.Join(sys, "qgroups", "0_"+strconv.FormatUint(id, 10))
	used, err = readInt(filepath.Join(q, "referenced"))
	if err != nil {
		return 0, 0, err
	}
	limit, err = readInt(filepath.Join(q, "max_referenced"))
	if err != nil {
		return 0, 0, err
	}
	return used, limit, nil
}

// readInt reads a sysfs number; "none" (or all ones) is 0.
func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p) //nolint:gosec // a sysfs file of the qgroup named by the kernel
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "none" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	if n > 1<<62 {
		return 0, nil
	}
	return int64(n), nil
}

// TopLevel is the id of a btrfs file system's top-level subvolume: what
// SubvolumeID reports for a plain directory on it.
const TopLevel = 5

// SubvolumeID is the id of the subvolume dir is (0 with an error when dir
// is no limited directory).
func SubvolumeID(dir string) (uint64, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return subvolID(fd)
}

// Qgroups lists the ids of the subvolume qgroups (0/id) of root's file
// system, as the kernel shows them.
func Qgroups(root string) ([]uint64, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	sys, err := sysfsDir(fd)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(sys, "qgroups"))
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), "0_")
		if !ok {
			continue
		}
		if v, err := strconv.ParseUint(id, 10, 64); err == nil && v >= firstFreeObjectID {
			ids = append(ids, v)
		}
	}
	return ids, nil
}

// Reap frees the quota groups of root's file system whose subvolume is
// gone: on kernels that keep them after the subvolume is dropped, those
// of directories Remove deleted, and of any a crash cut short. Only
// qgroups that reference nothing are destroyed: a live subvolume always
// references its root's tree block. It wakes the kernel's cleaner first,
// which drops deleted subvolumes in the background. It returns how many it
// freed.
func Reap(root string) (int, error) {
	ids, err := Qgroups(root)
	if err != nil {
		return 0, err
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	// A commit that also wakes the cleaner, which drops deleted
	// subvolumes (their qgroups go with them on recent kernels).
	_ = ioctl(fd, iocSync, nil)
	sys, err := sysfsDir(fd)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		used, err := readInt(filepath.Join(sys, "qgroups", "0_"+strconv.FormatUint(id, 10), "referenced"))
		if err == nil && used == 0 && destroyQgroup(fd, id) == nil {
			n++
		}
	}
	return n, nil
}
