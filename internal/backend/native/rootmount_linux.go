package native

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// A sandbox's overlay root is mounted by the host, as a detached mount (in
// no mount namespace, so nothing to clean up on the host after a crash:
// the mount goes with the descriptor), and kept from one start of the
// sandbox to the next. Each start hands the agent a clone of it to attach.
//
// Why: an overlay's superblock lives as long as any mount of it, and
// overlayfs syncs the upper file system when it goes: the whole host file
// system the data directory is on, with everything dirty on it. When the
// agent mounted the root, every stop waited for that sync (0.4-0.7 ms on a
// quiet host, as long as the host's writeback takes on a busy one) and
// every start mounted the layers again. Held by the host, a stop leaves
// the superblock up and a restart attaches it in microseconds, with the
// overlay's caches still warm. The sync happens once, when the sandbox is
// removed or its stopped root has been held for keepRoot.
var (
	// keepRoot is how long a stopped sandbox's root stays mounted.
	keepRoot = 5 * time.Minute
	// maxIdleRoots bounds the stopped sandboxes holding a root (each
	// holds a descriptor and the overlay's cached dentries and inodes).
	maxIdleRoots = 256
)

// rootMount is a detached mount of one sandbox's overlay.
type rootMount struct {
	fd  int
	of  boot.Rootfs // what it was made of
	uid uint32      // the uid range its layers are idmapped to; 0: not idmapped
}

// isOf reports whether the mount is of r's layers and directories, for
// the uid range at uid.
func (m *rootMount) isOf(r boot.Rootfs, uid uint32) bool {
	return slices.Equal(m.of.Lower, r.Lower) && m.of.Upper == r.Upper && m.of.Work == r.Work && m.of.UserXattr == r.UserXattr && m.uid == uid
}

// How fsmountOverlay names the layers.
const (
	layersByFD      = iota // "lowerdir+", "upperdir", "workdir" by descriptor
	layerByLayer           // "lowerdir+" paths
	layersAsOneList        // one "lowerdir" list
)

// mountRoot mounts r's overlay, detached. Layers are given by descriptor
// (Linux 6.13 takes them), else added one path at a time ("lowerdir+",
// Linux 6.8), else as one list where the list fits a mount parameter (256
// bytes); an error means the agent should mount the root itself. With
// idmap (a user namespace) the layers and the upper directory are seen
// through mounts idmapped by it, given by descriptor.
//
// volatile is for a sandbox whose files never outlive this process (an
// ephemeral one, ExitWithHost): see setVolatile.
func mountRoot(r boot.Rootfs, idmap *os.File, volatile bool) (*rootMount, error) {
	if len(r.Lower) == 0 || r.Upper == "" || r.Dir != "" {
		return nil, errors.New("not a plain layered root")
	}
	if idmap != nil {
		return fsmountOverlay(r, layersByFD, idmap, volatile)
	}
	var err error
	for _, how := range []int{layersByFD, layerByLayer, layersAsOneList} {
		var m *rootMount
		if m, err = fsmountOverlay(r, how, nil, volatile); err == nil {
			return m, nil
		}
	}
	return nil, err
}

// detachedDir is a detached bind mount of dir (a clone in no mount
// namespace). An overlay layer given as one shows in mountinfo as a path
// from that mount's root ("/", "/upper"), not the host's: the sandbox,
// which reads its mountinfo, never learns where on the host its layers
// and its upper directory are (issue #18, finding 12).
func detachedDir(dir string) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone %s: %w", dir, err)
	}
	return fd, nil
}

// setLayerFDs names r's layers to the overlay being configured by
// descriptors of detached mounts: each lower layer's own, and upper and
// work through one mount of their common parent (overlay wants them on
// one mount). The caller closes the descriptors returned, after the
// overlay is created: a detached mount whose last descriptor is closed is
// unmounted, and the overlay would refuse it.
func setLayerFDs(fsfd int, r boot.Rootfs, idmap *os.File) (fds []int, err error) {
	if filepath.Dir(r.Upper) != filepath.Dir(r.Work) {
		return nil, errors.New("upper and work are in different directories")
	}
	defer func() {
		if err != nil {
			closeAll(fds)
			fds = nil
		}
	}()
	setFD := func(k, path string, fd int) error {
		if err := unix.FsconfigSetFd(fsfd, k, fd); err != nil {
			return fmt.Errorf("overlay %s=%s (by descriptor): %w", k, path, err)
		}
		return nil
	}
	clone := func(dir string) (int, error) {
		fd, err := detachedDir(dir)
		if err == nil && idmap != nil {
			if err = idmapMount(fd, idmap, 0); err != nil {
				unix.Close(fd)
				return -1, fmt.Errorf("idmap %s: %w", dir, err)
			}
		}
		return fd, err
	}
	for _, l := range r.Lower {
		fd, err := clone(l)
		if err != nil {
			return fds, err
		}
		fds = append(fds, fd)
		if err := setFD("lowerdir+", l, fd); err != nil {
			return fds, err
		}
	}
	parent, err := clone(filepath.Dir(r.Upper))
	if err != nil {
		return fds, err
	}
	fds = append(fds, parent)
	for _, d := range []struct{ key, path string }{{"upperdir", r.Upper}, {"workdir", r.Work}} {
		fd, err := unix.Openat(parent, filepath.Base(d.path), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fds, fmt.Errorf("open %s: %w", d.path, err)
		}
		fds = append(fds, fd)
		if err := setFD(d.key, d.path, fd); err != nil {
			return fds, err
		}
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// setVolatile mounts the overlay being configured "volatile": it never
// syncs its upper file system, above all not when it goes. Otherwise the
// unmount at a sandbox's removal syncs the whole file system the data
// directory is on, with everything any process left dirty there: on a busy
// host, tens to hundreds of milliseconds, most of a `warren run` (issue
// #23). Only for a sandbox whose files are thrown away with its owner:
// after a host crash overlayfs cannot vouch for a volatile upper layer,
// and an ephemeral sandbox's is never used again (ReapOrphans deletes
// it). overlayfs marks such a layer (<work>/work/incompat/volatile/dirty) and
// refuses to mount it again while the mark is there; a mount by this same
// process (a restart after the root was released) clears the mark, as the
// layer is intact without a crash. A kernel without the option (before
// 5.10) mounts as before.
func setVolatile(fsfd int, r boot.Rootfs) {
	// overlayfs's own directory, out of the sandbox's reach: nothing in
	// it is the sandbox's doing.
	_ = os.RemoveAll(filepath.Join(r.Work, "work", "incompat"))
	_ = unix.FsconfigSetFlag(fsfd, "volatile")
}

func fsmountOverlay(r boot.Rootfs, how int, idmap *os.File, volatile bool) (*rootMount, error) {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	set := func(k, v string) error {
		if err := unix.FsconfigSetString(fsfd, k, v); err != nil {
			return fmt.Errorf("overlay %s=%s: %w", k, v, err)
		}
		return nil
	}
	if err := set("source", "overlay"); err != nil {
		return nil, err
	}
	switch how {
	case layersByFD:
		fds, err := setLayerFDs(fsfd, r, idmap)
		if err != nil {
			return nil, err
		}
		defer closeAll(fds)
	case layerByLayer:
		for _, l := range r.Lower {
			if err := set("lowerdir+", l); err != nil {
				return nil, err
			}
		}
	default:
		if err := set("lowerdir", strings.Join(r.Lower, ":")); err != nil {
			return nil, err
		}
	}
	if how != layersByFD {
		if err := set("upperdir", r.Upper); err != nil {
			return nil, err
		}
		if err := set("workdir", r.Work); err != nil {
			return nil, err
		}
	}
	if r.UserXattr {
		// The layout the sandbox's own mounts used (and images are
		// unpacked for): whiteouts and opaque dirs in user.overlay.*.
		if err := unix.FsconfigSetFlag(fsfd, "userxattr"); err != nil {
			return nil, fmt.Errorf("overlay userxattr: %w", err)
		}
	}
	if volatile {
		setVolatile(fsfd, r)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("create overlay: %w", err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("fsmount overlay: %w", err)
	}
	return &rootMount{fd: fd, of: r}, nil
}

// HostHoldsRoots reports whether this kernel lets the host hold sandbox
// roots: it must clone a detached mount (open_tree OPEN_TREE_CLONE of an
// fsmount descriptor), which Linux 6.1 and 6.12 refuse (EINVAL) and 6.18
// allows. Without it every agent mounts its own root, as before.
var HostHoldsRoots = sync.OnceValue(func() bool {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return false
	}
	defer unix.Close(fsfd)
	if unix.FsconfigCreate(fsfd) != nil {
		return false
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	c, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return false
	}
	unix.Close(c)
	return true
})

// clone is a new detached mount of the same overlay, for one agent to
// attach (a mount can be attached once).
func (m *rootMount) clone() (*os.File, error) {
	fd, err := unix.OpenTree(m.fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return nil, fmt.Errorf("clone root mount: %w", err)
	}
	return os.NewFile(uintptr(fd), "root"), nil
}

// roots tracks the sandboxes holding a root mount, so Close releases them
// all, and bounds those held while stopped.
type roots struct {
	mu   sync.Mutex
	held map[*Sandbox]bool
	idle int
}

// rootFor returns a clone of the sandbox's root mount for r and an agent
// in the uid range at uid, mounting it first if it holds none for these
// layers and range; nil when the host cannot mount it, and the agent
// mounts the layers itself. With per-sandbox uid ranges the agent cannot:
// a mount that fails is an error.
func (s *Sandbox) rootFor(r boot.Rootfs, uid uint32) (*os.File, error) {
	ranged := s.b.ranges != nil
	if !ranged && (s.b.agentMountsRoots || !HostHoldsRoots()) {
		return nil, nil
	}
	s.wakeRootLocked()
	if s.root != nil && !s.root.isOf(r, rootUID(ranged, uid)) {
		// The sandbox's image changed while stopped, or this start's
		// agent has another uid range than the last.
		s.releaseRootLocked()
	}
	if s.root == nil {
		var idmap *os.File
		if ranged {
			var err error
			if idmap, err = s.b.idmapNS(uid); err != nil {
				return nil, err
			}
			defer func() { _ = idmap.Close() }()
		}
		m, err := mountRoot(r, idmap, s.b.opts.ExitWithHost)
		if err != nil && ranged {
			return nil, fmt.Errorf("mount the sandbox's overlay root: %w", err)
		}
		if err != nil {
			s.b.log.Debug("the agent mounts the root itself", "id", s.cfg.ID, "err", err.Error())
			return nil, nil
		}
		m.uid = rootUID(ranged, uid)
		s.root = m
		s.b.roots.mu.Lock()
		if s.b.roots.held == nil {
			s.b.roots.held = map[*Sandbox]bool{}
		}
		s.b.roots.held[s] = true
		s.b.roots.mu.Unlock()
	}
	f, err := s.root.clone()
	if err != nil {
		s.releaseRootLocked()
		if ranged {
			return nil, err
		}
		s.b.log.Debug("the agent mounts the root itself", "id", s.cfg.ID, "err", err.Error())
		return nil, nil
	}
	return f, nil
}

// rootUID is what a root mount for an agent at uid is idmapped to.
func rootUID(ranged bool, uid uint32) uint32 {
	if !ranged {
		return 0
	}
	return uid
}

// idleRootLocked keeps a stopped sandbox's root for a restart, for
// keepRoot, unless too many stopped sandboxes hold theirs already.
func (s *Sandbox) idleRootLocked() {
	if s.root == nil || s.rootTimer != nil {
		return
	}
	r := &s.b.roots
	r.mu.Lock()
	full := r.idle >= maxIdleRoots
	if !full {
		r.idle++
	}
	r.mu.Unlock()
	if full {
		s.releaseRootLocked()
		return
	}
	var t *time.Timer
	t = time.AfterFunc(keepRoot, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.rootTimer == t { // not taken back (or for a later stop)
			s.releaseRootLocked()
		}
	})
	s.rootTimer = t
}

// wakeRootLocked takes a stopped sandbox's held root back into use.
func (s *Sandbox) wakeRootLocked() {
	if s.rootTimer == nil {
		return
	}
	s.rootTimer.Stop()
	s.rootTimer = nil
	s.b.roots.mu.Lock()
	s.b.roots.idle--
	s.b.roots.mu.Unlock()
}

// releaseRootLocked unmounts the sandbox's root, if it holds one: the
// overlay goes (and syncs) once no running agent has it attached.
func (s *Sandbox) releaseRootLocked() { s.takeRootLocked().close() }

// takeRootLocked detaches the sandbox's root, if any, for the caller to
// close.
func (s *Sandbox) takeRootLocked() *rootMount {
	s.wakeRootLocked()
	m := s.root
	if m == nil {
		return nil
	}
	s.root = nil
	s.b.roots.mu.Lock()
	delete(s.b.roots.held, s)
	s.b.roots.mu.Unlock()
	return m
}

// close unmounts; nil is a no-op.
func (m *rootMount) close() {
	if m != nil {
		unix.Close(m.fd)
	}
}

// releaseRoots releases every held root (Close).
func (b *Backend) releaseRoots() {
	b.roots.mu.Lock()
	held := make([]*Sandbox, 0, len(b.roots.held))
	for s := range b.roots.held {
		held = append(held, s)
	}
	b.roots.mu.Unlock()
	for _, s := range held {
		s.mu.Lock()
		s.releaseRootLocked()
		s.mu.Unlock()
	}
}
