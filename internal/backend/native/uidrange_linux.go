package native

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/uidrange"
)

// Per-sandbox uid ranges (issue #18, findings 2 and 8). Every running
// sandbox's user namespace maps its ids to a host range of its own
// (package uidrange), so no two sandboxes share a host uid: not for their
// files, their processes, nor the kernel's per-user accounting. What
// sandboxes and images keep on disk stays owned by the storage range
// (Options.UIDBase, as before ranges), which no process runs as; each
// start sees its layers, its upper directory and its volumes through
// mounts idmapped from the storage range to the range its agent was given
// (a fresh one at each start: a pooled agent brings its own). The host
// mounts the root for the agent, which as the sandbox's uids could not
// reach the data directory (root's alone in this mode, 0700).
//
// It needs what the host holding roots needs (HostHoldsRoots: overlay
// layers by descriptor, clones of detached mounts; Linux 6.13+ in
// practice) and a data directory on a file system that can be idmapped.
// Elsewhere every sandbox runs as the storage range, as before.

// UID range modes (Options.UIDRanges).
const (
	UIDRangesAuto = "auto" // per-sandbox ranges where the kernel and data directory allow
	UIDRangesOn   = "on"   // require them
	UIDRangesOff  = "off"  // every sandbox runs as the storage range
)

// rootMountPoint, under RunDir, is the empty directory every agent mounts
// its sandbox's root on, each in its own mount namespace: a path the
// sandbox's uids can reach (RunDir is 0711 in this mode).
const rootMountPoint = ".root"

// idmaps caches, for the ranges used last, the user namespace that
// idmaps the storage range to each. A mount keeps the namespace it was
// idmapped with, so a namespace dropped from the cache costs only its
// remaking (a spawner request) when its range comes round again; ranges
// are taken lowest first, so the cache holds the ones in use on a host
// running up to maxIdmaps sandboxes.
type idmaps struct {
	mu   sync.Mutex
	ns   map[uint32]*os.File
	used []uint32 // ns's keys, least recently used first
}

// maxIdmaps bounds the namespaces (and descriptors) idmaps keeps.
const maxIdmaps = 8

// idmapNS is the user namespace mapping the storage range to the range at
// host: a descriptor of the caller's own, to close.
func (b *Backend) idmapNS(host uint32) (*os.File, error) {
	c := &b.idmaps
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.used, host); i >= 0 {
		c.used = append(slices.Delete(c.used, i, i+1), host)
		return dupFile(c.ns[host])
	}
	sp, err := b.liveSpawner()
	if err != nil {
		return nil, err
	}
	// Host root keeps its own id: the overlay works in its upper
	// directory as the mounter (host root), through this mapping.
	f, err := sp.IDMapNS(fmt.Sprintf("0 0 1\n%d %d %d\n", b.userNS.Host, host, uidrange.Size))
	if err != nil {
		return nil, fmt.Errorf("id map for uid range %d: %w", host, err)
	}
	if c.ns == nil {
		c.ns = map[uint32]*os.File{}
	}
	if len(c.used) >= maxIdmaps {
		_ = c.ns[c.used[0]].Close()
		delete(c.ns, c.used[0])
		c.used = c.used[1:]
	}
	c.ns[host] = f
	c.used = append(c.used, host)
	return dupFile(f)
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

func (b *Backend) closeIDMaps() {
	b.idmaps.mu.Lock()
	defer b.idmaps.mu.Unlock()
	for _, f := range b.idmaps.ns {
		_ = f.Close()
	}
	b.idmaps.ns, b.idmaps.used = nil, nil
}

// enableRanges checks that sandboxes can run in ranges of their own here
// and sets the backend up for it; an error says why they cannot.
func (b *Backend) enableRanges() error {
	if b.userNS == nil {
		return errors.New("no user namespaces")
	}
	if b.agentMountsRoots || !HostHoldsRoots() {
		return errors.New("this kernel does not let the host hold sandbox roots (Linux 6.18 does; 6.1 and 6.12 do not)")
	}
	// Agents, as their own range's uids, exec the agent binary from the
	// run directory: what is above it must be searchable by any user.
	if err := checkTraversable(parentDir(b.opts.RunDir), int(b.userNS.Host+uidrange.Size), dirRemedy); err != nil {
		return err
	}
	a, err := uidrange.New(uidrange.DefaultDir(b.userNS.Host), b.userNS.Host, b.opts.UIDRangeCount)
	if err != nil {
		return err
	}
	// The data directory's file system must take an idmapped mount.
	ns, err := b.idmapNS(b.userNS.Host + uidrange.Size)
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	fd, err := idmappedClone(filepath.Join(b.opts.DataDir, "sandboxes"), ns, 0)
	if err != nil {
		return fmt.Errorf("the data directory's file system: %w", err)
	}
	unix.Close(fd)
	if err := mkdirAllMode(filepath.Join(b.opts.RunDir, rootMountPoint), 0o711); err != nil {
		return err
	}
	b.ranges = a
	return nil
}

// idmappedClone is a detached, non-recursive mount of path (opened without
// following symlinks), idmapped through ns, with attrs (MOUNT_ATTR_*) set.
func idmappedClone(path string, ns *os.File, attrs uint64) (int, error) {
	src, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("open %s without following symbolic links: %w", path, err)
	}
	defer unix.Close(src)
	fd, err := unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("clone %s: %w", path, err)
	}
	if err := idmapMount(fd, ns, attrs); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmap %s: %w", path, err)
	}
	return fd, nil
}

// idmapMount idmaps the detached mount fd through ns and sets attrs.
func idmapMount(fd int, ns *os.File, attrs uint64) error {
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | attrs, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("%w (its file system cannot be idmapped on this kernel)", err)
		}
		return err
	}
	return nil
}

// volumeMounts makes the mounts of the sandbox's volumes for an agent in
// the range at host: idmapped, so what sandbox root writes is owned by the
// storage range's root on the host whatever range the sandbox runs in,
// nosuid, nodev and read-only as asked. The caller closes them.
func (s *Sandbox) volumeMounts(host uint32) (_ []*os.File, err error) {
	if len(s.cfg.Volumes) == 0 {
		return nil, nil
	}
	ns, err := s.b.idmapNS(host)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ns.Close() }()
	var fs []*os.File
	defer func() {
		if err != nil {
			for _, f := range fs {
				_ = f.Close()
			}
		}
	}()
	for _, v := range s.cfg.Volumes {
		attrs := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if v.ReadOnly {
			attrs |= unix.MOUNT_ATTR_RDONLY
		}
		fd, err := idmappedClone(v.Source, ns, attrs)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w: %w", v.Source, backend.ErrVolumeNotAllowed, err)
		}
		fs = append(fs, os.NewFile(uintptr(fd), "volume"))
	}
	return fs, nil
}
