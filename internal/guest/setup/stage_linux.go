package setup

import (
	"fmt"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/confined"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// stagedTops are the standard mounts' top-level destinations: each is moved
// into the root with everything mounted below it.
var stagedTops = []string{"/proc", "/dev", "/sys"}

// Staged is the part of every sandbox that does not depend on its config:
//   - /proc, /dev (with its devices, pts, shm, mqueue and links) and /sys,
//     mounted as oci.Build describes them and already masked and made
//     read-only as oci.MaskedPaths and oci.ReadonlyPaths say, on a private
//     tmpfs;
//   - the loopback interface, up;
//   - the Launcher's thread, with the default capabilities' bounding set
//     and sets, plus CAP_SYS_ADMIN in its effective and permitted ones: at
//     start (Apply) it enters its cgroup namespace and lets that go. By
//     then the host has made the agent's cgroup the sandbox's (renamed on
//     cgroup v1, moved into on v2), so the namespace is rooted there.
//
// A start whose spec asks for exactly these moves three mounts into its
// root instead of making some thirty and finishes the launcher. Any other
// spec discards what does not fit and builds it from scratch, so the result
// is the same either way.
type Staged struct {
	dir      string
	launcher *Launcher
}

// Stage builds what Staged describes. The mounts go on a fresh tmpfs at
// dir, a directory that exists on the host (the tmpfs is in this process's
// own mount namespace, so nothing of it is visible there). It makes every
// mount in the namespace a slave first: nothing mounted here propagates to
// the host, while what the host mounts until the config arrives (a volume's
// file system, say) still reaches this namespace, as it would without the
// staging; Apply makes them private. On error nothing is left mounted.
func Stage(dir string) (st *Staged, err error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return nil, fmt.Errorf("make mounts slaves: %w", err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return nil, fmt.Errorf("stage tmpfs: %w", err)
	}
	st = &Staged{dir: dir}
	defer func() {
		if err != nil {
			st.Discard()
		}
	}()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	for _, m := range oci.StandardMounts() {
		if err := mountInRoot(fd, m); err != nil {
			return nil, fmt.Errorf("stage %s on %s: %w", m.Type, m.Destination, err)
		}
	}
	if err := makeDevLinks(fd); err != nil {
		return nil, err
	}
	// Everything below is our own fresh mounts: plain paths cannot be
	// redirected.
	for _, p := range oci.MaskedPaths {
		if err := maskPath(dir + p); err != nil {
			return nil, fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range oci.ReadonlyPaths {
		if err := readonlyPath(dir + p); err != nil {
			return nil, fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	if err := loopbackUp(); err != nil {
		return nil, err
	}
	if st.launcher, err = startLauncher(stageLauncher); err != nil {
		return nil, err
	}
	return st, nil
}

// Discard unmounts the staging and ends its launcher.
func (st *Staged) Discard() {
	if st != nil {
		_ = unix.Unmount(st.dir, unix.MNT_DETACH)
		st.takeLauncher(nil).Close()
	}
}

// takeLauncher returns the staged launcher if c are the capabilities it
// was staged for, nil otherwise; either way the staging no longer holds it.
func (st *Staged) takeLauncher(c *specs.LinuxCapabilities) *Launcher {
	l := st.launcher
	st.launcher = nil
	if !reflect.DeepEqual(c, oci.ProcessCapabilities()) {
		l.Close()
		return nil
	}
	return l
}

// fits reports whether s asks for exactly what was staged: the standard
// mounts as one run, the standard masked and read-only paths, and no other
// mount at or below /proc, /dev or /sys (which would change what the
// masks cover, or be covered by the moved mounts in a different order).
// It returns the index of the standard run in s.Mounts.
func (st *Staged) fits(s *boot.Spec) (int, bool) {
	if !slices.Equal(s.Linux.MaskedPaths, oci.MaskedPaths) || !slices.Equal(s.Linux.ReadonlyPaths, oci.ReadonlyPaths) {
		return 0, false
	}
	std := oci.StandardMounts()
	at := -1
	for i := 0; i+len(std) <= len(s.Mounts); i++ {
		if reflect.DeepEqual(s.Mounts[i:i+len(std)], std) {
			at = i
			break
		}
	}
	if at < 0 {
		return 0, false
	}
	for i, m := range s.Mounts {
		if i >= at && i < at+len(std) {
			continue
		}
		d := path.Clean("/" + m.Destination)
		for _, top := range stagedTops {
			if d == top || strings.HasPrefix(d, top+"/") {
				return 0, false
			}
		}
	}
	return at, true
}

// moveInto moves the staged mounts to their places in the root, resolving
// each destination inside the root as mountInRoot does.
func (st *Staged) moveInto(rootFD int) error {
	for _, top := range stagedTops {
		fd, err := confined.EnsureInRoot(rootFD, top, false, false)
		if err != nil {
			return fmt.Errorf("staged %s: %w", top, err)
		}
		err = unix.Mount(st.dir+top, "/proc/self/fd/"+strconv.Itoa(fd), "", unix.MS_MOVE, "")
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("move staged %s into the root: %w", top, err)
		}
	}
	return nil
}
