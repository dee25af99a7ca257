package setup

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/confined"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/seccomp"
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// Apply turns the freshly cloned process (already in its new namespaces) into
// the sandbox's init: it assembles the root filesystem, pivots into it, masks
// what must not be seen, starts the Launcher every sandbox process is forked
// from (in the sandbox's cgroup namespace, with the sandbox's capabilities),
// and installs the seccomp filter on every thread. It runs once, before the
// agent serves anything. staged, when not nil, is this agent's Stage: used
// when the spec fits it, discarded otherwise.
//
// Phases records how long each step took (milliseconds), for the host's
// start log; "staged" is 1 when the staged mounts were used.
func Apply(cfg *boot.Config, staged *Staged, phases map[string]float64) (*Launcher, error) {
	mark := phaseTimer(phases)
	s := cfg.Spec
	if s == nil || s.Root == nil || s.Linux == nil || s.Process == nil {
		staged.Discard()
		return nil, errors.New("setup: incomplete spec")
	}
	if len(cfg.SeccompFilter) == 0 || !s.Process.NoNewPrivileges {
		// Every sandbox has both; a config without is a host bug.
		staged.Discard()
		return nil, errors.New("setup: no seccomp filter or no_new_privs in the config")
	}
	if cfg.Prepared {
		staged.Discard()
		return applyPrepared(cfg, mark)
	}
	stdAt := -1
	if staged != nil {
		if at, ok := staged.fits(s); ok {
			stdAt = at
			phases["staged"] = 1
		} else {
			staged.Discard()
			staged = nil
		}
	}
	// Nothing we mount may propagate back to the host, nor anything the
	// host mounts from now on into the sandbox.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("make mounts private: %w", err)
	}
	root := s.Root.Path
	if err := mountOverlay(root, cfg.Rootfs); err != nil {
		return nil, err
	}
	mark("overlay")
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open rootfs: %w", err)
	}
	defer unix.Close(rootFD)
	nStd := len(oci.StandardMounts())
	binds := cfg.BindMounts
	for i, m := range s.Mounts {
		switch {
		case i == stdAt:
			if err := staged.moveInto(rootFD); err != nil {
				return nil, err
			}
			continue
		case stdAt >= 0 && i > stdAt && i < stdAt+nStd:
			continue // moved with the run's first
		case m.Type == "bind" && m.Source == "":
			if len(binds) == 0 {
				return nil, fmt.Errorf("mount on %s: the host's mount is missing", m.Destination)
			}
			if err := attachInRoot(rootFD, m, binds[0]); err != nil {
				return nil, fmt.Errorf("attach the volume on %s: %w", m.Destination, err)
			}
			binds = binds[1:]
			continue
		}
		if err := mountInRoot(rootFD, m); err != nil {
			return nil, fmt.Errorf("mount %s on %s: %w", m.Type, m.Destination, err)
		}
	}
	mark("mounts")
	if staged == nil {
		if err := makeDevLinks(rootFD); err != nil {
			return nil, err
		}
	}
	if err := pivotRoot(root); err != nil {
		return nil, err
	}
	mark("pivot")
	if staged == nil {
		for _, p := range s.Linux.MaskedPaths {
			if err := maskPath(p); err != nil {
				return nil, fmt.Errorf("mask %s: %w", p, err)
			}
		}
		for _, p := range s.Linux.ReadonlyPaths {
			if err := readonlyPath(p); err != nil {
				return nil, fmt.Errorf("make %s read-only: %w", p, err)
			}
		}
	}
	if cfg.Nameserver != "" {
		if err := writeResolvConf(cfg.Nameserver); err != nil {
			return nil, err
		}
	}
	if len(cfg.TrustCA) > 0 {
		if err := installTrust(cfg.TrustCA); err != nil {
			return nil, err
		}
	}
	if s.Root.Readonly {
		// The root mount's own flag: what is mounted below it (the
		// writable paths' binds, /proc, /dev, volumes) keeps its own.
		if err := remountBind("/", unix.MS_RDONLY); err != nil {
			return nil, fmt.Errorf("make root read-only: %w", err)
		}
	}
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return nil, fmt.Errorf("set hostname: %w", err)
		}
	}
	if staged == nil {
		if err := loopbackUp(); err != nil {
			return nil, err
		}
	}
	for _, rl := range s.Process.Rlimits {
		if err := setRlimit(rl); err != nil {
			return nil, err
		}
	}
	cwd := s.Process.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := os.MkdirAll(cwd, 0o755); err != nil { //nolint:gosec // 0755: a missing working directory is made as a usual directory for the sandbox's own processes
		return nil, fmt.Errorf("create working directory: %w", err)
	}
	if err := unix.Chdir(cwd); err != nil {
		return nil, fmt.Errorf("enter working directory: %w", err)
	}
	// The agent's memory may hold what a client sent; other processes in the
	// sandbox must not read /proc/1/mem or open /proc/1/exe.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("set non-dumpable: %w", err)
	}
	mark("mask_and_misc")
	cgroupNS := false
	for _, ns := range s.Linux.Namespaces {
		cgroupNS = cgroupNS || ns.Type == specs.CgroupNamespace
	}
	var launcher *Launcher
	if staged != nil {
		launcher = staged.takeLauncher(s.Process.Capabilities)
	}
	if launcher != nil {
		err := launcher.Run(func() error {
			if err := joinWorkload(cfg.Workload); err != nil {
				return err
			}
			return finishStaged(cgroupNS, cfg.TimerSlack)
		})
		if err != nil {
			launcher.Close()
			return nil, err
		}
	}
	if launcher == nil {
		if launcher, err = NewLauncher(s.Process.Capabilities, cgroupNS, cfg.TimerSlack, cfg.Workload); err != nil {
			return nil, err
		}
	}
	if cfg.Workload > 0 {
		_ = unix.Close(cfg.Workload) // moves no more threads
	}
	mark("launcher")
	// Installing the filter sets no_new_privs on every thread as well.
	prog, err := seccomp.Decode(cfg.SeccompFilter)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	if err := seccomp.Install(prog); err != nil {
		return nil, fmt.Errorf("install seccomp filter: %w", err)
	}
	mark("seccomp")
	return launcher, nil
}

// phaseTimer returns a function that records, under each name, the time
// since the previous call (or since phaseTimer).
func phaseTimer(phases map[string]float64) func(string) {
	last := time.Now()
	return func(name string) {
		now := time.Now()
		if phases != nil {
			phases[name] = float64(now.Sub(last).Microseconds()) / 1000
		}
		last = now
	}
}

// mountOverlay puts the root's overlay on target: the host's mount when it
// sent one, else one the agent mounts itself (a host on a kernel without
// the new mount API, or whose mount failed).
func mountOverlay(target string, r boot.Rootfs) error {
	if r.Mount != 0 {
		// Made by the host (see Rootfs.Mount); attaching it is all.
		err := unix.MoveMount(r.Mount, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH)
		unix.Close(r.Mount)
		if err != nil {
			return fmt.Errorf("attach the root's overlay: %w", err)
		}
		return nil
	}
	if len(r.Lower) == 0 {
		return errors.New("rootfs: no lower directory")
	}
	opts := "lowerdir=" + strings.Join(r.Lower, ":")
	if r.Upper != "" {
		opts += ",upperdir=" + r.Upper + ",workdir=" + r.Work
	}
	if r.UserXattr {
		opts += ",userxattr"
	}
	if len(opts) >= unix.Getpagesize() {
		return fmt.Errorf("rootfs: overlay options are %d bytes, more than one page", len(opts))
	}
	if r.Dir != "" {
		// Relative lower paths are resolved from the working directory
		// at mount time.
		if err := unix.Chdir(r.Dir); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		defer func() { _ = unix.Chdir("/") }()
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	return nil
}

// mountInRoot mounts m at its destination inside the root, resolving the
// destination with RESOLVE_IN_ROOT so a symlink planted in an image (say
// /proc -> /etc, or -> ../../..) can never redirect a mount onto the host.
func mountInRoot(rootFD int, m specs.Mount) error {
	flags, data, bind := parseMountOptions(m.Options)
	isFile := false
	src := m.Source
	if bind && !path.IsAbs(m.Source) {
		// A source inside the new root: a read-only root's writable
		// path, bound onto itself (oci.Params.WritablePaths). Made when
		// missing, as the sandbox's root; reached without symlinks, so
		// one the sandbox left there fails the start rather than binds
		// some other directory writable.
		sfd, err := confined.EnsureInRoot(rootFD, m.Source, false, true)
		if err != nil {
			return fmt.Errorf("writable path /%s: %w", m.Source, err)
		}
		defer unix.Close(sfd)
		src = "/proc/self/fd/" + strconv.Itoa(sfd)
	} else if bind {
		// The source is resolved once, without following symlinks, and
		// mounted through its descriptor: a volume's host path that was
		// swapped for a symlink after the host checked it (by another
		// sandbox sharing its parent, say) fails here rather than
		// mounting where the symlink points.
		sfd, err := unix.Openat2(unix.AT_FDCWD, m.Source, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return fmt.Errorf("bind source %s: %w", m.Source, err)
		}
		defer unix.Close(sfd)
		var st unix.Stat_t
		if err := unix.Fstat(sfd, &st); err != nil {
			return err
		}
		isFile = st.Mode&unix.S_IFMT != unix.S_IFDIR
		src = "/proc/self/fd/" + strconv.Itoa(sfd)
	}
	// A bind's destination must be reached without a symlink: one the
	// sandbox left in its upper layer (/data -> /proc, say) would otherwise
	// send a volume over the sandbox's own /proc or /dev. Nothing of the
	// sandbox runs during setup, so what is resolved here stays.
	fd, err := confined.EnsureInRoot(rootFD, m.Destination, isFile, bind)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	dst := "/proc/self/fd/" + strconv.Itoa(fd)
	if bind {
		if err := unix.Mount(src, dst, "", unix.MS_BIND|(flags&unix.MS_REC), ""); err != nil {
			return err
		}
		// A bind ignores most flags; apply them with a remount, keeping the
		// flags the kernel locked on the source (a user namespace may not
		// clear nosuid/nodev/noexec inherited from the host). The fd above
		// names the directory under the new mount, so reopen to reach it.
		if rest := flags &^ (unix.MS_REC | unix.MS_BIND); rest != 0 {
			top, err := confined.EnsureInRoot(rootFD, m.Destination, isFile, true)
			if err != nil {
				return err
			}
			defer unix.Close(top)
			return remountBind("/proc/self/fd/"+strconv.Itoa(top), rest)
		}
		return nil
	}
	return unix.Mount(m.Source, dst, m.Type, uintptr(flags), data)
}

// attachInRoot attaches mnt, a detached mount the host made (its flags and
// id mapping already set), at m's destination inside the root, reached as
// mountInRoot reaches it, and closes mnt.
func attachInRoot(rootFD int, m specs.Mount, mnt int) error {
	defer unix.Close(mnt)
	var st unix.Stat_t
	if err := unix.Fstat(mnt, &st); err != nil {
		return err
	}
	fd, err := confined.EnsureInRoot(rootFD, m.Destination, st.Mode&unix.S_IFMT != unix.S_IFDIR, true)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.MoveMount(mnt, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
}

func remountBind(target string, flags uintptr) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return err
	}
	have := uintptr(0)
	for _, f := range []struct{ st, ms uintptr }{
		{unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_RDONLY, unix.MS_RDONLY},
		{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if uintptr(st.Flags)&f.st != 0 {
			have |= f.ms
		}
	}
	if have&flags == flags {
		return nil // the source's flags already include them: save a mount
	}
	return unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags|have, "")
}

var mountFlags = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro": {false, unix.MS_RDONLY}, "rw": {true, unix.MS_RDONLY},
	"nosuid": {false, unix.MS_NOSUID}, "suid": {true, unix.MS_NOSUID},
	"nodev": {false, unix.MS_NODEV}, "dev": {true, unix.MS_NODEV},
	"noexec": {false, unix.MS_NOEXEC}, "exec": {true, unix.MS_NOEXEC},
	"bind": {false, unix.MS_BIND}, "rbind": {false, unix.MS_BIND | unix.MS_REC},
	"relatime": {false, unix.MS_RELATIME}, "noatime": {false, unix.MS_NOATIME},
	"strictatime": {false, unix.MS_STRICTATIME},
	"private":     {false, 0}, "rprivate": {false, 0},
}

func parseMountOptions(opts []string) (flags uintptr, data string, bind bool) {
	var extra []string
	for _, o := range opts {
		f, ok := mountFlags[o]
		if !ok {
			extra = append(extra, o)
			continue
		}
		if f.clear {
			flags &^= f.flag
		} else {
			flags |= f.flag
		}
	}
	return flags, strings.Join(extra, ","), flags&unix.MS_BIND != 0
}

func makeDevLinks(rootFD int) error {
	dev, err := confined.EnsureInRoot(rootFD, "/dev", false, false)
	if err != nil {
		return err
	}
	defer unix.Close(dev)
	dfd, err := unix.Openat(dev, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx", "core": "/proc/kcore",
	} {
		if err := unix.Symlinkat(target, dfd, name); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create /dev/%s: %w", name, err)
		}
	}
	return nil
}

func pivotRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("enter rootfs: %w", err)
	}
	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// detach then removes it without needing a directory to put it in.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

func maskPath(p string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0")
	}
	return unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
}

func readonlyPath(p string) error {
	if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	return remountBind(p, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring loopback up: %w", err)
	}
	return nil
}

var rlimitNames = map[string]int{
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_CORE": unix.RLIMIT_CORE,
	"RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE,
	"RLIMIT_STACK": unix.RLIMIT_STACK, "RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK,
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
}

func setRlimit(rl specs.POSIXRlimit) error {
	res, ok := rlimitNames[rl.Type]
	if !ok {
		return fmt.Errorf("unknown rlimit %q", rl.Type)
	}
	// Raising a hard limit needs CAP_SYS_RESOURCE in the host's user
	// namespace, which a sandbox never has: limits can only be lowered.
	var cur unix.Rlimit
	if err := unix.Getrlimit(res, &cur); err != nil {
		return fmt.Errorf("get %s: %w", rl.Type, err)
	}
	hard, soft := min(rl.Hard, cur.Max), min(rl.Soft, cur.Max)
	if err := unix.Setrlimit(res, &unix.Rlimit{Cur: soft, Max: hard}); err != nil {
		return fmt.Errorf("set %s: %w", rl.Type, err)
	}
	return nil
}

// writeResolvConf makes /etc/resolv.conf name only ns, the host's resolver
// for this sandbox. An image's resolv.conf may be a symlink (into /run, for
// systemd-resolved) or name a loopback stub that does not exist here; it is
// replaced, in the sandbox's own upper layer, by a plain file.
func writeResolvConf(ns string) error {
	a, err := netip.ParseAddr(ns)
	if err != nil || !a.Is4() {
		return fmt.Errorf("nameserver %.40q: want an IPv4 address", ns)
	}
	if err := os.MkdirAll("/etc", 0o755); err != nil { //nolint:gosec // 0755: the usual mode of /etc
		return fmt.Errorf("resolv.conf: %w", err)
	}
	if fi, err := os.Lstat("/etc/resolv.conf"); err == nil && !fi.Mode().IsRegular() {
		if err := os.Remove("/etc/resolv.conf"); err != nil {
			return fmt.Errorf("resolv.conf: replace the image's %v: %w", fi.Mode().Type(), err)
		}
	}
	// O_NOFOLLOW: the sandbox's root is its own, but a symlink here was
	// just removed and nothing else runs yet; this keeps it so.
	f, err := os.OpenFile("/etc/resolv.conf", os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644) //nolint:gosec // 0644: every process reads resolv.conf
	if err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	if _, err := fmt.Fprintf(f, "nameserver %s\n", a); err != nil {
		_ = f.Close()
		return fmt.Errorf("resolv.conf: %w", err)
	}
	return f.Close()
}

// applyPrepared is Apply for an agent an OCI runtime started
// (boot.Config.Prepared): the runtime made the root, its mounts and masks,
// the hostname and the network, so what is left is what concerns the
// processes the agent starts. The runtime's sandbox has no cgroup
// namespace of its own to enter and no workload cgroup to join: its
// limits hold the whole sandbox, the agent included.
func applyPrepared(cfg *boot.Config, mark func(string)) (*Launcher, error) {
	s := cfg.Spec
	if len(cfg.TrustCA) > 0 {
		// The runtime's root is writable here: the runtime refuses a
		// trusted CA with a read-only one (its root is read-only from
		// the start, with no moment to write before).
		if err := installTrust(cfg.TrustCA); err != nil {
			return nil, err
		}
	}
	for _, rl := range s.Process.Rlimits {
		if err := setRlimit(rl); err != nil {
			return nil, err
		}
	}
	cwd := s.Process.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := os.MkdirAll(cwd, 0o755); err != nil { //nolint:gosec // as in Apply
		return nil, fmt.Errorf("create working directory: %w", err)
	}
	if err := unix.Chdir(cwd); err != nil {
		return nil, fmt.Errorf("enter working directory: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("set non-dumpable: %w", err)
	}
	mark("mask_and_misc")
	launcher, err := NewLauncher(s.Process.Capabilities, false, cfg.TimerSlack, 0)
	if err != nil {
		return nil, err
	}
	mark("launcher")
	prog, err := seccomp.Decode(cfg.SeccompFilter)
	if err != nil {
		launcher.Close()
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	if err := seccomp.Install(prog); err != nil {
		launcher.Close()
		return nil, fmt.Errorf("install seccomp filter: %w", err)
	}
	mark("seccomp")
	return launcher, nil
}
