// Package native is Warren's own isolation backend: the sandbox's agent runs
// as PID 1 in new mount, pid, ipc, uts, net and cgroup namespaces (and a user
// namespace where the kernel allows it), on an overlay root, in its own
// cgroup, with dropped capabilities and a seccomp filter.
//
// On-disk layout, all owned by one sandbox and removed with it:
//
//	<DataDir>/sandboxes/<id>/{upper,work,rootfs}   overlay upper layer kept across stop/start;
//	                                               with disk limits <id> is a btrfs subvolume
//	                                               (disk_linux.go) on <DataDir>/disk.img
//	<RunDir>/<id>/{agent.sock,agent.pid,agent.log} runtime state, removed at stop
//	cgroup <own cgroup>/warren/<id>                per controller, removed at stop;
//	       <id>/agent and <id>/work                in pids (cgroup.Limits.AgentPids)
//
// Shared by the backend's sandboxes: <RunDir>/.agent/warren-agent-<hash>,
// the agent binary they exec.
//
// Mounts and namespaces live only inside the sandbox's mount namespace, so
// they disappear with its last process; nothing is mounted on the host.
package native

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/seccomp"
	"github.com/warren-sandbox/warren/internal/spawner"
	"github.com/warren-sandbox/warren/internal/timerslack"
	"github.com/warren-sandbox/warren/internal/uidrange"
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// User namespace modes.
const (
	UserNSAuto = "auto" // use one when the kernel allows it
	UserNSOn   = "on"   // require one
	UserNSOff  = "off"  // run as host root with dropped capabilities
)

// dirRemedy ends the error of an unreachable data or run directory.
const dirRemedy = "chmod o+x it, or choose another --data-dir or --run-dir"

// DefaultUIDBase is the first id of the storage range [base, base+65536):
// what sandboxes' and images' files on disk are owned by. With per-sandbox
// uid ranges each running sandbox maps to a range of its own above it
// (uidrange_linux.go); without, every sandbox's root is base.
const DefaultUIDBase = 0x60000000

// Options configure the backend.
type Options struct {
	DataDir     string // default /var/lib/warren
	RunDir      string // default /run/warren
	AgentPath   string // the warren-agent binary
	SpawnerPath string // the warren-spawner binary (package spawner)
	// Net gives sandboxes of Config.Network backend.NetworkEgress their
	// link (net_linux.go); nil: such a start is refused.
	Net     *netplumb.Host
	UserNS  string // UserNSAuto (default), UserNSOn, UserNSOff
	UIDBase uint32 // default DefaultUIDBase
	// UIDRanges is UIDRangesAuto (default), UIDRangesOn or UIDRangesOff:
	// whether each running sandbox gets a host uid range of its own
	// (uidrange_linux.go), UIDRangeCount of them above UIDBase (0:
	// uidrange.DefaultCount).
	UIDRanges     string
	UIDRangeCount int
	Python        string // interpreter paths inside the sandbox
	Node          string
	// CgroupPrefix names the cgroup under the process's own one (default
	// "warren" for the default RunDir, "warren-<hash of RunDir>" otherwise).
	CgroupPrefix string
	// ExitWithHost makes every sandbox end when this process ends (for
	// `warren run`); a daemon leaves it off so sandboxes survive restarts.
	ExitWithHost bool
	// Prewarm keeps this many agents spawned ahead of time, so a start
	// skips clone, namespace creation, exec and the agent's runtime start
	// (0 = spawn at each start; right for one-shot use like `warren run`).
	Prewarm int
	// DiskPool turns disk limits (backend.Config.DiskBytes) on: the
	// size of the btrfs image <DataDir>/disk.img made sparse and mounted
	// on <DataDir>/sandboxes when the data directory is not on btrfs
	// (disk_linux.go). 0: limits off, sandboxes write without a cap.
	DiskPool int64
	// StartTimeout bounds a sandbox's start (default 10s).
	StartTimeout time.Duration
	Logger       *slog.Logger
}

// Backend is the native backend.
type Backend struct {
	opts      Options
	agentPath string     // the backend's own copy of the agent, under RunDir
	agentHeld *os.File   // agentPath, share-locked while the backend lives
	userNS    *oci.IDMap // the storage range: what files on disk are owned by
	// ranges hands each agent a uid range of its own; nil when every
	// sandbox runs as the storage range (uidrange_linux.go).
	ranges  *uidrange.Allocator
	idmaps  idmaps
	cgroups *cgroup.Manager
	log     *slog.Logger

	pool *pool
	// sp is the spawner process, which starts every agent; it is started
	// again should it die.
	spMu sync.Mutex
	sp   *spawner.Client
	// releasing maps the ids of stopped sandboxes whose release still
	// runs to a channel closed when it is done, so a start through any
	// handle of the same sandbox, and Close, wait for it.
	releaseMu sync.Mutex
	releasing map[string]chan struct{}
	// disk is the disk pool sandboxes' directories are limited on, nil
	// with limits off (disk_linux.go).
	disk *diskquota.Dirs
	// diskOff is why disk limits asked for (Options.DiskPool) are off.
	diskOff string
	// roots are the sandboxes' root mounts the backend holds.
	roots roots
	// removing counts removed sandboxes whose files are still being
	// deleted (removeDir).
	removing sync.WaitGroup

	// agentMountsRoots has every agent mount its root itself, as on a
	// kernel where the host cannot hold roots (tests).
	agentMountsRoots bool

	// poolMigrates moves a pooled agent into a new cgroup at start instead
	// of renaming its pool cgroup: cgroup v2 cannot rename.
	poolMigrates bool

	// seccompFilter is the default seccomp profile (every sandbox's),
	// compiled once: agents install it without compiling.
	seccompFilter []byte

	hostOnce sync.Once
	hostImg  *image.Image
	hostErr  error
}

// New checks the host and returns the backend.
func New(opts Options) (*Backend, error) {
	if opts.DataDir == "" {
		opts.DataDir = "/var/lib/warren"
	}
	if opts.RunDir == "" {
		opts.RunDir = "/run/warren"
	}
	if opts.UserNS == "" {
		opts.UserNS = UserNSAuto
	}
	if opts.UIDRanges == "" {
		opts.UIDRanges = UIDRangesAuto
	}
	switch opts.UIDRanges {
	case UIDRangesAuto, UIDRangesOn, UIDRangesOff:
	default:
		return nil, fmt.Errorf("native backend: uid range mode %q: want auto, on or off", opts.UIDRanges)
	}
	if opts.UIDBase == 0 {
		opts.UIDBase = DefaultUIDBase
	}
	if opts.CgroupPrefix == "" {
		opts.CgroupPrefix = InstancePrefix(opts.RunDir)
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("native backend: must run as root (namespaces, cgroups and overlay mounts need it)")
	}
	prog, err := seccomp.Compile(seccomp.DefaultProfile())
	if err != nil {
		return nil, fmt.Errorf("native backend: seccomp profile: %w", err)
	}
	b := &Backend{opts: opts, log: opts.Logger, seccompFilter: seccomp.Encode(prog)}
	topDirs := []string{opts.DataDir, filepath.Join(opts.DataDir, "sandboxes"), filepath.Join(opts.DataDir, "images"), opts.RunDir}
	for _, d := range topDirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("native backend: %w", err)
		}
	}
	b.prepareDisk()
	if err := os.MkdirAll(filepath.Join(opts.DataDir, "sandboxes", removedDir), 0o700); err != nil {
		return nil, fmt.Errorf("native backend: %w", err)
	}
	if err := checkUpperFS(opts.DataDir); err != nil {
		return nil, fmt.Errorf("native backend: %w", err)
	}
	switch opts.UserNS {
	case UserNSOff, UserNSOn, UserNSAuto:
	default:
		return nil, fmt.Errorf("native backend: user namespace mode %q: want auto, on or off", opts.UserNS)
	}
	if opts.SpawnerPath == "" {
		return nil, errors.New("native backend: no spawner binary (build cmd/warren-spawner with `make build`, or set WARREN_SPAWNER)")
	}
	if err := b.openAgent(); err != nil {
		return nil, err
	}
	cg, err := cgroup.New(opts.CgroupPrefix)
	if err != nil {
		_ = b.agentHeld.Close()
		return nil, fmt.Errorf("native backend: %w", err)
	}
	b.cgroups = cg
	b.poolMigrates = !cg.CanRename()
	// The agents of a spawner that died become this process's children,
	// to be reaped when they exit.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		_ = b.agentHeld.Close()
		return nil, fmt.Errorf("native backend: become child subreaper: %w", err)
	}
	if _, err := b.liveSpawner(); err != nil {
		_ = b.agentHeld.Close()
		return nil, fmt.Errorf("native backend: %w", err)
	}
	if opts.UserNS != UserNSOff {
		if err := b.useUserNS(); err != nil {
			b.closeSpawner()
			_ = b.cgroups.Close()
			_ = b.agentHeld.Close()
			return nil, err
		}
	}
	if opts.UIDRanges != UIDRangesOff && b.userNS != nil {
		err := b.enableRanges()
		if err != nil && opts.UIDRanges == UIDRangesOn {
			b.closeSpawner()
			b.closeIDMaps()
			_ = b.agentHeld.Close()
			return nil, fmt.Errorf("native backend: per-sandbox uid ranges required but unusable: %w", err)
		}
		if err != nil {
			b.log.Warn("per-sandbox uid ranges unavailable; every sandbox runs as the same host uid range", "reason", err.Error())
		}
	}
	if err := b.closeDirs(topDirs); err != nil {
		b.closeSpawner()
		b.closeIDMaps()
		_ = b.agentHeld.Close()
		return nil, fmt.Errorf("native backend: %w", err)
	}
	if opts.Prewarm > 0 {
		b.reserveNet()
		if err := b.startPool(opts.Prewarm); err != nil {
			b.closeSpawner()
			_ = b.agentHeld.Close()
			return nil, fmt.Errorf("native backend: warm pool: %w", err)
		}
	}
	return b, nil
}

// useUserNS sets sandboxes up to run in a user namespace when this host
// allows it; an error when it does not and opts.UserNS is on. The probe is
// the spawner's (ProbeUserNS, which forks this process, cost a one-shot
// `warren run` ~4% of its time): the namespace that maps the storage range
// to the first uid range, which enableRanges checks the data directory
// with and the first sandbox in a range of its own runs in (idmapNS keeps
// it).
func (b *Backend) useUserNS() error {
	b.userNS = &oci.IDMap{Host: b.opts.UIDBase, Size: 65536}
	err := userNSDisabled()
	if err == nil {
		var ns *os.File
		if ns, err = b.idmapNS(b.userNS.Host + uidrange.Size); err == nil {
			_ = ns.Close()
		} else {
			err = fmt.Errorf("create a user namespace with a mapped uid range: %w", err)
		}
	}
	// The directories above the data and run directories: their own
	// modes are set by closeDirs.
	if err == nil {
		err = checkTraversable(parentDir(b.opts.DataDir), int(b.opts.UIDBase), dirRemedy)
	}
	if err == nil {
		err = checkTraversable(parentDir(b.opts.RunDir), int(b.opts.UIDBase), dirRemedy) // the agent is exec'd from there
	}
	if err == nil {
		return nil
	}
	b.userNS = nil
	b.closeIDMaps()
	if b.opts.UserNS == UserNSOn {
		return fmt.Errorf("native backend: user namespaces required but unusable: %w", err)
	}
	b.log.Warn("user namespaces unavailable; sandbox root is host root with dropped capabilities", "reason", err.Error())
	return nil
}

// closeDirs gives the data and run directories (and the data directory's
// sandboxes and images) to root, so that no other host user reaches
// anything below. Issue #18, finding 2: with these world-searchable (0711)
// a host user who learnt a path (from a sandbox's mountinfo, say) could
// run what a sandbox had made setuid in its upper layer, and become the
// uid that owns every sandbox's files. With per-sandbox uid ranges the
// host mounts everything a sandbox sees from the data directory, which is
// root's alone (0700); the run directory is 0711, for agents to reach
// their binary and the empty directories they mount on (RunDir/.agent,
// .root, .pool/stage), everything else below it being 0700. Without,
// they belong to root and the sandboxes' root group, 0710: a sandbox's
// agent, while it sets up as sandbox root, passes through them to its
// layers and the agent binary. Applied to an existing directory too, so
// data directories made by older releases close up at the next start.
func (b *Backend) closeDirs(dirs []string) error {
	_, gid := b.RootIDs()
	for _, d := range dirs {
		mode := os.FileMode(dirMode)
		if b.ranges != nil {
			gid, mode = 0, 0o700
			if d == b.opts.RunDir {
				mode = 0o711
			}
		}
		if err := os.Chown(d, 0, gid); err != nil {
			return err
		}
		if err := os.Chmod(d, mode); err != nil {
			return err
		}
	}
	return nil
}

// dirMode is the mode of the data and run directories (closeDirs).
const dirMode = 0o710

// parentDir is the directory dir is in.
func parentDir(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return filepath.Dir(dir)
	}
	return filepath.Dir(abs)
}

// liveSpawner returns the running spawner, starting one if there is none
// or the last one died.
func (b *Backend) liveSpawner() (*spawner.Client, error) {
	b.spMu.Lock()
	defer b.spMu.Unlock()
	if b.sp != nil && b.sp.Alive() {
		return b.sp, nil
	}
	if b.sp != nil {
		b.log.Warn("spawner process exited; starting another (its log: " + filepath.Join(b.opts.RunDir, spawnerLog) + ")")
	}
	logf, err := os.OpenFile(filepath.Join(b.opts.RunDir, spawnerLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spawner log: %w", err)
	}
	defer func() { _ = logf.Close() }()
	sp, err := spawner.Start(b.opts.SpawnerPath, logf)
	if err != nil {
		return nil, err
	}
	b.sp = sp
	return sp, nil
}

// spawnerLog is the spawner's log under RunDir (a dot entry, which
// ReapOrphans leaves alone).
const spawnerLog = ".spawner.log"

func (b *Backend) closeSpawner() {
	b.spMu.Lock()
	defer b.spMu.Unlock()
	if b.sp != nil {
		_ = b.sp.Close()
		b.sp = nil
	}
}

// openAgent installs the backend's copy of the agent binary under RunDir
// and execs sandboxes from there. RunDir is root's and searchable by the
// sandboxes' root group only (closeDirs), so the agent runs whether or not
// the directories above AgentPath are reachable by the sandbox's uid, and a rebuilt binary at AgentPath
// never changes what a running backend starts.
//
// The agent used to be exec'd through /proc/self/fd/N of a kept-open
// descriptor; under 8 concurrent starts (user namespace, new pid
// namespace) that execve failed with EACCES in about half of the
// benchmark's runs on this kernel, where a path never did.
//
// Each backend holds a shared lock on its copy while it lives; copies no
// backend holds (older builds) are deleted here, under an exclusive lock
// on the directory so an install and a sweep never interleave.
func (b *Backend) openAgent() error {
	p := b.opts.AgentPath
	if p == "" {
		return errors.New("native backend: no agent binary (build cmd/warren-agent, or set WARREN_AGENT)")
	}
	src, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("native backend: agent: %w", err)
	}
	// A dot directory: ReapOrphans leaves RunDir's dot entries alone.
	dir := filepath.Join(b.opts.RunDir, ".agent")
	if err := mkdirAllMode(dir, 0o711); err != nil {
		return fmt.Errorf("native backend: install agent: %w", err)
	}
	d, err := os.Open(dir) //nolint:gosec // dir is RunDir/.agent, created just above; opened to flock it
	if err != nil {
		return fmt.Errorf("native backend: install agent: %w", err)
	}
	defer func() { _ = d.Close() }() // releases the directory lock
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("native backend: lock %s: %w", dir, err)
	}
	// Named by the source's identity (path, inode, size, mtime) rather
	// than a hash of its content, so a `warren run` does not read and hash
	// 3.5 MB each time; a rebuilt agent gets a new name.
	st := src.Sys().(*syscall.Stat_t)
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%d\x00%d", p, st.Dev, st.Ino, src.Size(), src.ModTime().UnixNano()))
	dst := filepath.Join(dir, "warren-agent-"+hex.EncodeToString(sum[:12]))
	if cur, err := os.Stat(dst); err != nil || cur.Size() != src.Size() {
		bin, err := os.ReadFile(p) //nolint:gosec // p is the agent binary the daemon was configured with (Options.AgentPath)
		if err != nil {
			return fmt.Errorf("native backend: read agent: %w", err)
		}
		if err := writeExecutable(dir, dst, bin); err != nil {
			return fmt.Errorf("native backend: install agent: %w", err)
		}
	}
	held, err := os.Open(dst) //nolint:gosec // dst is inside RunDir/.agent, named by the agent's identity hash
	if err == nil {
		err = unix.Flock(int(held.Fd()), unix.LOCK_SH)
	}
	if err != nil {
		return fmt.Errorf("native backend: hold agent: %w", err)
	}
	b.agentPath, b.agentHeld = dst, held
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if other := filepath.Join(dir, e.Name()); other != dst {
			removeUnheld(other)
		}
	}
	return nil
}

// mkdirAllMode is os.MkdirAll with dir's mode set exactly (the umask may
// have cleared bits the sandbox's root needs to pass through).
func mkdirAllMode(dir string, mode os.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

// writeExecutable writes bin to dst (mode 0755) through a temporary file
// in dir and a rename, so nobody sees a partial binary.
func writeExecutable(dir, dst string, bin []byte) error {
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = tmp.Write(bin)
	if err == nil {
		err = tmp.Chmod(0o755)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// removeUnheld deletes p unless a backend holds its shared lock.
func removeUnheld(p string) {
	f, err := os.Open(p) //nolint:gosec // p is an entry of RunDir/.agent listed by openAgent, opened only to test its lock
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		_ = os.Remove(p)
	}
}

// Close releases the backend's own resources (not the sandboxes): the warm
// pool's agents, the cgroup prefix when empty, and the agent binary. It
// waits for stopped sandboxes' background releases first.
func (b *Backend) Close() error {
	b.pool.close()
	b.releaseRoots()
	b.closeSpawner()
	b.closeIDMaps()
	b.releaseMu.Lock()
	pending := make([]chan struct{}, 0, len(b.releasing))
	for _, ch := range b.releasing {
		pending = append(pending, ch)
	}
	b.releaseMu.Unlock()
	for _, ch := range pending {
		<-ch
	}
	b.removing.Wait()
	return errors.Join(b.cgroups.Close(), b.agentHeld.Close())
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "native" }

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		UserNS:             b.userNS != nil,
		OOMKillsProcess:    true,
		PidsLimitFailsFork: true,
		// With ExitWithHost every agent ends with this process.
		Reattach: !b.opts.ExitWithHost,
		// No checkpoint: Debian's CRIU (3.17) cannot start on this
		// host's kernels ("Unexpected rt vDSO area bounds"), see
		// docs/isolation.md; isolation gvisor checkpoints.
		Checkpoint: false,
	}
}

// UserNS reports the storage range, which files on disk (upper layers,
// image layers) are owned by, or nil when sandboxes run without a user
// namespace. Without per-sandbox ranges (UIDRanges) sandboxes run as it.
func (b *Backend) UserNS() *oci.IDMap { return b.userNS }

// UIDRanges reports whether each running sandbox has a host uid range of
// its own.
func (b *Backend) UIDRanges() bool { return b.ranges != nil }

// Cgroups is the cgroup manager sandboxes are created with.
func (b *Backend) Cgroups() *cgroup.Manager { return b.cgroups }

// RootIDs are the host uid and gid of the sandbox's root user.
func (b *Backend) RootIDs() (int, int) {
	if b.userNS == nil {
		return 0, 0
	}
	return int(b.userNS.Host), int(b.userNS.Host)
}

// HostImage returns the host image, owned by the sandbox root ids.
func (b *Backend) HostImage() (*image.Image, error) {
	b.hostOnce.Do(func() {
		uid, gid := b.RootIDs()
		b.hostImg, b.hostErr = image.Host(filepath.Join(b.opts.DataDir, "images"), uid, gid)
	})
	return b.hostImg, b.hostErr
}

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid sandbox config: %w", err)
	}
	if b.userNS != nil && b.ranges == nil { // with ranges the host opens volumes (volumeMounts)
		_, gid := b.RootIDs()
		for _, v := range cfg.Volumes {
			if err := checkTraversable(filepath.Dir(v.Source), gid, fmt.Sprintf("chmod o+x it, or chgrp %d and chmod g+x, or mount from a reachable directory", gid)); err != nil {
				return nil, fmt.Errorf("volume %s: %w: %w", v.Source, backend.ErrVolumeNotAllowed, err)
			}
		}
	}
	sandboxes := filepath.Join(b.opts.DataDir, "sandboxes")
	dir := filepath.Join(sandboxes, cfg.ID)
	build := dir
	if b.opts.ExitWithHost {
		// An ephemeral sandbox is assembled under a name that IDs and
		// ReapOrphans pass over, with its marker held from the first
		// moment, then renamed into place: a daemon starting meanwhile
		// on the same data directory never sees it unowned.
		build = filepath.Join(sandboxes, newPrefix+cfg.ID)
	}
	if err := b.mkSandboxDir(build, cfg.DiskBytes); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("sandbox %q: %w", cfg.ID, fs.ErrExist)
		}
		return nil, err
	}
	var lock *os.File
	fail := func(err error) (backend.Sandbox, error) {
		_ = b.removeTree(build)
		if lock != nil {
			_ = lock.Close()
		}
		return nil, err
	}
	if b.opts.ExitWithHost {
		// The owner of an ephemeral sandbox holds this lock for the
		// sandbox's life; the kernel drops it when the owner dies, which
		// is how ReapOrphans tells leftovers from sandboxes in use.
		var err error
		if lock, err = lockFile(filepath.Join(build, ephemeralMarker), true); err != nil {
			return fail(err)
		}
	}
	// Whatever this process's umask: sandbox root must pass through.
	if err := os.Chmod(build, 0o711); err != nil { //nolint:gosec // 0711, whatever the umask (same reason as the Mkdir above)
		return fail(err)
	}
	uid, gid := b.RootIDs()
	for _, d := range []string{"upper", "work", "rootfs"} {
		p := filepath.Join(build, d)
		if err := os.Mkdir(p, 0o755); err != nil { //nolint:gosec // 0755 and chowned to the sandbox's root: upper is what the sandbox sees as / (overlay takes its mode), work and rootfs match it
			return fail(err)
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return fail(err)
		}
	}
	if build != dir {
		if err := unix.Renameat2(unix.AT_FDCWD, build, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("sandbox %q: %w", cfg.ID, fs.ErrExist)
			}
			return fail(err)
		}
	}
	sb := &Sandbox{b: b, cfg: cfg, dir: dir, run: filepath.Join(b.opts.RunDir, cfg.ID), lock: lock, diskCap: cfg.DiskBytes}
	return sb, nil
}

// InstancePrefix names what a backend of run directory runDir makes on the
// host outside its directories (its cgroups, its network's table and
// links): "warren" for the default /run/warren, "warren-<8 hex>" for
// another. Instances with different run directories must not share a
// prefix: ReapOrphans takes a cgroup under its prefix without a live agent
// in its own run directory for an orphan, and would kill the other
// instance's sandboxes.
func InstancePrefix(runDir string) string {
	if abs, err := filepath.Abs(runDir); err == nil && abs != "/run/warren" {
		sum := sha256.Sum256([]byte(abs))
		return "warren-" + hex.EncodeToString(sum[:4])
	}
	return "warren"
}

// Sandbox is one native sandbox.
type Sandbox struct {
	b   *Backend
	cfg backend.Config
	dir string // persistent state
	run string // runtime state

	mu       sync.Mutex
	proc     *initProc // the agent; nil when stopped
	cg       *cgroup.Cgroup
	client   *agent.Client
	lifeline *os.File
	lock     *os.File // held while this process owns an ephemeral sandbox
	// root is the overlay root the host mounted (rootmount_linux.go),
	// kept across stops; rootTimer runs while it is kept stopped.
	root      *rootMount
	rootTimer *time.Timer
	// link is the running sandbox's network link (net_linux.go); zero
	// without one.
	link netplumb.Link
	// diskCap is the disk limit last applied to the sandbox's directory
	// (disk_linux.go); -1: not known (a handle Open made).
	diskCap int64
}

// The contract and the optional abilities this backend provides.
var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.Sandbox      = (*Sandbox)(nil)
	_ backend.Reconfigurer = (*Sandbox)(nil)
	_ backend.DiskUser     = (*Sandbox)(nil)
	_ backend.DiskLimiter  = (*Sandbox)(nil)
	_ backend.Networked    = (*Sandbox)(nil)
)

// ID implements backend.Sandbox.
func (s *Sandbox) ID() string { return s.cfg.ID }

// Agent implements backend.Sandbox.
func (s *Sandbox) Agent() *agent.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// Done implements backend.Sandbox.
func (s *Sandbox) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return s.proc.done
}

// Pid is the host pid of the sandbox's init, 0 when stopped.
func (s *Sandbox) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid
}

// spec is the sandbox's OCI spec, the one description of it, and the
// agent's config made from it.
func (s *Sandbox) spec() (*specs.Spec, *boot.Config, error) {
	img := s.cfg.Image
	env := append(append([]string(nil), img.Env...), s.cfg.Env...)
	if len(img.Env) == 0 {
		env = append(append([]string(nil), oci.DefaultEnv...), s.cfg.Env...)
	}
	cwd := img.WorkingDir
	if s.cfg.Workdir != "" {
		cwd = s.cfg.Workdir
	}
	host := s.cfg.Hostname
	if host == "" {
		host = backend.DefaultHostname
	}
	rootPath := filepath.Join(s.dir, "rootfs")
	if s.b.ranges != nil {
		rootPath = filepath.Join(s.b.opts.RunDir, rootMountPoint)
	}
	sp, err := oci.Build(oci.Params{
		RootPath: rootPath, Hostname: host, Env: env, Cwd: cwd,
		ImageMounts: img.Mounts, Volumes: volumeBinds(s.cfg.Volumes, s.b.ranges != nil), UserNS: s.b.userNS,
		MemoryBytes: s.cfg.MemoryBytes, CPUs: s.cfg.CPUs, PidsMax: s.cfg.PidsMax, NoFile: uint64(max(s.cfg.NoFile, 0)), //nolint:gosec // G115: not negative after max
		ReadOnlyRoot: s.cfg.ReadOnlyRoot, WritablePaths: append(slices.Clone(backend.AlwaysWritable), s.cfg.WritablePaths...),
	})
	if err != nil {
		return nil, nil, err
	}
	// oci.Build puts the default profile in the spec; it travels
	// compiled (the backend's filter). The namespaces, id maps and cgroup
	// limits are applied here, not by the agent.
	rootfs := boot.Rootfs{
		Lower: img.Layers, Upper: filepath.Join(s.dir, "upper"), Work: filepath.Join(s.dir, "work"),
		UserXattr: s.b.userNS != nil,
	}
	return sp, &boot.Config{
		Spec:          boot.SpecFrom(sp),
		SeccompFilter: s.b.seccompFilter,
		Rootfs:        rootfs,
		Python:        s.b.opts.Python, Node: s.b.opts.Node, User: img.User,
		Lifeline: s.b.opts.ExitWithHost, Procs: uint32(math.Ceil(s.cfg.CPUs)),
		TimerSlack: timerslack.Original(),
	}, nil
}

// volumeBinds are the binds of vs (backend.VolumeMounts). With
// hostMounted, the host makes each bind's mount (volumeMounts), and the
// binds have no source (boot.Config.BindMounts).
func volumeBinds(vs []backend.Volume, hostMounted bool) []specs.Mount {
	ms := backend.VolumeMounts(vs)
	if hostMounted {
		for i := range ms {
			ms[i].Source = ""
		}
	}
	return ms
}

// Start implements backend.Sandbox. A failed start leaves nothing running
// and no cgroup or runtime directory behind.
func (s *Sandbox) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		select {
		case <-s.proc.done:
			_ = s.releaseLocked()
		default:
			return nil // already running
		}
	}
	if _, err := os.Stat(s.dir); err != nil {
		return fmt.Errorf("sandbox %s was removed", s.cfg.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.StartTimeout)
	defer cancel()
	if err := s.waitReleased(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	sp, gcfg, err := s.spec()
	if err != nil {
		return err
	}
	if err := s.ensureScratchDirs(); err != nil {
		return err
	}
	if s.cfg.DiskBytes != s.diskCap {
		s.setDiskLimit(s.cfg.DiskBytes) // a new cap (SetConfig) takes effect now
	}
	restoreCap := s.liftFullCap()
	defer restoreCap() // after the agent has mounted the root, or on failure
	// The cgroup's limits are the spec's resources, as an OCI runtime
	// would read them.
	res := oci.ResourceLimits(sp.Linux.Resources)
	limits := cgroup.Limits{MemoryBytes: res.MemoryBytes, CPUs: res.CPUs, PidsMax: res.PidsMax, AgentPids: backend.AgentPids}
	_ = os.RemoveAll(s.run)
	undo = append(undo, func() { _ = os.RemoveAll(s.run) })
	// A pooled agent has run nothing of any sandbox yet: its cgroup
	// becomes the sandbox's (renamed, limits set) before it reads its
	// config. Otherwise a new cgroup is made and the agent born in it.
	// With the host's plumbing every pooled agent has a link
	// (pool_linux.go): a sandbox of loopback only starts without the pool.
	var cg *cgroup.Cgroup
	var a *agentProc
	if s.cfg.Network == backend.NetworkEgress || s.b.opts.Net == nil {
		a = s.b.pool.take()
	}
	if a != nil {
		undo = append(undo, a.discard)
		if cg, err = s.adoptPoolCgroup(a, limits); err != nil {
			return err
		}
		if err := os.Rename(a.dir, s.run); err != nil {
			return err
		}
		a.dir = s.run
	} else {
		cg, err = s.b.cgroups.Create(s.cfg.ID, limits)
		if errors.Is(err, fs.ErrExist) {
			s.destroyStaleCgroup()
			cg, err = s.b.cgroups.Create(s.cfg.ID, limits)
		}
		if err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		undo = append(undo, func() { _ = cg.Destroy() })
		if err := os.Mkdir(s.run, 0o700); err != nil {
			return err
		}
		if a, err = s.b.spawnAgent(s.run, cg, ""); err != nil {
			return err
		}
		undo = append(undo, a.kill)
	}
	pooled := a.cg != nil
	// Written while a new agent's runtime starts, not after its setup:
	// off the start's critical path. A failed start removes s.run.
	pidInfo := fmt.Sprintf("%d %d\n", a.proc.pid, procStartTime(a.proc.pid))
	if err := os.WriteFile(filepath.Join(s.run, "agent.pid"), []byte(pidInfo), 0o600); err != nil {
		return err
	}
	root, err := s.rootFor(gcfg.Rootfs, a.uid)
	if err != nil {
		return err
	}
	if root == nil {
		if err := s.shortLayerPaths(&gcfg.Rootfs); err != nil {
			return err
		}
	} else {
		defer func() { _ = root.Close() }() // the agent has its own once configured
		// A root that fails to attach is not kept for the next try.
		undo = append(undo, s.releaseRootLocked)
	}
	var binds []*os.File
	if s.b.ranges != nil {
		if binds, err = s.volumeMounts(a.uid); err != nil {
			return err
		}
		defer func() {
			for _, f := range binds {
				_ = f.Close() // the agent has its own once configured
			}
		}()
	}
	var link netplumb.Link
	var tNet time.Duration
	if s.cfg.Network == backend.NetworkEgress {
		t := time.Now()
		if a.netID != "" {
			link, err = s.adoptNet(a) // the pool attached it
		} else {
			link, err = s.attachNet(a.proc.pid)
		}
		if err != nil {
			return err
		}
		tNet = time.Since(t)
		undo = append(undo, func() { _ = s.b.opts.Net.Detach(s.cfg.ID) })
		gcfg.Nameserver = link.Gateway.String()
	}
	gcfg.TrustCA = s.cfg.TrustCA
	tPrepare := time.Since(t0)
	if err := sendWorkload(a, cg); err != nil {
		return err
	}
	if err := a.configure(ctx, gcfg, root, binds); err != nil {
		return err
	}
	_ = a.statusR.Close()
	s.proc, s.cg, s.lifeline, s.link = a.proc, cg, a.lifeW, link
	s.client = agent.NewClientConn(filepath.Join(s.run, "agent.sock"), a.conn)
	a.conn = nil
	// The phases are built only for a debug log: this is every start's path.
	if s.b.log.Enabled(ctx, slog.LevelDebug) {
		attrs := []any{"id", s.cfg.ID, "pid", a.proc.pid, "pooled", pooled, "staged", a.setupPhases["staged"] == 1, "host_root", root != nil,
			"prepare_ms", ms(tPrepare), "net_ms", ms(tNet), "setup_ms", ms(time.Since(t0) - tPrepare)}
		for _, p := range []string{"overlay", "mounts", "pivot", "mask_and_misc", "launcher", "seccomp"} {
			attrs = append(attrs, "agent_"+p+"_ms", a.setupPhases[p])
		}
		s.b.log.Debug("sandbox started", attrs...)
	}
	return nil
}

// adoptPoolCgroup makes a pooled agent's cgroup the sandbox's. On cgroup v1
// the pool's cgroup is renamed, limited and taken out of the idle class: no
// process migration, which waits for an RCU grace period there. cgroup v2
// cannot rename a cgroup, so the agent moves into a new cgroup of the
// sandbox's name and the pool's goes. Either way the agent is in its
// sandbox's cgroup before it reads its config, so the cgroup namespace it
// enters then is rooted there. On error, discarding a removes what it
// holds.
func (s *Sandbox) adoptPoolCgroup(a *agentProc, limits cgroup.Limits) (*cgroup.Cgroup, error) {
	if !s.b.poolMigrates {
		cg := a.cg
		err := cg.Rename(s.cfg.ID)
		if errors.Is(err, fs.ErrExist) {
			s.destroyStaleCgroup()
			err = cg.Rename(s.cfg.ID)
		}
		if err != nil {
			return nil, err
		}
		if err := cg.SetLimits(limits); err != nil {
			return nil, err
		}
		if a.idle {
			if err := cg.SetIdle(false); err != nil {
				return nil, err
			}
		}
		return cg, nil
	}
	cg, err := s.b.cgroups.Create(s.cfg.ID, limits)
	if errors.Is(err, fs.ErrExist) {
		s.destroyStaleCgroup()
		cg, err = s.b.cgroups.Create(s.cfg.ID, limits)
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if err := cg.Add(a.proc.pid); err != nil {
		_ = cg.Destroy()
		return nil, err
	}
	pool := a.cg
	a.cg = cg
	if err := pool.Destroy(); err != nil {
		// Empty now; what is left goes with the next pool's start
		// (reapPoolCgroups).
		s.b.log.Warn("remove a pooled agent's cgroup", "err", err.Error())
	}
	return cg, nil
}

// ensureScratchDirs makes the sandbox's overlay work directory (and the
// rootfs mount point) again where they are missing: Create makes upper,
// work and rootfs one after another, and a crash between them leaves a
// sandbox whose upper directory (what Open looks for) exists without the
// rest. Neither holds anything of the sandbox's.
func (s *Sandbox) ensureScratchDirs() error {
	uid, gid := s.b.RootIDs()
	for _, d := range []string{"work", "rootfs"} {
		p := filepath.Join(s.dir, d)
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.Mkdir(p, 0o755); err != nil { //nolint:gosec // 0755 and the sandbox root's, as Create makes it
			return err
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// maxLowerOpts keeps the overlay's option string, which the kernel takes
// in one page, clear of the limit with room for upper, work and flags.
const maxLowerOpts = 3000

// shortLayerPaths makes an image with many layers mountable: when the
// lower paths would not fit in one page of mount options, it links each
// layer as <sandbox dir>/l/<n> and has the agent mount with those short
// relative paths (overlay resolves them at mount time).
func (s *Sandbox) shortLayerPaths(r *boot.Rootfs) error {
	n := 0
	for _, l := range r.Lower {
		n += len(l) + 1
	}
	if n <= maxLowerOpts {
		return nil
	}
	links := filepath.Join(s.dir, "l")
	if err := os.RemoveAll(links); err != nil {
		return err
	}
	if err := os.Mkdir(links, 0o755); err != nil { //nolint:gosec // 0755: the layer links are read by the agent as the sandbox's root, a uid in the mapped range that does not own this dir
		return err
	}
	if err := os.Chmod(links, 0o755); err != nil { //nolint:gosec // 0755 whatever the umask (same reason as the Mkdir above)
		return err
	}
	short := make([]string, len(r.Lower))
	for i, l := range r.Lower {
		name := strconv.Itoa(i)
		if err := os.Symlink(l, filepath.Join(links, name)); err != nil {
			return err
		}
		short[i] = "l/" + name
	}
	r.Lower, r.Dir = short, s.dir
	return nil
}

// destroyStaleCgroup removes a cgroup of this sandbox's name left by a
// crashed run, whole or in only some hierarchies (a crash mid-rename or
// mid-destroy).
func (s *Sandbox) destroyStaleCgroup() {
	_ = s.b.cgroups.Destroy(s.cfg.ID)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Stats implements backend.Sandbox.
func (s *Sandbox) Stats() (backend.Stats, error) {
	s.mu.Lock()
	cg := s.cg
	s.mu.Unlock()
	if cg == nil {
		return backend.Stats{}, nil
	}
	st, err := cg.Stats()
	if err != nil {
		return backend.Stats{}, err
	}
	return backend.Stats{
		MemoryBytes: st.MemoryBytes, CPUUsage: time.Duration(st.CPUUsageNs),
		Pids: st.PidsCurrent, OOMKills: st.OOMKills, Throttled: st.ThrottledPeriods,
	}, nil
}

// OOMKills implements backend.Sandbox.
func (s *Sandbox) OOMKills() (int64, error) {
	s.mu.Lock()
	cg := s.cg
	s.mu.Unlock()
	if cg == nil {
		return 0, nil
	}
	return cg.OOMKills()
}

// Stop implements backend.Sandbox. Killing the pid namespace's init makes
// the kernel kill every process in it, however it was forked; Stop returns
// once the init has exited, which is after every other process in the
// namespace. Removing the cgroup and the runtime directory (milliseconds on
// cgroup v1) finishes in the background: Start, Remove and the backend's
// Close wait for it. Idempotent.
func (s *Sandbox) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	t0 := time.Now()
	s.proc.kill()
	s.thawLocked() // after the kill: a paused sandbox's code runs no more
	select {
	case <-s.proc.done:
	case <-ctx.Done():
		return fmt.Errorf("stop sandbox %s: %w", s.cfg.ID, ctx.Err())
	}
	s.b.log.Debug("sandbox stopped", "id", s.cfg.ID, "exit_ms", ms(time.Since(t0)))
	s.releaseInBackgroundLocked()
	s.idleRootLocked()
	return nil
}

// held is what a started sandbox holds on the host besides its processes.
type held struct {
	id       string
	proc     *initProc
	cg       *cgroup.Cgroup
	client   *agent.Client
	lifeline *os.File
	run      string
	net      *netplumb.Host // set when the run had a link
}

// takeLocked detaches what the sandbox holds, leaving it stopped.
func (s *Sandbox) takeLocked() held {
	h := held{id: s.cfg.ID, proc: s.proc, cg: s.cg, client: s.client, lifeline: s.lifeline, run: s.run}
	if s.link.Addr.IsValid() {
		h.net = s.b.opts.Net
	}
	s.proc, s.cg, s.client, s.lifeline, s.link = nil, nil, nil, nil, netplumb.Link{}
	return h
}

// release frees what a sandbox held once its init is gone.
func (h held) release() error {
	var errs []error
	if h.proc != nil {
		h.proc.close()
	}
	if h.cg != nil {
		if err := h.cg.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	if h.client != nil {
		h.client.Close()
	}
	if h.lifeline != nil {
		_ = h.lifeline.Close()
	}
	if h.net != nil {
		// The pair went with the agent's namespace; this frees the
		// address and the rules that named it.
		if err := h.net.Detach(h.id); err != nil {
			errs = append(errs, fmt.Errorf("network: %w", err))
		}
	}
	if err := os.RemoveAll(h.run); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// releaseLocked releases synchronously.
func (s *Sandbox) releaseLocked() error { return s.takeLocked().release() }

// releaseInBackgroundLocked releases on another goroutine; waitReleased
// waits for it.
func (s *Sandbox) releaseInBackgroundLocked() {
	h := s.takeLocked()
	b := s.b
	ch := make(chan struct{})
	b.releaseMu.Lock()
	if b.releasing == nil {
		b.releasing = map[string]chan struct{}{}
	}
	b.releasing[h.id] = ch
	b.releaseMu.Unlock()
	go func() {
		t0 := time.Now()
		if err := h.release(); err != nil {
			// A cgroup left behind is removed by the next start of this
			// sandbox (destroyStaleCgroup) or by ReapOrphans.
			b.log.Warn("release stopped sandbox", "id", h.id, "err", err.Error())
		}
		b.releaseMu.Lock()
		if b.releasing[h.id] == ch {
			delete(b.releasing, h.id)
		}
		b.releaseMu.Unlock()
		close(ch)
		b.log.Debug("sandbox released", "id", h.id, "release_ms", ms(time.Since(t0)))
	}()
}

// pendingRelease is closed when the background release of sandbox id's
// last run is done; nil when none is under way.
func (b *Backend) pendingRelease(id string) <-chan struct{} {
	b.releaseMu.Lock()
	defer b.releaseMu.Unlock()
	return b.releasing[id]
}

// waitReleased waits for a background release of an earlier run of this
// sandbox, through whichever handle stopped it.
func (s *Sandbox) waitReleased(ctx context.Context) error {
	ch := s.b.pendingRelease(s.cfg.ID)
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: waiting for the previous run's release: %w", s.cfg.ID, ctx.Err())
	}
}

// Remove implements backend.Sandbox.
func (s *Sandbox) Remove(ctx context.Context) error {
	if err := s.Stop(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The last run's release (cgroup, runtime directory) may still be
	// under way: a new sandbox of this name waits for it at start, and
	// the files' deletion waits for it so that, when they are gone, all
	// is.
	released := s.b.pendingRelease(s.cfg.ID)
	if err := s.b.removeDir(s.dir, s.cfg.ID, s.takeRootLocked(), released); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", s.cfg.ID, err)
	}
	if s.lock != nil {
		_ = s.lock.Close()
		s.lock = nil
	}
	return nil
}
