// Package backend defines what an isolation backend provides: sandbox
// lifecycle plus a connection to the sandbox's agent. Everything else (exec,
// files, REPLs, terminals) goes through the agent, so every backend behaves
// the same and one conformance suite tests them all.
package backend

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/image"
)

// Config describes a sandbox to create.
type Config struct {
	// ID names the sandbox on the host: 1–63 of [a-z0-9_-], unique.
	ID    string
	Image *image.Image
	// Hostname inside the sandbox (default DefaultHostname).
	Hostname string
	// Env is added to the image's environment ("K=V").
	Env []string
	// Workdir overrides the image's working directory.
	Workdir string
	// Limits; zero means unlimited (callers fill in the Default* values).
	MemoryBytes int64
	CPUs        float64
	PidsMax     int64
	// NoFile is RLIMIT_NOFILE of the sandbox's processes; zero means the
	// spec's default (oci.DefaultNoFile).
	NoFile int64
	// Network is NetworkNone ("" too) or NetworkEgress.
	Network string
	// Ports are published on the host (by the sandbox manager, to the
	// sandbox's link address); CheckSettings refuses them without
	// NetworkEgress rather than drop them.
	Ports []PortMapping
	// Volumes are bind-mounted into the sandbox, after its own mounts.
	// Their sources must have passed CheckVolumeSource under the caller's
	// policy.
	Volumes []Volume
	// DiskBytes caps what the sandbox keeps on the host's disk: its
	// writable layer, and so its /tmp and every path it writes outside
	// volumes (0: unlimited). A write past it fails with EDQUOT inside.
	DiskBytes int64
	// ReadOnlyRoot makes the root file system read-only except /tmp,
	// /workspace and WritablePaths, which stay writable in the sandbox's
	// writable layer (kept across stop/start, under DiskBytes). A write
	// elsewhere fails with EROFS.
	ReadOnlyRoot bool
	// WritablePaths are the extra writable paths of a ReadOnlyRoot
	// sandbox (ValidateWritablePaths).
	WritablePaths []string
	// TrustCA, when set, is a CA certificate (PEM) the backend puts in
	// the sandbox's system trust store (cabundle.Append, at cabundle.Path
	// and where the image keeps its bundle) at each start, before any of
	// its processes runs and before a ReadOnlyRoot turns read-only. It
	// lands in the sandbox's writable layer, never the image's.
	TrustCA []byte
}

// AlwaysWritable are the paths a ReadOnlyRoot sandbox can write to
// whatever its WritablePaths.
var AlwaysWritable = []string{"/tmp", "/workspace"}

// Network modes (Config.Network).
const (
	// NetworkNone is loopback only.
	NetworkNone = "none"
	// NetworkEgress gives the sandbox a link of its own to the host,
	// whose resolver and proxy decide what of its traffic leaves
	// (internal/netplumb steers it there; internal/egress decides).
	NetworkEgress = "egress"
)

// validID reports whether id is 1-63 of [a-z0-9_-], starting with a
// letter or digit. A loop, not a regular expression: compiling that one
// (its {0,62}) was 1% of a whole `warren run` (docs/performance.md).
func validID(id string) bool {
	if id == "" || len(id) > 63 || id[0] == '_' || id[0] == '-' {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// A sandbox's settings, defined here once: the defaults every layer fills
// in when a caller chooses nothing, and the bounds every backend enforces.
// Config.CheckSettings checks the bounds; the sandbox manager adds the
// server's own policy on top (its maxima, sandbox.Spec.Validate).
const (
	// DefaultMemoryBytes is a sandbox's memory limit unless one is asked for.
	DefaultMemoryBytes = 512 << 20
	// DefaultCPUs is a sandbox's CPU quota unless one is asked for.
	DefaultCPUs = 1.0
	// DefaultPids bounds a sandbox's processes and threads (fork bombs
	// stop here).
	DefaultPids = 1024
	// AgentPids is the pids budget of a sandbox's agent, kept apart from
	// the sandbox's own (PidsMax) so that sandbox code taking every pid
	// it is granted cannot leave the agent without a thread. The agent
	// waits for its processes on the runtime's poller, not a thread
	// each: the Go runtime's few threads and those blocked in file
	// system calls of concurrent requests (9 with wire.MaxProcesses
	// background processes and 32 execs running). Admission counts it
	// with each sandbox's pids.
	AgentPids = 128
	// DefaultHostname is a sandbox's hostname unless one is asked for.
	DefaultHostname = "sandbox"

	// MinMemoryBytes is the smallest memory limit a sandbox starts with.
	MinMemoryBytes = 16 << 20
	// MinCPUs is the smallest CPU quota: the kernel's minimum quota, 1 ms,
	// per 100 ms period.
	MinCPUs = 0.01
	// MaxCPUs is the largest CPU quota.
	MaxCPUs = 1024
	// MinDiskBytes is the smallest disk limit: room for what a shell or
	// an interpreter writes at start.
	MinDiskBytes = 16 << 20
	// MaxDiskBytes bounds a disk limit (1 PiB: beyond any host's disk).
	MaxDiskBytes = 1 << 50
	// MaxWritablePaths bounds Config.WritablePaths.
	MaxWritablePaths = 32
	// MaxWritablePathLen bounds each writable path, in bytes.
	MaxWritablePathLen = 1024

	// MinPids is the smallest process limit. The limit counts threads
	// (the agent's launcher thread among them: the agent's others have
	// their own budget, AgentPids); below this a command's interpreter
	// can hardly start its own.
	MinPids = 16
)

// Validate reports every problem with c at once.
func (c *Config) Validate() error {
	var errs []error
	if !validID(c.ID) {
		errs = append(errs, fmt.Errorf("id %q: want 1-63 of [a-z0-9_-], starting with a letter or digit", c.ID))
	}
	if c.Image == nil || len(c.Image.Layers) == 0 {
		errs = append(errs, errors.New("image: none given"))
	}
	if err := c.CheckSettings(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CheckSettings reports every problem with what a caller chooses for a
// sandbox (limits, working directory, network, ports, volumes), before an id and
// an image are picked: what Validate checks besides those two.
func (c *Config) CheckSettings() error {
	var errs []error
	if c.MemoryBytes < 0 {
		errs = append(errs, errors.New("memory: negative"))
	} else if c.MemoryBytes > 0 && c.MemoryBytes < MinMemoryBytes {
		errs = append(errs, fmt.Errorf("memory: %d MiB is below the %d MiB minimum", c.MemoryBytes>>20, MinMemoryBytes>>20))
	}
	// Written so that NaN fails too.
	if c.CPUs != 0 && !(c.CPUs >= MinCPUs && c.CPUs <= MaxCPUs) {
		errs = append(errs, fmt.Errorf("cpus: %v out of range: want 0 (unlimited) or %v (a 1 ms quota per 100 ms period) up to %d", c.CPUs, MinCPUs, MaxCPUs))
	}
	if c.PidsMax < 0 {
		errs = append(errs, errors.New("pids: negative"))
	} else if c.PidsMax > 0 && c.PidsMax < MinPids {
		errs = append(errs, fmt.Errorf("pids: %d is below the minimum of %d (the limit counts threads)", c.PidsMax, MinPids))
	}
	if c.Workdir != "" && !path.IsAbs(c.Workdir) {
		errs = append(errs, fmt.Errorf("workdir %q: want an absolute path", c.Workdir))
	}
	if c.Network != "" && c.Network != NetworkNone && c.Network != NetworkEgress {
		errs = append(errs, fmt.Errorf("network %q: want %q (loopback only) or %q", c.Network, NetworkNone, NetworkEgress))
	}
	if err := ValidatePorts(c.Ports); err != nil {
		errs = append(errs, err)
	} else if len(c.Ports) > 0 && c.Network != NetworkEgress {
		errs = append(errs, fmt.Errorf("ports %s: publishing ports needs the sandbox network (%q), not %q", portList(c.Ports), NetworkEgress, c.Network))
	}
	if err := ValidateVolumes(c.Volumes); err != nil {
		errs = append(errs, err)
	}
	if c.DiskBytes != 0 && (c.DiskBytes < MinDiskBytes || c.DiskBytes > MaxDiskBytes) {
		errs = append(errs, fmt.Errorf("disk: %d bytes out of range: want 0 (unlimited) or %d MiB up to %d TiB", c.DiskBytes, MinDiskBytes>>20, MaxDiskBytes>>40))
	}
	// Checked even without ReadOnlyRoot (where they change nothing):
	// a policy's bad path shows at once, not when a root turns read-only.
	if err := ValidateWritablePaths(c.WritablePaths); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ValidateWritablePaths reports every problem with the writable paths of
// a read-only root: each absolute, clean, not / and not in /proc, /sys or
// /dev (the sandbox's own kernel file systems, never its disk); at most
// MaxWritablePaths of at most MaxWritablePathLen bytes.
func ValidateWritablePaths(ps []string) error {
	var errs []error
	if len(ps) > MaxWritablePaths {
		return fmt.Errorf("write paths: %d given, at most %d", len(ps), MaxWritablePaths)
	}
	for _, p := range ps {
		switch {
		case len(p) > MaxWritablePathLen:
			errs = append(errs, fmt.Errorf("write path %.40q...: longer than %d bytes", p, MaxWritablePathLen))
		case !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0):
			errs = append(errs, fmt.Errorf("write path %q: want an absolute, clean path", p))
		case p == "/":
			errs = append(errs, errors.New("write path \"/\": that is the whole root; leave the root writable instead"))
		case under(p, "/proc") || under(p, "/sys") || under(p, "/dev"):
			errs = append(errs, fmt.Errorf("write path %q: not in /proc, /sys or /dev", p))
		}
	}
	return errors.Join(errs...)
}

// under reports whether p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// portList is ps as "8080:80, 9000:9000" (the first few).
func portList(ps []PortMapping) string {
	var b strings.Builder
	for i, p := range ps {
		if i == 4 {
			fmt.Fprintf(&b, " and %d more", len(ps)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// The backend contract. A backend provides Backend and Sandbox; the
// abilities below them are optional, each its own small interface, and a
// caller checks for one with a type assertion:
//
//   - Reconfigurer: a stopped sandbox's next start takes a new Config
//     (without it, a restart keeps the Config the sandbox was made with).
//   - DiskUser: the space a sandbox's own files take on the host (without
//     it, disk usage is not reported).
//   - DiskLimiter: the disk limit in force (without it, Config.DiskBytes
//     is not enforced).
//   - Networked: the address of a running sandbox's own link (without
//     it, the sandbox has loopback only whatever Config.Network says).
//   - Pauser: a running sandbox paused with its memory kept and no CPU
//     used, and resumed (without it, pausing is refused as unsupported).
//   - Pooler: a Backend that keeps agents ready ahead of starts reports
//     its pool (without it, the backend has none).
//   - Checkpointer and Restorer: a running sandbox's memory and files
//     written to a snapshot, and new sandboxes started from one (without
//     them, Capabilities.Checkpoint is false and both are refused as
//     unsupported).
//
// internal/backend/native is the real backend; internal/backend/fake is an
// in-memory one for tests of what sits above the contract.

// Backend creates and finds sandboxes of one isolation kind.
type Backend interface {
	// Name is the backend's name ("native").
	Name() string
	// Create prepares a sandbox's on-disk state; it does not start it.
	Create(ctx context.Context, cfg Config) (Sandbox, error)
	// Open returns a sandbox Create made earlier (possibly in an earlier
	// process), attached to its agent if that still runs; otherwise the
	// sandbox is stopped (Done closed) and Start starts it again with its
	// files kept. It fails when the host has no such sandbox.
	Open(ctx context.Context, cfg Config) (Sandbox, error)
	// IDs lists the sandboxes with state on the host, running or not.
	IDs() ([]string, error)
	// ReapOrphans removes runtime leftovers of sandboxes whose agent died
	// and for which keep (nil: none) is false; it returns their ids.
	ReapOrphans(keep func(id string) bool) ([]string, error)
	// Capabilities declares what this backend's sandboxes do where
	// backends may differ. It is fixed for the backend's life.
	Capabilities() Capabilities
}

// Capabilities are the behaviours that may differ between backends,
// declared rather than discovered: the conformance suite reads them and
// tests each declared behaviour, so a difference is a stated property of
// a backend, never a check that silently does not apply.
type Capabilities struct {
	// SecondKernel: sandbox code's system calls are answered by a kernel
	// of the backend's own (gVisor's sentry), not the host's.
	SecondKernel bool
	// UserNS: sandbox root is an unprivileged host uid, through a user
	// namespace the backend maps (false: root inside is host root where
	// the host kernel is concerned, kept in by capabilities and seccomp,
	// or by a second kernel).
	UserNS bool
	// OOMKillsProcess: the memory limit kills the one process that went
	// over it with SIGKILL, counted by OOMKills, and the sandbox lives
	// on (false: going over it ends the whole sandbox).
	OOMKillsProcess bool
	// PidsLimitFailsFork: a fork past Config.PidsMax fails with EAGAIN
	// and the sandbox lives on (false: the limit holds the whole
	// sandbox, and going past it ends it).
	PidsLimitFailsFork bool
	// Reattach: a running sandbox outlives the process that started it,
	// and Backend.Open attaches to its agent (false: Open finds it
	// stopped, its files kept).
	Reattach bool
	// Checkpoint: the backend's sandboxes are Checkpointers and the
	// backend a Restorer.
	Checkpoint bool
}

// ErrUnsupported marks a setting the backend cannot honour (a sandbox
// with it is refused, never started without it). Its kind is
// errdefs.ErrUnsupported: the request is valid, this tier cannot do it.
var ErrUnsupported = errdefs.Errorf(errdefs.ErrUnsupported, "not supported by this isolation backend")

// Sandbox is one sandbox's lifecycle and agent connection.
type Sandbox interface {
	ID() string
	// Start starts the sandbox's init (the agent) and returns once it
	// serves. Starting a running sandbox does nothing.
	Start(ctx context.Context) error
	// Agent is the connection to the running agent.
	Agent() *agent.Client
	// Stats reads resource usage from the host's view (cgroups).
	Stats() (Stats, error)
	// OOMKills is how many processes the memory limit has killed so far
	// (cheap: Exec reads it around every command).
	OOMKills() (int64, error)
	// Done is closed when the sandbox's init has exited (and is closed
	// for a sandbox that is not running).
	Done() <-chan struct{}
	// Stop kills every process of the sandbox and releases its mounts,
	// cgroups and namespaces; its filesystem changes are kept.
	Stop(ctx context.Context) error
	// Remove stops the sandbox and deletes everything it has on the host.
	Remove(ctx context.Context) error
}

// Reconfigurer is a Sandbox whose next start can take a new Config.
type Reconfigurer interface {
	// SetConfig replaces the Config a stopped sandbox starts with next
	// (its id stays). A running sandbox keeps the one it started with
	// until it is stopped.
	SetConfig(Config)
}

// DiskUser is a Sandbox that can measure its own files on the host (its
// writable layer), in bytes.
type DiskUser interface {
	DiskUsage() (int64, error)
}

// DiskLimiter is a DiskUser whose backend enforces Config.DiskBytes:
// DiskLimit is the cap in force on the sandbox's files (0: none).
type DiskLimiter interface {
	DiskLimit() int64
}

// Networked is a sandbox with a network link of its own (Config.Network
// NetworkEgress): NetAddr is its address on that link while it runs (the
// source of its packets as the host sees them), the zero Addr otherwise.
type Networked interface {
	NetAddr() netip.Addr
}

// Pooler is a Backend with a warm pool: agents spawned ahead of time,
// which starts claim and bind to their sandbox (image, limits, network,
// name) late, so one pool serves every shape.
type Pooler interface {
	PoolStats() PoolStats
}

// PoolStats is a warm pool's state.
type PoolStats struct {
	// Size is how many agents the pool keeps ready; Ready how many are.
	Size, Ready int
	// Spawned and Taken count agents spawned for the pool and taken from
	// it; Misses counts starts that could use the pool and found it empty
	// (they paid a cold start).
	Spawned, Taken, Misses int64
}

// Pauser is a Sandbox that can be paused: every process of a paused
// sandbox stays where it is, its memory kept, and gets no CPU until
// Resume. Paused reads the state from the host (so a restarted server
// finds a paused sandbox paused). Stop and Remove work on a paused
// sandbox. Pause and Resume of a stopped sandbox fail.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Paused() (bool, error)
}

// Checkpointer is a Sandbox whose running state can be written to a
// snapshot: Checkpoint makes dir (which must not exist) and writes the
// sandbox's memory, processes and files to it; the sandbox runs on after.
// A failed checkpoint leaves dir to the caller to remove.
type Checkpointer interface {
	Checkpoint(ctx context.Context, dir string) error
}

// Restorer is a Backend that starts sandboxes from snapshots: Restore
// creates cfg.ID from the snapshot in dir and returns it running, its
// processes and files as they were at the checkpoint, under cfg's
// identity (hostname) and with an agent connection of its own. cfg's
// image must be the one the snapshot's sandbox ran. On failure nothing
// of cfg.ID is left.
type Restorer interface {
	Restore(ctx context.Context, cfg Config, dir string) (Sandbox, error)
}

// Stats is a sandbox's resource usage.
type Stats struct {
	MemoryBytes int64
	CPUUsage    time.Duration
	Pids        int64
	OOMKills    int64
	Throttled   int64
}
