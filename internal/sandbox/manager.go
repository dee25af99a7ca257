// Package sandbox is the daemon's sandbox manager: named sandboxes per
// namespace, their state machine (starting → running → stopping → stopped,
// or error with the reason kept), persistence in SQLite so a restarted
// daemon reattaches to running sandboxes and removes orphans, idle timeouts
// and maximum lifetimes, per-sandbox logs and resource sampling.
//
// Lifecycle changes of one sandbox are serialized; commands, code runs and
// file operations run concurrently with each other.
package sandbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/portfwd"
	"github.com/warren-sandbox/warren/internal/secrets"
	"github.com/warren-sandbox/warren/internal/store"
)

// State is where a sandbox is in its life.
type State string

// The states.
const (
	Starting State = "starting"
	Running  State = "running"
	Stopping State = "stopping"
	Stopped  State = "stopped"
	Error    State = "error"
	// Paused is a running sandbox whose processes are paused (pause.go).
	Paused State = "paused"
)

// removingState is what the database records while a remove is under way;
// no entry is ever in it (recover finishes the removal).
const removingState = "removing"

// ValidState reports whether s names a state.
func ValidState(s string) bool {
	switch State(s) {
	case Starting, Running, Stopping, Stopped, Error, Paused:
		return true
	}
	return false
}

// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`) })

// ValidName reports whether s is a valid sandbox or namespace name.
func ValidName(s string) bool { return nameRE().MatchString(s) }

// Spec is what a sandbox is asked to be. Zero values of Image, MemoryMiB
// and CPUs mean the server's defaults (DefaultImage, backend.Default*),
// which Start fills in; zero periods mean the server's, applied while the
// sandbox runs.
type Spec struct {
	Image     string            `json:"image"`
	MemoryMiB int64             `json:"memory_mib"`
	CPUs      float64           `json:"cpus"`
	Env       []string          `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Volumes are host paths bound into the sandbox; the server's
	// policy (Options.VolumeRoots) is checked at every start.
	Volumes []backend.Volume `json:"volumes,omitempty"`
	// Ports are published on the host; the backend refuses them while
	// sandboxes have no network (backend.Config.CheckSettings).
	Ports []backend.PortMapping `json:"ports,omitempty"`
	// Exposed are the ports published with ExposePort: the manager's to
	// keep (a start's spec never sets them; a restart keeps them) and
	// published at every start like Ports, until unexposed (ports.go).
	Exposed []ExposedPort `json:"exposed,omitempty"`
	// Egress is the sandbox's allowlist (package egress's rules); empty =
	// nothing leaves the sandbox. It needs the server's networking
	// (Options.Egress).
	Egress []string `json:"egress,omitempty"`
	// Secrets are the names of the secrets the sandbox gets (granted to
	// its namespace, Options.Secrets): names only, the values are read
	// at every start (secrets.go).
	Secrets []string `json:"secrets,omitempty"`
	// DiskMiB caps what the sandbox keeps on disk (its writable layer,
	// /tmp included); 0 = the server's default (Options.DiskBytes).
	DiskMiB int64 `json:"disk_mib,omitempty"`
	// Workspace names a workspace of the sandbox's namespace mounted at
	// /workspace (Options.Workspaces; workspace.go).
	Workspace string `json:"workspace,omitempty"`
	// IdleTimeout stops the sandbox after this long without a request;
	// MaxLifetime stops it this long after it started. 0 = server default.
	IdleTimeout time.Duration `json:"idle_timeout"`
	MaxLifetime time.Duration `json:"max_lifetime"`
	// IdleAction is what its idle timeout does: IdleStop or IdlePause;
	// "" = the server's (Options.IdleAction).
	IdleAction string `json:"idle_action,omitempty"`
	// Isolation is the sandbox's tier (tier.go): "" asks for the
	// server's or namespace's default; Start records the one it got.
	Isolation string `json:"isolation,omitempty"`
}

// The server's defaults, besides a sandbox's own (backend.Default*).
const (
	// DefaultImage is the image of a sandbox whose spec names none.
	DefaultImage = "python"
	// Options' defaults.
	DefaultIdleTimeout      = 10 * time.Minute
	DefaultMaxLifetime      = 24 * time.Hour
	DefaultStoppedRetention = 24 * time.Hour
	DefaultMaxSandboxes     = 1000
	DefaultMaxRunning       = 256
)

// The server's policy on what a Spec may ask for, on top of the bounds
// every backend enforces (backend.Config.CheckSettings).
const (
	MaxLabels    = 64
	MaxLabelLen  = 256
	MaxEnv       = 256
	MaxEnvLen    = 32 << 10
	MaxMemoryMiB = 1 << 20
	MaxCPUs      = 256
	// MaxPeriod bounds a sandbox's idle timeout and lifetime.
	MaxPeriod = 30 * 24 * time.Hour
)

// withDefaults is s with the server's defaults for what it leaves unset.
func (s Spec) withDefaults() Spec {
	if s.Image == "" {
		s.Image = DefaultImage
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = backend.DefaultMemoryBytes >> 20
	}
	if s.CPUs == 0 {
		s.CPUs = backend.DefaultCPUs
	}
	return s
}

// Validate reports every problem with s at once: the server's policy
// here, the limits, working directory and volumes by the backend's own
// check (a zero limit stands for its default, which is valid).
func (s *Spec) Validate() error {
	var errs []error
	cfg := s.config("", nil)
	// The network is the server's to give (Manager.Start checks it);
	// what is checked here is what the caller chose.
	cfg.Network = backend.NetworkEgress
	if s.MemoryMiB > MaxMemoryMiB {
		errs = append(errs, fmt.Errorf("memory %d MiB: at most %d", s.MemoryMiB, MaxMemoryMiB))
		cfg.MemoryBytes = 0 // reported; and shifted into bytes it could overflow
	}
	if s.CPUs > MaxCPUs {
		errs = append(errs, fmt.Errorf("cpus %v: at most %d on this server", s.CPUs, MaxCPUs))
	}
	if s.DiskMiB < 0 || s.DiskMiB > backend.MaxDiskBytes>>20 {
		errs = append(errs, fmt.Errorf("disk %d MiB: want 0 (server default) up to %d", s.DiskMiB, int64(backend.MaxDiskBytes>>20)))
		cfg.DiskBytes = 0 // reported; shifted into bytes it could overflow
	}
	if err := cfg.CheckSettings(); err != nil {
		errs = append(errs, err)
	}
	if len(s.Env) > MaxEnv {
		errs = append(errs, fmt.Errorf("env: %d entries, at most %d", len(s.Env), MaxEnv))
	}
	for _, e := range s.Env {
		if len(e) > MaxEnvLen || !envRE().MatchString(e) {
			errs = append(errs, fmt.Errorf("env %.40q: want K=V with K of [A-Za-z0-9_.-], at most %d bytes", e, MaxEnvLen))
			break
		}
	}
	if err := checkEgress(s.Egress); err != nil {
		errs = append(errs, err)
	}
	if err := checkExposed(s.Ports, s.Exposed); err != nil {
		errs = append(errs, err)
	}
	if s.Workspace != "" && !ValidName(s.Workspace) {
		errs = append(errs, fmt.Errorf("workspace %.80q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", s.Workspace))
	}
	if len(s.Workdir) > 4096 {
		errs = append(errs, fmt.Errorf("workdir %.40q: longer than 4096 bytes", s.Workdir))
	}
	if len(s.Labels) > MaxLabels {
		errs = append(errs, fmt.Errorf("labels: %d, at most %d", len(s.Labels), MaxLabels))
	}
	for k, v := range s.Labels {
		if k == "" || len(k) > MaxLabelLen || len(v) > MaxLabelLen {
			errs = append(errs, fmt.Errorf("label %.40q: keys 1-%d bytes, values up to %d", k, MaxLabelLen, MaxLabelLen))
			break
		}
	}
	if !ValidIdleAction(s.IdleAction) {
		errs = append(errs, fmt.Errorf("idle_action %.40q: want %q or %q", s.IdleAction, IdleStop, IdlePause))
	}
	for what, d := range map[string]time.Duration{"idle_timeout": s.IdleTimeout, "max_lifetime": s.MaxLifetime} {
		if d < 0 || d > MaxPeriod {
			errs = append(errs, fmt.Errorf("%s %v: want 0 (server default) up to 30 days", what, d))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalid, "%w", err)
	}
	return nil
}

// checkVolumes applies the server's host-mount policy, on every start: a
// stopped sandbox restarted after the policy changed is held to the new one.
func (m *Manager) checkVolumes(vs []backend.Volume) error {
	if len(vs) == 0 {
		return nil
	}
	if len(m.opts.VolumeRoots) == 0 {
		return errdefs.Errorf(errdefs.ErrInvalid, "volumes: host mounts are not allowed by this server's policy (an operator allows them with warren serve --volume-root DIR)")
	}
	for _, v := range vs {
		if err := backend.CheckVolumeSource(m.opts.VolumeRoots, v); err != nil {
			return errdefs.Errorf(errdefs.ErrInvalid, "%w", err)
		}
	}
	return nil
}

// config is the backend's configuration for a sandbox with this spec.
func (s *Spec) config(id string, img *image.Image) backend.Config {
	return backend.Config{ID: id, Image: img, Env: s.Env, Workdir: s.Workdir,
		MemoryBytes: s.MemoryMiB << 20, CPUs: s.CPUs, PidsMax: backend.DefaultPids, Network: "none",
		Volumes: s.Volumes, Ports: s.Ports, DiskBytes: s.DiskMiB << 20}
}

// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var envRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_.-]+=`) })

// Info is a sandbox as the API shows it.
type Info struct {
	ID        string
	Namespace string
	Name      string
	State     State
	Error     string
	Spec      Spec
	Created   time.Time
	Started   time.Time
	Stopped   time.Time
}

// ImageResolver turns an image name from a request into an image.
type ImageResolver func(ctx context.Context, name string) (*image.Image, error)

// ImagePuller fetches the image a name from a request stands for, which
// the ImageResolver did not find, for a new sandbox in namespace ns; logf
// writes the pull's progress to the sandbox's log. Its error is the
// client's answer.
type ImagePuller func(ctx context.Context, ns, name string, logf func(format string, args ...any)) error

// Options configure a Manager.
type Options struct {
	// Backend is the default isolation tier's backend (its Name names
	// the tier; Tiers below the others).
	Backend backend.Backend
	DB      *sql.DB
	Images  ImageResolver
	// Pull, when set, fetches an image Images does not find at a
	// sandbox's first start; without it such a start is refused.
	Pull ImagePuller
	// LogDir holds each sandbox's log file.
	LogDir string
	// SnapshotDir holds the snapshots (snapshot.go); "" keeps none.
	SnapshotDir string
	Logger      *slog.Logger
	// Defaults for sandboxes that ask for none.
	IdleTimeout time.Duration // default DefaultIdleTimeout
	// IdleAction is what an idle timeout does: IdleStop ("" too) or
	// IdlePause (pause.go; a backend that cannot pause stops instead).
	IdleAction  string
	MaxLifetime time.Duration // default DefaultMaxLifetime
	// StoppedRetention removes sandboxes this long after they stopped
	// (default DefaultStoppedRetention; negative = keep until removed).
	StoppedRetention time.Duration
	// MaxSandboxes bounds sandboxes on this server, stopped ones
	// included (default DefaultMaxSandboxes); MaxRunning bounds those
	// running (default DefaultMaxRunning).
	MaxSandboxes int
	MaxRunning   int
	// Tick is the janitor's period (default 1s).
	Tick time.Duration
	// VolumeRoots are the host directories volumes may come from (paths
	// without symlinks); none = no volumes.
	VolumeRoots []string
	// Limits are the operator's caps per sandbox and the pids and open
	// files each gets.
	Limits Limits
	// Capacity bounds the sum of what running sandboxes are granted: a
	// start beyond it is refused (ErrLimit). Sandboxes reattached at
	// New are counted, never refused.
	Capacity Capacity
	// Egress, when set, turns networking on: sandboxes get a link of
	// their own (backend.Config.Network "egress") and their egress state
	// is registered here under its address while they run (egress.go).
	Egress *egress.Registry
	// PublishAddress is the host address sandboxes' ports are published
	// on (default DefaultPublishAddress, loopback; ports.go); PortLimits
	// bound each published port.
	PublishAddress netip.Addr
	PortLimits     portfwd.Limits
	// Policy, when set, is each namespace's quotas and allowlists
	// (policy.go), asked at every start; nil = none beyond the server's.
	// It is called without the manager's locks held and must be cheap (a
	// reload swaps what it reads).
	Policy func(ns string) NamespacePolicy
	// Namespaces, when set, lists the namespaces that have a policy of
	// their own, so NamespaceUsage shows them before they hold sandboxes.
	Namespaces func() []string
	// Secrets are the server's secret providers and grants; nil: a spec
	// naming secrets is refused (ErrForbidden). SecretsDir (in the run
	// directory) keeps what the next server needs to go on with a
	// running sandbox's proxy-mode secrets, values aside; "" = nothing
	// kept, they stop at a server restart.
	Secrets    *secrets.Store
	SecretsDir string
	// Audit, when set, gets each sandbox's usage (usage.go) at its stop,
	// removal or unexpected exit and every UsageEvery while it runs
	// (default DefaultUsageEvery), and every record of its egress log.
	Audit      Auditor
	UsageEvery time.Duration
	// DiskBytes is the disk limit of sandboxes whose spec asks for none
	// (0: unlimited).
	DiskBytes int64
	// ReadOnlyRoot makes every sandbox's root read-only except /tmp,
	// /workspace and WritePaths (backend.Config.ReadOnlyRoot).
	ReadOnlyRoot bool
	WritePaths   []string
	// Workspaces mounts the workspaces sandboxes ask for (nil: a spec
	// naming one is refused).
	Workspaces Workspaces
	// Tiers are the isolation tiers the server runs besides Backend's,
	// TiersOff those it cannot, with why (tier.go).
	Tiers    map[string]Tier
	TiersOff map[string]string
}

// Auditor takes audit records (*audit.Log is one).
type Auditor interface {
	Append(*audit.Record) error
}

// DefaultUsageEvery is how often a running sandbox's usage is recorded.
const DefaultUsageEvery = 5 * time.Minute

// Manager owns the server's sandboxes.
type Manager struct {
	opts   Options
	limits Limits // opts.Limits with the defaults filled in
	be     backend.Backend
	tiers  map[string]Tier // every available tier, be's included
	db     *sql.DB
	stmts  *store.Stmts // the statements of every start and stop
	log    *slog.Logger

	mu      sync.Mutex
	entries map[key]*entry
	closed  bool

	stop chan struct{}
	wg   sync.WaitGroup
}

type key struct{ ns, name string }

// entry is one sandbox. life serializes lifecycle operations; the other
// fields are guarded by Manager.mu.
type entry struct {
	life sync.Mutex

	id, ns, name string
	state        State
	err          string
	spec         Spec
	imageID      string // the image it was first started from (image.Image.Pin); "" = not yet
	created      time.Time
	started      time.Time
	stopped      time.Time
	removed      bool
	// sb and log are set holding both life and Manager.mu, so either
	// lock is enough to read them.
	sb  backend.Sandbox
	log *logFile
	// why is the reason of the last stop or removal, for the operations
	// it cut short.
	why string

	// egress is the sandbox's egress state once it first ran with a
	// network; netAddr the address it is registered under while it
	// runs (egress.go).
	egress  *egress.Sandbox
	netAddr netip.Addr
	// secrets are the proxy-mode secrets of the current run, handed to
	// the egress state at netUp (secrets.go).
	secrets *secrets.Proxy
	// net is what it holds of the host's ports while it runs (ports.go).
	net portState
	// wsHeld: its workspace is attached (workspace.go). Holding life.
	wsHeld bool
	// paused: a Running sandbox is paused (pause.go); meaningless in
	// other states.
	paused bool
	// from is the snapshot a new sandbox's first start restores
	// (snapshot.go); nil after it.
	from *snapshotRef

	busy       atomic.Int32
	lastActive atomic.Int64 // unix nanoseconds
	usage      usage
}

// New opens the manager on its database: sandboxes that were running are
// reattached (or marked as errored if their agent died meanwhile), and
// sandboxes the database does not know are removed from the host.
func New(ctx context.Context, opts Options) (*Manager, error) {
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if !ValidIdleAction(opts.IdleAction) {
		return nil, fmt.Errorf("idle action %q: want %q or %q", opts.IdleAction, IdleStop, IdlePause)
	}
	if opts.MaxLifetime == 0 {
		opts.MaxLifetime = DefaultMaxLifetime
	}
	if opts.StoppedRetention == 0 {
		opts.StoppedRetention = DefaultStoppedRetention
	}
	if opts.MaxSandboxes == 0 {
		opts.MaxSandboxes = DefaultMaxSandboxes
	}
	if opts.MaxRunning == 0 {
		opts.MaxRunning = DefaultMaxRunning
	}
	if opts.Tick == 0 {
		opts.Tick = time.Second
	}
	if opts.UsageEvery <= 0 {
		opts.UsageEvery = DefaultUsageEvery
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{opts: opts, limits: opts.Limits.withDefaults(), be: opts.Backend, db: opts.DB, stmts: store.NewStmts(opts.DB), log: opts.Logger,
		entries: map[key]*entry{}, stop: make(chan struct{})}
	if err := m.initTiers(); err != nil {
		return nil, err
	}
	if err := m.recover(ctx); err != nil {
		return nil, err
	}
	m.sweepSnapshots()
	m.wg.Add(1)
	go m.janitor()
	return m, nil
}

// Close stops the janitor and unpublishes sandboxes' ports. Sandboxes
// keep running; a new Manager on the same database reattaches to them.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	m.mu.Lock()
	entries := slices.Collect(maps.Values(m.entries))
	for _, e := range entries {
		e.log.close()
	}
	m.mu.Unlock()
	// The host's ports are this server's: the next one publishes the
	// ports of the sandboxes it reattaches.
	for _, e := range entries {
		m.portsDown(e)
	}
}

func (m *Manager) info(e *entry) Info {
	spec := e.spec
	spec.Labels = maps.Clone(e.spec.Labels)
	spec.Env = slices.Clone(e.spec.Env)
	spec.Ports = slices.Clone(e.spec.Ports)
	spec.Exposed = slices.Clone(e.spec.Exposed)
	spec.Secrets = slices.Clone(e.spec.Secrets)
	return Info{ID: e.id, Namespace: e.ns, Name: e.name, State: e.shown(), Error: e.err, Spec: spec,
		Created: e.created, Started: e.started, Stopped: e.stopped}
}

func notFound(ns, name string) error {
	return errdefs.Errorf(errdefs.ErrNotFound, "sandbox %q in namespace %q does not exist (start it first)", name, ns)
}

// Get describes one sandbox.
func (m *Manager) Get(ns, name string) (Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key{ns, name}]
	if e == nil {
		return Info{}, notFound(ns, name)
	}
	return m.info(e), nil
}

// Labels returns the labels of ns/name (nil when it has none or does
// not exist), for records about it.
func (m *Manager) Labels(ns, name string) map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[key{ns, name}]; e != nil && len(e.spec.Labels) > 0 {
		return maps.Clone(e.spec.Labels)
	}
	return nil
}

// Filter selects sandboxes for List. Zero fields match everything.
type Filter struct {
	// Namespaces the caller may see; nil = all.
	Namespaces []string
	State      State
	Labels     map[string]string
}

// List returns the sandboxes matching f, sorted by namespace and name.
func (m *Manager) List(f Filter) []Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Info
	for k, e := range m.entries {
		if f.Namespaces != nil && !slices.Contains(f.Namespaces, k.ns) {
			continue
		}
		if f.State != "" && e.shown() != f.State {
			continue
		}
		match := true
		for lk, lv := range f.Labels {
			if v, ok := e.spec.Labels[lk]; !ok || v != lv {
				match = false
				break
			}
		}
		if match {
			out = append(out, m.info(e))
		}
	}
	slices.SortFunc(out, func(a, b Info) int {
		if a.Namespace != b.Namespace {
			if a.Namespace < b.Namespace {
				return -1
			}
			return 1
		}
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// CountByState counts sandboxes per namespace and state (for metrics).
func (m *Manager) CountByState() map[[2]string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[[2]string]int{}
	for k, e := range m.entries {
		out[[2]string{k.ns, string(e.shown())}]++
	}
	return out
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sb-" + hex.EncodeToString(b[:])
}

// Start starts the sandbox ns/name with spec, creating it if it does not
// exist. A running sandbox is left as it is (spec is not applied); a
// stopped or errored one is started again with its files kept. With
// create set, an existing sandbox is a conflict instead.
func (m *Manager) Start(ctx context.Context, ns, name string, spec Spec, create bool) (Info, error) {
	return m.start(ctx, ns, name, spec, create, nil)
}

// start is Start; from, when set, is the snapshot a new sandbox is
// restored from (snapshot.go), spec then the snapshot's.
func (m *Manager) start(ctx context.Context, ns, name string, spec Spec, create bool, from *snapshotRef) (Info, error) {
	if !ValidName(ns) || !ValidName(name) {
		return Info{}, errdefs.Errorf(errdefs.ErrInvalid, "sandbox and namespace names are 1-63 of [A-Za-z0-9_-] starting with a letter or digit")
	}
	spec = spec.withDefaults()
	if err := spec.Validate(); err != nil {
		return Info{}, err
	}
	if err := m.limits.checkCaps(spec); err != nil {
		return Info{}, err
	}
	pol := m.policy(ns)
	if err := m.chooseTier(ns, name, pol, &spec); err != nil {
		return Info{}, err
	}
	if len(spec.Egress) == 0 && len(pol.EgressDefault) > 0 && m.networking() {
		m.mu.Lock()
		exists := m.entries[key{ns, name}] != nil
		m.mu.Unlock()
		if !exists {
			// A new sandbox that asks for no egress gets its
			// namespace's default; a restart keeps what it had.
			spec.Egress = slices.Clone(pol.EgressDefault)
			if err := checkEgress(spec.Egress); err != nil {
				return Info{}, errdefs.Errorf(errdefs.ErrInvalid, "namespace %q's egress_default: %w", ns, err)
			}
		}
	}
	if err := m.checkSpec(ctx, ns, pol, spec); err != nil {
		return Info{}, err
	}
	if err := m.checkVolumes(spec.Volumes); err != nil {
		return Info{}, err
	}
	if len(spec.Egress) > 0 && !m.networking() {
		return Info{}, errNoNetwork
	}
	if len(spec.Ports) > 0 && !m.networking() {
		return Info{}, errNoPorts(spec.Ports, nil)
	}
	if err := m.checkSecrets(ns, spec.Secrets); err != nil {
		return Info{}, err
	}
	if spec.Workspace != "" && m.opts.Workspaces == nil {
		return Info{}, errNoWorkspaces
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return Info{}, errdefs.Errorf(errdefs.ErrUnavailable, "the server is shutting down")
	}
	k := key{ns, name}
	e := m.entries[k]
	switch {
	case e == nil:
	case create:
		m.mu.Unlock()
		return Info{}, errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q already exists", name, ns)
	case e.state == Running && e.paused:
		// A start makes it run: a client that knows nothing of pausing
		// starts a sandbox before it uses it.
		m.mu.Unlock()
		if err := m.Resume(ctx, ns, name); err != nil {
			return Info{}, err
		}
		return m.Get(ns, name)
	case e.state == Running:
		info := m.info(e)
		m.mu.Unlock()
		e.touch()
		return info, nil
	case e.state == Starting || e.state == Stopping:
		st := e.state
		m.mu.Unlock()
		return Info{}, errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is %s; try again when that has finished", name, ns, st)
	}
	if n := m.runningLocked(); n >= m.opts.MaxRunning {
		m.mu.Unlock()
		return Info{}, errdefs.Errorf(errdefs.ErrLimit, "%d sandboxes are running, this server's maximum; stop some", n)
	}
	// Admitted and marked starting under one hold of m.mu: concurrent
	// starts cannot both take the last of a resource.
	if err := m.admitNamespace(ns, pol, spec); err != nil {
		m.mu.Unlock()
		return Info{}, err
	}
	if err := m.opts.Capacity.admit(m.grantedLocked(), m.limits.grant(spec)); err != nil {
		m.mu.Unlock()
		return Info{}, err
	}
	fresh := e == nil
	if fresh {
		if len(m.entries) >= m.opts.MaxSandboxes {
			m.mu.Unlock()
			return Info{}, errdefs.Errorf(errdefs.ErrLimit, "this server holds %d sandboxes, its maximum; remove some", len(m.entries))
		}
		now := time.Now()
		e = &entry{id: newID(), ns: ns, name: name, state: Starting, spec: spec, created: now, from: from}
		if from != nil {
			e.imageID = from.meta.ImageID
		}
		e.lastActive.Store(now.UnixNano())
		// Held before anyone can see e: a stop or removal of the new
		// name waits until its row is written and its start is done.
		e.life.Lock()
		m.entries[k] = e // reserves the name; concurrent starts see it starting
	} else {
		// Ports exposed live are the sandbox's until unexposed, whatever
		// config a restart brings; one that config gives a host port of
		// its own to is replaced by it.
		spec.Exposed = slices.DeleteFunc(slices.Clone(e.spec.Exposed), func(x ExposedPort) bool {
			return slices.ContainsFunc(spec.Ports, func(p backend.PortMapping) bool { return p.Host == x.Host })
		})
		e.state, e.err, e.spec = Starting, "", spec
	}
	m.mu.Unlock()
	// The database write happens outside m.mu, which every exec takes.
	if fresh {
		if err := m.insert(ctx, e); err != nil {
			m.mu.Lock()
			delete(m.entries, k)
			e.removed = true
			m.mu.Unlock()
			e.life.Unlock()
			return Info{}, err
		}
	} else {
		e.life.Lock()
	}
	m.mu.Lock()
	removed := e.removed
	m.mu.Unlock()
	if removed {
		// Removed while this start waited for the removal to finish: the
		// name is free again, and the start makes a new sandbox of it.
		e.life.Unlock()
		return m.start(ctx, ns, name, spec, create, from)
	}
	defer e.life.Unlock()
	t0 := time.Now()
	err := m.startLocked(ctx, e)
	started := time.Now()
	if err == nil {
		e.usage.reset(e.sb, started)
	}
	if err != nil && fresh && (from != nil || errdefs.Kind(err) == errdefs.ErrInvalid.Error() || errdefs.Kind(err) == errdefs.ErrUnsupported.Error() || errors.As(err, new(pullError)) || errors.As(err, new(portError)) || errors.As(err, new(secretsError)) || errors.As(err, new(workspaceError))) {
		// The request was refused (an image the store lacks or could not
		// pull, a volume the policy forbids, a host port taken, a secret
		// its provider would not give, a workspace missing or over its quota): it leaves no record, no
		// name taken and nothing counted against the server's limits, as
		// if it never came.
		m.discard(ctx, e)
		return Info{}, err
	}
	m.mu.Lock()
	if err != nil {
		e.state, e.err = Error, err.Error()
	} else {
		e.state, e.started, e.stopped, e.paused = Running, started, time.Time{}, false
		e.touch()
	}
	info := m.info(e)
	m.mu.Unlock()
	m.persist(e)
	if err != nil {
		e.logf("start failed: %v", err)
		return Info{}, fmt.Errorf("start sandbox %q: %w", name, err)
	}
	e.logf("started (image %s, %d MiB, %g cpus) in %.1f ms", spec.Image, spec.MemoryMiB, spec.CPUs, float64(time.Since(t0).Microseconds())/1000)
	m.watch(e, e.sb)
	return info, nil
}

// discard undoes the creation of e, a new sandbox whose first start was
// refused: whatever the backend made of it, its database row, its log and
// its entry. Holds e.life.
func (m *Manager) discard(ctx context.Context, e *entry) {
	var err error
	if e.sb != nil {
		err = e.sb.Remove(context.WithoutCancel(ctx))
	} else {
		err = m.removeOnHost(context.WithoutCancel(ctx), e.spec.Isolation, e.id)
	}
	if err != nil {
		// Its id is unknown to the database from here on: the next
		// server start removes what is left as an orphan.
		m.log.Error("remove refused sandbox", "id", e.id, "err", err)
	}
	// The row goes before the name is freed: a start of the same name
	// right after inserts a row of its own.
	if _, err := m.stmts.Exec(context.WithoutCancel(ctx), `DELETE FROM sandboxes WHERE id = ?`, e.id); err != nil {
		m.log.Error("delete refused sandbox record", "id", e.id, "err", err)
	}
	m.mu.Lock()
	delete(m.entries, key{e.ns, e.name})
	e.removed = true
	m.mu.Unlock()
	e.log.remove()
}

// Running is how many sandboxes run (or are starting or stopping).
func (m *Manager) Running() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.runningLocked()
}

func (m *Manager) runningLocked() int {
	n := 0
	for _, e := range m.entries {
		if e.state == Running || e.state == Starting {
			n++
		}
	}
	return n
}

// startLocked creates (first time) or reopens the backend sandbox and
// starts it. Holds e.life.
func (m *Manager) startLocked(ctx context.Context, e *entry) error {
	m.mu.Lock()
	spec := e.spec
	m.mu.Unlock()
	if e.log == nil {
		l := openLog(m.opts.LogDir, e.id)
		m.mu.Lock()
		e.log = l
		m.mu.Unlock()
	}
	be, err := m.backendOf(spec)
	if err != nil {
		return err
	}
	img, err := m.image(ctx, e, spec.Image)
	if err != nil {
		return err
	}
	// Read now, at every start: a rotated value takes effect here.
	sec, err := m.resolveSecrets(ctx, e, spec.Secrets)
	if err != nil {
		return err
	}
	cfg := withSecrets(m.config(e.ns, spec, e.id, img), sec)
	if cfg.DiskBytes > 0 && !diskLimits(be) {
		// A limit asked for (or configured) that nothing would enforce
		// is refused, not dropped.
		return errNoDiskLimits(be, cfg.DiskBytes)
	}
	if err := m.workspaceUp(ctx, e, &cfg); err != nil {
		return err
	}
	restored := false
	if e.sb == nil && e.from != nil {
		sb, err := m.restoreOnHost(ctx, be, e, cfg)
		if err != nil {
			m.workspaceDown(ctx, e)
			return err
		}
		m.mu.Lock()
		e.sb = sb
		m.mu.Unlock()
		restored = true
	} else if e.sb == nil {
		sb, err := be.Open(ctx, cfg)
		if err != nil {
			sb, err = be.Create(ctx, cfg)
		}
		if err != nil {
			m.workspaceDown(ctx, e)
			return err
		}
		m.mu.Lock()
		e.sb = sb
		m.mu.Unlock()
	} else if s, ok := e.sb.(backend.Reconfigurer); ok {
		s.SetConfig(cfg)
	}
	// Bound first: a host port that is taken fails the start before the
	// sandbox boots.
	ports, err := m.bindPorts(e.name, spec)
	if err != nil {
		m.workspaceDown(ctx, e)
		return err
	}
	// The request's cancellation must not leave a half-started sandbox:
	// the start runs to its own deadline.
	if restored {
		// Restored running.
	} else if err := e.sb.Start(context.WithoutCancel(ctx)); err != nil {
		closePorts(ports)
		m.workspaceDown(ctx, e)
		return err
	}
	if err := m.keepSecrets(e, sec.Proxy); err != nil {
		closePorts(ports)
		_ = e.sb.Stop(context.WithoutCancel(ctx))
		return err
	}
	if err := m.netUp(e, e.sb); err != nil {
		closePorts(ports)
		_ = e.sb.Stop(context.WithoutCancel(ctx))
		m.workspaceDown(ctx, e)
		return err
	}
	if err := m.portsUp(e, ports); err != nil {
		m.netDown(e)
		_ = e.sb.Stop(context.WithoutCancel(ctx))
		m.workspaceDown(ctx, e)
		return err
	}
	return nil
}

// config is the backend's configuration for a sandbox of spec, under the
// server's settings.
func (m *Manager) config(ns string, spec Spec, id string, img *image.Image) backend.Config {
	cfg := spec.config(id, img)
	t := m.tiers[spec.Isolation]
	cfg.PidsMax, cfg.NoFile = m.limits.Pids, m.limits.OpenFiles
	// The disk and write-path settings: the namespace's (the
	// configuration file's, its [defaults] filled in) where a policy is
	// set, else the server's options.
	diskBytes, readOnly, paths := m.opts.DiskBytes, m.opts.ReadOnlyRoot, m.opts.WritePaths
	if m.opts.Policy != nil {
		p := m.policy(ns)
		readOnly, paths = p.ReadOnlyRoot, p.WritePaths
		if p.DiskBytes > 0 {
			diskBytes = p.DiskBytes
		}
	}
	if cfg.DiskBytes == 0 && (t.Backend == nil || diskLimits(t.Backend)) {
		cfg.DiskBytes = diskBytes
	}
	cfg.ReadOnlyRoot, cfg.WritablePaths = readOnly, paths
	if m.networking() {
		cfg.Network = backend.NetworkEgress
	}
	return cfg
}

// diskLimits reports whether be enforces backend.Config.DiskBytes
// (the native backend with --disk-pool; the fake one records it).
func diskLimits(be backend.Backend) bool {
	d, ok := be.(interface{ DiskLimits() string })
	return !ok || d.DiskLimits() != ""
}

// image resolves the image e starts from. The first start resolves the
// requested name and records the image's pin (its id, or the host image's
// own name), which from then on holds a stored image in the store (it
// cannot be removed or pruned while e exists) and is what every later
// start and restart uses, whatever the name points to by then: a language
// name an operator maps to another image on the next server start does
// not move an existing sandbox's upper layer onto it.
func (m *Manager) image(ctx context.Context, e *entry, name string) (*image.Image, error) {
	m.mu.Lock()
	id := e.imageID
	resolve := m.opts.Images
	if t := m.tiers[e.spec.Isolation]; t.Images != nil {
		resolve = t.Images
	}
	m.mu.Unlock()
	if id != "" {
		img, err := resolve(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("image %s (%s) of this sandbox: %w", name, id, err)
		}
		return img, nil
	}
	img, err := resolve(ctx, name)
	if errors.Is(err, image.ErrNotFound) {
		if m.opts.Pull == nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "image %q is not in this server's store: pull it first (warren image pull, or the image.pull method)", name)
		}
		if err := m.opts.Pull(ctx, e.ns, name, e.logf); err != nil {
			return nil, pullError{err}
		}
		img, err = resolve(ctx, name)
	}
	if err != nil || img.Pin() == "" {
		return img, err
	}
	pin := img.Pin()
	m.mu.Lock()
	e.imageID = pin
	removed := e.removed
	m.mu.Unlock()
	if removed {
		return nil, notFound(e.ns, e.name)
	}
	if _, err := m.stmts.Exec(context.WithoutCancel(ctx), `UPDATE sandboxes SET image_id = ? WHERE id = ?`, pin, e.id); err != nil {
		return nil, fmt.Errorf("record sandbox image: %w", err)
	}
	// The name may have been removed (and the image with it) between the
	// lookup and the write; by id, now pinned, it is there or it is not.
	img, err = resolve(ctx, pin)
	if err != nil {
		return nil, fmt.Errorf("image %q was removed while the sandbox started: %w", name, err)
	}
	return img, nil
}

// pullError is a failed pull of a start's image: like a refusal, it
// leaves nothing of a new sandbox behind.
type pullError struct{ error }

func (e pullError) Unwrap() error { return e.error }

// watch marks the sandbox errored if its init ends without a stop. It
// ends with the manager: once closed, the manager records nothing more, and
// the next one finds out at reattach whether the init still runs.
func (m *Manager) watch(e *entry, sb backend.Sandbox) {
	// This run's channel: the same Sandbox is started again after a stop,
	// with a Done of its own, and a watcher that wakes late for the run
	// that was stopped must not take the next one for dead.
	done := sb.Done()
	go func() {
		select {
		case <-done:
		case <-m.stop:
			return
		}
		// The lifecycle lock first, held until what the dead run held is
		// released: a start that sees the error state (and so may come at
		// once) waits for the release, which would otherwise stop the run
		// it started.
		e.life.Lock()
		defer e.life.Unlock()
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return
		}
		unexpected := e.sb == sb && sb.Done() == done && e.state == Running && !e.removed
		if unexpected {
			e.state, e.err, e.stopped = Error, "the sandbox's init exited unexpectedly", time.Now()
			// Logged before anyone can see the state: whoever sees
			// error finds the line.
			e.logf("init exited unexpectedly")
		}
		m.mu.Unlock()
		if !unexpected {
			return
		}
		m.persist(e)
		// Release what it held (cgroup, runtime directory, link).
		m.netDown(e)
		m.auditUsage(e, sb, "exited")
		_ = sb.Stop(context.Background())
		m.workspaceDown(context.Background(), e)
	}()
}

// Stop stops ns/name; stopping a stopped sandbox is not an error.
func (m *Manager) Stop(ctx context.Context, ns, name string) error {
	return m.stopWhy(ctx, ns, name, "a stop was requested")
}

// stopWhy stops ns/name for the reason why ("maximum lifetime 1h0m0s
// reached"), which the log and the callers whose operations the stop cut
// short are told.
func (m *Manager) stopWhy(ctx context.Context, ns, name, why string) error {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	m.mu.Unlock()
	if e == nil {
		return notFound(ns, name)
	}
	e.life.Lock()
	defer e.life.Unlock()
	m.mu.Lock()
	if e.removed {
		m.mu.Unlock()
		return notFound(ns, name)
	}
	from := e.state
	if from != Running && from != Error {
		m.mu.Unlock()
		return nil
	}
	e.state, e.why = Stopping, why
	m.mu.Unlock()
	// Recorded first: a server that dies mid-stop leaves a row saying
	// stopping, which the next one finishes (recover), not one saying
	// running, which it would find dead and mark errored.
	m.persist(e)
	var err error
	m.netDown(e)
	if from == Running {
		m.auditUsage(e, e.sb, "stop")
	}
	if e.sb != nil {
		err = e.sb.Stop(context.WithoutCancel(ctx))
	}
	if err == nil {
		m.workspaceDown(ctx, e)
	}
	m.mu.Lock()
	if err != nil {
		e.state, e.err = Error, "stop: "+err.Error()
	} else {
		e.state, e.stopped = Stopped, time.Now()
		if from == Running {
			e.err = ""
		}
	}
	m.mu.Unlock()
	m.persist(e)
	if err != nil {
		return fmt.Errorf("stop sandbox %q: %w", name, err)
	}
	e.logf("stopped: %s", why)
	return nil
}

// Remove stops ns/name and deletes it and its files. It reports whether
// the sandbox existed.
func (m *Manager) Remove(ctx context.Context, ns, name string) (bool, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	m.mu.Unlock()
	if e == nil {
		return false, nil
	}
	e.life.Lock()
	defer e.life.Unlock()
	m.mu.Lock()
	if e.removed {
		m.mu.Unlock()
		return false, nil
	}
	running := e.state == Running
	e.state, e.why = Stopping, "it was removed"
	m.mu.Unlock()
	// The intent is written first: a server killed from here on finishes
	// the removal when it next starts (recover), rather than showing a
	// half-removed sandbox in error.
	if _, err := m.stmts.Exec(context.Background(), `UPDATE sandboxes SET state = ? WHERE id = ?`, removingState, e.id); err != nil {
		m.log.Error("persist sandbox removal", "id", e.id, "err", err)
	}
	m.netDown(e)
	if running {
		m.auditUsage(e, e.sb, "remove")
	}
	if e.sb != nil {
		if err := e.sb.Remove(context.WithoutCancel(ctx)); err != nil {
			m.mu.Lock()
			e.state, e.err = Error, "remove: "+err.Error()
			m.mu.Unlock()
			m.persist(e)
			return true, fmt.Errorf("remove sandbox %q: %w", name, err)
		}
	} else if err := m.removeOnHost(ctx, e.spec.Isolation, e.id); err != nil {
		return true, fmt.Errorf("remove sandbox %q: %w", name, err)
	}
	m.workspaceDown(ctx, e)
	// The row goes before the name is freed: a start of the same name
	// right after inserts a row of its own.
	if _, err := m.stmts.Exec(context.Background(), `DELETE FROM sandboxes WHERE id = ?`, e.id); err != nil {
		// The sandbox is gone from the host; after a restart the row shows
		// it again, and removing it then deletes the row.
		m.log.Error("delete sandbox record", "id", e.id, "err", err)
	}
	m.mu.Lock()
	delete(m.entries, key{ns, name})
	e.removed = true
	m.mu.Unlock()
	e.log.remove()
	return true, nil
}

// removeOnHost removes a sandbox of tier the manager holds no handle for.
func (m *Manager) removeOnHost(ctx context.Context, tier, id string) error {
	t, err := m.tier(tier)
	if err != nil {
		return err
	}
	resolve := m.opts.Images
	if t.Images != nil {
		resolve = t.Images
	}
	img, err := resolve(ctx, image.HostName)
	if err != nil {
		return err
	}
	sb, err := t.Backend.Open(ctx, backend.Config{ID: id, Image: img})
	if err != nil {
		return nil //nolint:nilerr // Open fails only when nothing is on the host
	}
	return sb.Remove(ctx)
}

func (e *entry) touch() { e.lastActive.Store(time.Now().UnixNano()) }

func (e *entry) logf(format string, args ...any) {
	e.log.printf(format, args...)
}

// Logs returns the last tail lines of the log of ns/name (tail <= 0: all kept).
func (m *Manager) Logs(ns, name string, tail int) ([]string, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	var l *logFile
	if e != nil {
		l = e.log
	}
	m.mu.Unlock()
	if e == nil {
		return nil, notFound(ns, name)
	}
	return l.tail(tail)
}

// insert records a new sandbox.
func (m *Manager) insert(ctx context.Context, e *entry) error {
	spec, err := json.Marshal(e.spec)
	if err != nil {
		return err
	}
	_, err = m.stmts.Exec(context.WithoutCancel(ctx), `INSERT INTO sandboxes (id, namespace, name, state, spec, created) VALUES (?, ?, ?, ?, ?, ?)`,
		e.id, e.ns, e.name, string(e.state), spec, e.created.UnixNano())
	if err != nil {
		return fmt.Errorf("record sandbox: %w", err)
	}
	return nil
}

// persist writes e's state; a failure is logged (the in-memory state is
// the truth while the daemon runs; recovery re-checks the host).
func (m *Manager) persist(e *entry) {
	if err := m.persistErr(context.Background(), e); err != nil {
		m.log.Error("persist sandbox state", "id", e.id, "err", err)
	}
}

// persistErr is persist for a caller that answers with its error.
func (m *Manager) persistErr(ctx context.Context, e *entry) error {
	m.mu.Lock()
	if e.removed {
		m.mu.Unlock()
		return nil
	}
	spec, _ := json.Marshal(e.spec)
	args := []any{string(e.state), e.err, spec, unixNano(e.started), unixNano(e.stopped), e.id}
	m.mu.Unlock()
	if _, err := m.stmts.Exec(ctx, `UPDATE sandboxes SET state = ?, error = ?, spec = ?, started = ?, stopped = ? WHERE id = ?`, args...); err != nil {
		return fmt.Errorf("record sandbox: %w", err)
	}
	return nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
