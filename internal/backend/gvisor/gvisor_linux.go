// Package gvisor is the isolation tier with a second kernel: each sandbox
// is an OCI container run by gVisor's runsc on its systrap platform, so
// sandbox code's system calls are answered by gVisor's sentry, not the
// host kernel. Warren's own agent is the container's init, and every
// feature above the backend contract (exec, files, tar, REPLs, processes,
// terminals) goes through it as on the native backend.
//
// How the host reaches the agent: runsc passes host descriptors into the
// sandbox (--pass-fd) but imports sockets as connected streams only, so
// it cannot hand the agent a listening socket. The host passes a connected
// control socket instead and sends each new connection over it as a
// descriptor (boot.SendConn): one socket pair and one sendmsg per
// connection, which the agent client pools. No path inside the sandbox
// leads to the host, and no host socket is visible to sandbox code
// (runsc's --host-uds stays off). A checkpoint drops these descriptors
// and the host passes a new control socket after (checkpoint_linux.go).
//
// On-disk layout, all owned by one sandbox and removed with it:
//
//	<DataDir>/sandboxes/<id>/{upper,work}   the writable layer, kept across stop/start (with
//	                                        disk limits on: <disk pool>/.gvisor/<id>, disk_linux.go)
//	<DataDir>/sandboxes/<id>/rootfs         the overlay runsc serves as the root, mounted
//	                                        on the host while the sandbox runs
//	<RunDir>/<id>/{config.json,agent.log}   the OCI bundle and the agent's output, removed at stop
//	<RunDir>/.runsc/<id>                    runsc's state, removed by `runsc delete`
//	cgroup <own cgroup>/<CgroupPrefix>/<id> per controller, made by runsc with the limits
package gvisor

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// Platforms runsc can intercept system calls with here: systrap (seccomp
// traps and shared-memory stubs) and ptrace, slower, where systrap cannot
// run. KVM hangs on this kind of host (nested PVM).
const (
	PlatformSystrap = "systrap"
	PlatformPtrace  = "ptrace"
)

// Options configure the backend.
type Options struct {
	DataDir   string // default /var/lib/warren-gvisor
	RunDir    string // default /run/warren-gvisor
	RunscPath string // the runsc binary
	AgentPath string // the warren-agent binary (static)
	// Platform is PlatformSystrap (default) or PlatformPtrace.
	Platform string
	Python   string // interpreter paths inside the sandbox
	Node     string
	// CgroupPrefix names the cgroup under the process's own one that
	// sandbox cgroups are made in (default "warren-gvisor-<hash of RunDir>").
	CgroupPrefix string
	// StartTimeout bounds a sandbox's start (default 20s: runsc's own
	// start is ~0.1 s, but a loaded host is slow to fork its processes).
	StartTimeout time.Duration
	// Disk is the disk pool sandboxes' directories are limited on (the
	// native backend's DiskDirs); nil: no disk limits (disk_linux.go).
	Disk   *diskquota.Dirs
	Logger *slog.Logger
	// Net gives sandboxes of Config.Network backend.NetworkEgress their
	// link (net_linux.go); nil: loopback only, egress and ports refused.
	Net *netplumb.Host
}

// Backend is the gVisor backend.
type Backend struct {
	opts    Options
	cgroups *cgroup.Manager
	seccomp []byte
	log     *slog.Logger

	// sandboxes is the directory of the sandboxes' directories, on disk
	// (a diskquota.Dirs of the pool) when limits are on; diskOff is why
	// limits Options.Disk asked for are off (disk_linux.go).
	sandboxes string
	disk      *diskquota.Dirs
	diskOff   string

	hostOnce sync.Once
	hostImg  *image.Image
	hostErr  error
}

// New checks the host (root, runsc, the agent) and returns the backend.
func New(opts Options) (*Backend, error) {
	if opts.DataDir == "" {
		opts.DataDir = "/var/lib/warren-gvisor"
	}
	if opts.RunDir == "" {
		opts.RunDir = "/run/warren-gvisor"
	}
	if opts.Platform == "" {
		opts.Platform = PlatformSystrap
	}
	if opts.Platform != PlatformSystrap && opts.Platform != PlatformPtrace {
		return nil, fmt.Errorf("gvisor backend: platform %q: want %q or %q", opts.Platform, PlatformSystrap, PlatformPtrace)
	}
	if opts.CgroupPrefix == "" {
		h := sha256.Sum256([]byte(opts.RunDir))
		opts.CgroupPrefix = "warren-gvisor-" + hex.EncodeToString(h[:4])
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 20 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("gvisor backend: must run as root (runsc needs it for its namespaces and cgroups)")
	}
	if opts.RunscPath == "" {
		return nil, errors.New("gvisor backend: no runsc binary (scripts/runsc.sh builds one)")
	}
	if _, err := os.Stat(opts.RunscPath); err != nil {
		return nil, fmt.Errorf("gvisor backend: runsc: %w", err)
	}
	if opts.AgentPath == "" {
		return nil, errors.New("gvisor backend: no agent binary")
	}
	if _, err := os.Stat(opts.AgentPath); err != nil {
		return nil, fmt.Errorf("gvisor backend: agent: %w", err)
	}
	prog, err := seccomp.Compile(seccomp.DefaultProfile())
	if err != nil {
		return nil, fmt.Errorf("gvisor backend: seccomp profile: %w", err)
	}
	for _, d := range []string{opts.DataDir, filepath.Join(opts.DataDir, "sandboxes"), filepath.Join(opts.DataDir, "images"), opts.RunDir, filepath.Join(opts.RunDir, runscState), filepath.Join(opts.RunDir, bindsDir), filepath.Join(opts.RunDir, netnsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor backend: %w", err)
		}
	}
	cg, err := cgroup.New(opts.CgroupPrefix)
	if err != nil {
		return nil, fmt.Errorf("gvisor backend: %w", err)
	}
	b := &Backend{opts: opts, cgroups: cg, seccomp: seccomp.Encode(prog), log: opts.Logger}
	if err := b.openDisk(); err != nil {
		return nil, fmt.Errorf("gvisor backend: %w", err)
	}
	return b, nil
}

// runtimePids is what the host's pids limit allows runsc's own
// processes and threads beside the sandbox's (buildSpec).
const runtimePids = 256

// runscState is runsc's state directory under RunDir (--root).
const runscState = ".runsc"

// Name implements backend.Backend.
func (b *Backend) Name() string { return "gvisor" }

// Capabilities implements backend.Backend: what differs from the native
// backend, measured on runsc (see docs/isolation.md).
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		SecondKernel: true,
		// runsc runs the sandbox without a host user namespace mapping
		// of Warren's; the sentry, not the host kernel, decides what
		// sandbox root may do.
		UserNS: false,
		// The sentry allocates the sandbox's memory from the host's
		// memory cgroup: past the limit the host's OOM killer ends the
		// sentry, so the whole sandbox, not one process.
		OOMKillsProcess: false,
		// The host's pids limit counts the sentry's threads and stubs:
		// a sandbox going past it ends with its sentry (gVisor has no
		// per-sandbox task limit of its own to fail one fork).
		PidsLimitFailsFork: false,
		// The agent's control socket is this process's: a restarted
		// server finds the sandbox stopped (files kept).
		Reattach: false,
		// runsc checkpoint and restore (checkpoint_linux.go).
		Checkpoint: true,
	}
}

// HostImage returns the host image, built under DataDir on first use.
// Its files are root's: runsc's gofer serves them to the sandbox, whose
// root is not mapped to another host uid.
func (b *Backend) HostImage() (*image.Image, error) {
	b.hostOnce.Do(func() {
		b.hostImg, b.hostErr = image.Host(filepath.Join(b.opts.DataDir, "images"), 0, 0)
	})
	return b.hostImg, b.hostErr
}

func (b *Backend) sandboxDir(id string) string { return filepath.Join(b.sandboxes, id) }
func (b *Backend) runDir(id string) string     { return filepath.Join(b.opts.RunDir, id) }

// checkSupported refuses what this backend does not do yet, rather than
// start a sandbox without it.
func checkSupported(cfg backend.Config) error {
	var missing []string
	if len(cfg.TrustCA) > 0 && cfg.ReadOnlyRoot {
		// The agent writes the CA into the root (agentConfig), which
		// runsc mounts read-only from the start.
		missing = append(missing, "a trusted CA (proxy-mode secrets) with a read-only root")
	}
	if len(missing) > 0 {
		return fmt.Errorf("isolation gvisor does not support %s yet (isolation native does): %w", strings.Join(missing, ", "), backend.ErrUnsupported)
	}
	return nil
}

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid sandbox config: %w", err)
	}
	if err := checkSupported(cfg); err != nil {
		return nil, err
	}
	if err := b.checkDisk(cfg); err != nil {
		return nil, err
	}
	if err := b.checkNet(cfg); err != nil {
		return nil, err
	}
	dir := b.sandboxDir(cfg.ID)
	if err := b.disk.Make(dir, cfg.DiskBytes, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %q exists: %w", cfg.ID, os.ErrExist)
		}
		return nil, err
	}
	for _, d := range []string{"upper", "work", "rootfs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil { //nolint:gosec // 0755: the root's directories, under the 0700 sandbox directory
			_ = b.disk.Remove(dir)
			return nil, err
		}
	}
	return b.newSandbox(cfg), nil
}

// Open implements backend.Backend. An agent an earlier process started
// cannot be reached (its control socket died with that process), so what
// runsc still runs of the sandbox is deleted and the sandbox is returned
// stopped, its files kept.
func (b *Backend) Open(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	if _, err := os.Stat(b.sandboxDir(cfg.ID)); err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", cfg.ID, err)
	}
	s := b.newSandbox(cfg)
	if err := s.release(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// IDs implements backend.Backend.
func (b *Backend) IDs() ([]string, error) {
	ents, err := os.ReadDir(b.sandboxes)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// ReapOrphans implements backend.Backend: containers runsc knows, bundles
// and root mounts of sandboxes keep does not claim are removed.
func (b *Backend) ReapOrphans(keep func(id string) bool) ([]string, error) {
	seen := map[string]bool{}
	// runsc's state files (stateFile).
	ents, err := os.ReadDir(filepath.Join(b.opts.RunDir, runscState))
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if _, c, ok := strings.Cut(e.Name(), "_sandbox:"); ok && strings.HasSuffix(c, ".state") {
			seen[strings.TrimSuffix(c, ".state")] = true
		}
	}
	// Bundles.
	if ents, err = os.ReadDir(b.opts.RunDir); err != nil {
		return nil, err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			seen[e.Name()] = true
		}
	}
	// Pinned network namespaces (net_linux.go).
	if ents, err = os.ReadDir(filepath.Join(b.opts.RunDir, netnsDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		seen[e.Name()] = true
	}
	// Pinned binds (binds_linux.go).
	if ents, err = os.ReadDir(filepath.Join(b.opts.RunDir, bindsDir)); err != nil {
		return nil, err
	}
	for _, e := range ents {
		seen[e.Name()] = true
	}
	ids, err := b.IDs()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if isMounted(filepath.Join(b.sandboxDir(id), "rootfs")) {
			seen[id] = true
		}
	}
	var removed []string
	var errs []error
	for id := range seen {
		if keep != nil && keep(id) {
			continue
		}
		if err := b.newSandbox(backend.Config{ID: id}).release(context.Background()); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	// Quota groups of sandbox directories a crash left half-removed.
	if err := b.disk.Reap(); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// stateFile is runsc's state file of sandbox id, whose one container has
// the sandbox's id: "<sandbox>_sandbox:<container>.state".
func (b *Backend) stateFile(id string) string {
	return filepath.Join(b.opts.RunDir, runscState, id+"_sandbox:"+id+".state")
}

// startTied starts cmd from one OS thread that lives as long as the
// process: the kernel sends a child its Pdeathsig when the thread that
// forked it ends, and a Go thread may end before its process does.
func startTied(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	tiedStarter() <- func() { errc <- cmd.Start() }
	return <-errc
}

var tiedStarter = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives on
		for f := range ch {
			f()
		}
	}()
	return ch
})

// runsc returns a runsc command with the backend's global flags.
func (b *Backend) runsc(ctx context.Context, args ...string) *exec.Cmd {
	return b.runscNet(ctx, "none", args...)
}

// runscNet is runsc with --network=network: "none", loopback only, the
// sentry's own (no host interface at all), or "sandbox", the interfaces
// of the namespace the spec names (net_linux.go).
func (b *Backend) runscNet(ctx context.Context, network string, args ...string) *exec.Cmd {
	global := []string{
		"--root=" + filepath.Join(b.opts.RunDir, runscState),
		"--platform=" + b.opts.Platform,
		"--network=" + network,
		// Writes go to the host's overlay (the sandbox's writable
		// layer, kept across stop/start), not to the sentry's memory.
		"--overlay2=none",
		// The sentry opens no host file itself: its gofer does. With
		// direct file access (runsc's default) the sentry keeps host
		// root (capabilities dropped, chrooted); without, it runs as
		// nobody in a user namespace of its own.
		"--directfs=false",
	}
	return exec.CommandContext(ctx, b.opts.RunscPath, append(global, args...)...) //nolint:gosec // runsc is the operator's binary; args are ours
}

// Sandbox is one gVisor sandbox.
type Sandbox struct {
	b  *Backend
	id string

	// mu guards what follows; startMu serialises Start and Stop.
	startMu sync.Mutex
	mu      sync.Mutex
	cfg     backend.Config
	run     *exec.Cmd // `runsc run`, which lives as long as the container
	done    chan struct{}
	ctl     *os.File // the host's end of the agent's control socket
	client  *agent.Client
	cg      *cgroup.Cgroup
	pid     int           // the sentry's host pid
	link    netplumb.Link // the sandbox's network link, if it has one
}

func (b *Backend) newSandbox(cfg backend.Config) *Sandbox {
	done := make(chan struct{})
	close(done)
	return &Sandbox{b: b, id: cfg.ID, cfg: cfg, done: done}
}

// ID implements backend.Sandbox.
func (s *Sandbox) ID() string { return s.id }

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
	return s.done
}

// Pid is the host pid of the sandbox's sentry (0 when stopped): the one
// process that runs all of the sandbox's code.
func (s *Sandbox) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// SetConfig implements backend.Reconfigurer.
func (s *Sandbox) SetConfig(cfg backend.Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg.ID = s.id
	s.cfg = cfg
}

// Stats implements backend.Sandbox, from the sandbox's host cgroup: what
// the sentry, its gofer and their stubs use, the sandbox's code in all.
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
		MemoryBytes: st.MemoryBytes, CPUUsage: time.Duration(st.CPUUsageNs), Pids: st.PidsCurrent,
		OOMKills: st.OOMKills, Throttled: st.ThrottledPeriods,
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

// Start implements backend.Sandbox.
func (s *Sandbox) Start(ctx context.Context) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	select {
	case <-s.Done():
	default:
		return nil // running
	}
	s.mu.Lock()
	cfg := s.cfg
	s.mu.Unlock()
	if err := checkSupported(cfg); err != nil {
		return err
	}
	if err := s.b.checkDisk(cfg); err != nil {
		return err
	}
	if err := s.b.checkNet(cfg); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.StartTimeout)
	defer cancel()
	if err := s.start(ctx, cfg); err != nil {
		_ = s.release(context.Background())
		return fmt.Errorf("start sandbox %s: %w", s.id, err)
	}
	return nil
}

func (s *Sandbox) start(ctx context.Context, cfg backend.Config) error {
	b := s.b
	rd, spec, err := s.prepareBundle(cfg)
	if err != nil {
		return err
	}

	// The agent's descriptors (boot.FD*): config, control, status, the
	// first connection.
	cfgHost, cfgAgent, err := socketPair()
	if err != nil {
		return err
	}
	defer func() { _ = cfgHost.Close(); _ = cfgAgent.Close() }()
	ctlHost, ctlAgent, err := socketPair()
	if err != nil {
		return err
	}
	defer func() { _ = ctlAgent.Close() }()
	keepCtl := false
	defer func() {
		if !keepCtl {
			_ = ctlHost.Close()
		}
	}()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer func() { _ = statusR.Close(); _ = statusW.Close() }()
	connHost, connAgent, err := socketPair()
	if err != nil {
		return err
	}
	defer func() { _ = connAgent.Close() }()
	first, err := net.FileConn(connHost)
	_ = connHost.Close()
	if err != nil {
		return err
	}
	keepFirst := false
	defer func() {
		if !keepFirst {
			_ = first.Close()
		}
	}()
	logf, err := os.OpenFile(filepath.Join(rd, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // under our own RunDir
	if err != nil {
		return err
	}
	defer func() { _ = logf.Close() }()

	// ExtraFiles start at 3: config 3, control 4, status 5, first
	// connection 6 land where the agent expects them (boot.FD*).
	run := b.runscNet(context.Background(), runscNetwork(cfg), "run", "--bundle="+rd,
		fmt.Sprintf("--pass-fd=3:%d", boot.FDConfig), fmt.Sprintf("--pass-fd=4:%d", boot.FDListener),
		fmt.Sprintf("--pass-fd=5:%d", boot.FDStatus), fmt.Sprintf("--pass-fd=6:%d", boot.FDConn),
		"--pid-file="+filepath.Join(rd, "sentry.pid"), s.id)
	run.ExtraFiles = []*os.File{cfgAgent, ctlAgent, statusW, connAgent}
	run.Stdout, run.Stderr = logf, logf
	// Its own process group, so a signal to the server's group (a
	// terminal's Ctrl-C) does not reach it: the server stops sandboxes.
	// Killed with the server (Pdeathsig), which nothing could reach it
	// from after (Capabilities.Reattach); `runsc run` runs its sentry
	// attached, so the sentry and gofer go with it. What they leave (the
	// state, the root's mount, the cgroup) the next server reaps.
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startTied(run); err != nil {
		return fmt.Errorf("runsc run: %w", err)
	}
	done := make(chan struct{})
	go func() {
		err := run.Wait()
		s.mu.Lock()
		stopped := s.run != run // release took it: a stop, not a crash
		s.mu.Unlock()
		if !stopped {
			// Its sentry, gofer or agent died: the sandbox manager
			// reports the sandbox in error; this says how.
			b.log.Warn("gvisor sandbox ended by itself", "id", s.id, "runsc", fmt.Sprint(err), "log", tail(filepath.Join(rd, "agent.log")))
		}
		close(done)
	}()
	s.mu.Lock()
	s.run, s.done = run, done
	s.mu.Unlock()
	_ = cfgAgent.Close()
	_ = ctlAgent.Close()
	_ = statusW.Close()
	_ = connAgent.Close()

	if err := boot.SendConfig(cfgHost, agentConfig(b, cfg, spec), nil, nil); err != nil {
		return fmt.Errorf("send the agent's config: %w", err)
	}
	_ = cfgHost.Close()
	if err := waitReady(ctx, statusR, done, filepath.Join(rd, "agent.log")); err != nil {
		return err
	}
	pid, err := sentryPid(filepath.Join(rd, "sentry.pid"))
	if err != nil {
		return err
	}
	cg, err := b.cgroups.Open(s.id)
	if err != nil {
		return fmt.Errorf("the sandbox's cgroup: %w", err)
	}
	ctl := ctlHost
	keepCtl, keepFirst = true, true
	client := agent.NewClientDial(dialer(ctl, first))
	s.mu.Lock()
	s.ctl, s.client, s.cg, s.pid = ctl, client, cg, pid
	s.mu.Unlock()
	return nil
}

// prepareBundle mounts the sandbox's root and writes the OCI bundle runsc
// runs (or restores) it from; it returns the bundle's directory.
func (s *Sandbox) prepareBundle(cfg backend.Config) (string, *specs.Spec, error) {
	b := s.b
	img := cfg.Image
	if img == nil || len(img.Layers) == 0 {
		return "", nil, errors.New("no image")
	}
	dir := b.sandboxDir(s.id)
	rootfs := filepath.Join(dir, "rootfs")
	if err := s.mountLimitedRoot(cfg, dir, img.Layers); err != nil {
		return "", nil, err
	}
	spec, err := buildSpec(b, cfg, rootfs)
	if err != nil {
		return "", nil, err
	}
	if cfg.Network == backend.NetworkEgress {
		if err := s.attachNet(spec, len(cfg.Volumes)); err != nil {
			return "", nil, err
		}
	}
	if err := b.pinBinds(s.id, spec, rootfs, len(cfg.Volumes)); err != nil {
		return "", nil, err
	}
	rd := b.runDir(s.id)
	if err := os.MkdirAll(rd, 0o700); err != nil {
		return "", nil, err
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(rd, "config.json"), js, 0o600); err != nil {
		return "", nil, err
	}
	return rd, spec, nil
}

// dialer makes each connection to the agent: first, then a new socket
// pair per call whose far end goes to the agent on ctl.
func dialer(ctl *os.File, first net.Conn) func(context.Context) (net.Conn, error) {
	var mu sync.Mutex
	return func(ctx context.Context) (net.Conn, error) {
		mu.Lock()
		c := first
		first = nil
		mu.Unlock()
		if c != nil {
			return c, nil
		}
		host, far, err := socketPair()
		if err != nil {
			return nil, err
		}
		defer func() { _ = far.Close() }()
		if err := boot.SendConn(ctl, far); err != nil {
			_ = host.Close()
			return nil, fmt.Errorf("connect to the agent: %w", err)
		}
		conn, err := net.FileConn(host)
		_ = host.Close()
		return conn, err
	}
}

// socketPair returns the two ends of a connected unix stream socket pair.
func socketPair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "agent"), nil
}

// waitReady reads the agent's status line: "ok ..." once it serves.
func waitReady(ctx context.Context, status *os.File, done <-chan struct{}, logPath string) error {
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(io.LimitReader(status, 64<<10)).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if strings.HasPrefix(l, "ok") {
			return nil
		}
		if l == "" {
			return fmt.Errorf("the agent exited before it was ready: %s", tail(logPath))
		}
		return fmt.Errorf("agent: %s", strings.TrimSpace(l))
	case <-ctx.Done():
		return fmt.Errorf("the agent was not ready in time: %w (%s)", ctx.Err(), tail(logPath))
	case <-done:
		select {
		case l := <-line:
			if strings.HasPrefix(l, "ok") {
				return errors.New("the sandbox ended at once")
			}
			return fmt.Errorf("runsc exited: %s %s", strings.TrimSpace(l), tail(logPath))
		case <-time.After(time.Second):
			return fmt.Errorf("runsc exited: %s", tail(logPath))
		}
	}
}

// tail is the end of a log file, for an error.
func tail(p string) string {
	b, err := os.ReadFile(p) //nolint:gosec // our own log under RunDir
	if err != nil {
		return "no log"
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 600 {
		s = "..." + s[len(s)-600:]
	}
	if s == "" {
		return "empty log"
	}
	return s
}

// sentryPid reads the sandbox process's pid from the file `runsc run
// --pid-file` wrote when it made the container (a `runsc state` call
// would cost another runsc process per start).
func sentryPid(p string) (int, error) {
	b, err := os.ReadFile(p) //nolint:gosec // our own bundle under RunDir
	if err != nil {
		return 0, fmt.Errorf("the sentry's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("the sentry's pid: %.40q in %s", b, p)
	}
	return pid, nil
}

// buildSpec is the OCI spec runsc runs: Warren's spec for cfg, with the
// agent as the process and the mounts gVisor makes itself.
func buildSpec(b *Backend, cfg backend.Config, rootfs string) (*specs.Spec, error) {
	img := cfg.Image
	env := append(append([]string(nil), img.Env...), cfg.Env...)
	hostname := cfg.Hostname
	if hostname == "" {
		hostname = backend.DefaultHostname
	}
	cwd := cfg.Workdir
	if cwd == "" {
		cwd = img.WorkingDir
	}
	var nofile uint64
	if cfg.NoFile > 0 {
		nofile = uint64(cfg.NoFile)
	}
	spec, err := oci.Build(oci.Params{
		RootPath: rootfs, Hostname: hostname, Env: env, Cwd: cwd, ImageMounts: img.Mounts,
		MemoryBytes: cfg.MemoryBytes, CPUs: cfg.CPUs, PidsMax: cfg.PidsMax, NoFile: nofile,
		Volumes: backend.VolumeMounts(cfg.Volumes), ReadOnlyRoot: cfg.ReadOnlyRoot,
		WritablePaths: append(slices.Clone(backend.AlwaysWritable), cfg.WritablePaths...),
	})
	if err != nil {
		return nil, err
	}
	// gVisor's /dev is its own: the standard tmpfs, devpts, shm and
	// mqueue, without binds of the host's device nodes (the sentry
	// emulates null, zero, full, random, urandom and tty).
	mounts := spec.Mounts[:0]
	for _, m := range spec.Mounts {
		if m.Type == "bind" && strings.HasPrefix(m.Destination, "/dev/") {
			continue
		}
		mounts = append(mounts, m)
	}
	// The agent, from the host read-only: a file the sentry reads through
	// its gofer (checkpointed and restored with the mount), not a host
	// descriptor (--exec-fd), whose mapped pages a checkpoint cannot keep.
	// Before the volumes, which pinBinds finds last (no volume may
	// target /dev: backend.Volume.Validate).
	agentBind := specs.Mount{Destination: agentInSandbox, Type: "bind", Source: b.opts.AgentPath, Options: []string{"bind", "ro"}}
	mounts = slices.Insert(mounts, len(mounts)-len(cfg.Volumes), agentBind)
	spec.Mounts = mounts
	if !cfg.ReadOnlyRoot {
		// runsc mounts a tmpfs of its own on an empty /tmp (the
		// sentry's memory, lost at a stop) unless the spec mounts
		// something there. Bound from the writable layer (pinBinds),
		// /tmp is on disk as on the native backend: kept across
		// restarts, and under a disk limit. Before the volumes, which
		// may mount over it.
		tmp := specs.Mount{Destination: "/tmp", Type: "bind", Source: "tmp", Options: []string{"bind", "nosuid", "nodev"}}
		spec.Mounts = slices.Insert(spec.Mounts, len(spec.Mounts)-len(cfg.Volumes), tmp)
	}
	// The namespaces are the sentry's own; the seccomp filter the agent
	// installs for what it starts (the sentry enforces it).
	spec.Linux.Namespaces = []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
	}
	spec.Linux.Seccomp = nil
	spec.Linux.CgroupsPath = b.opts.CgroupPrefix + "/" + cfg.ID
	// The host's pids limit counts the sentry's and gofer's threads and
	// the stub processes that run the sandbox's code, not the sandbox's
	// processes one for one: the sandbox's limit plus the runtime's own.
	if l := spec.Linux.Resources.Pids; l != nil && l.Limit != nil {
		n := *l.Limit + runtimePids
		l.Limit = &n
	}
	spec.Process.Args = []string{agentInSandbox}
	return spec, nil
}

// agentInSandbox is where the agent's binary is in a sandbox: in /dev,
// the sentry's own memory file system, out of the way of the sandbox's
// files (runsc's empty mount point under it in the writable layer is
// hidden by that /dev).
const agentInSandbox = "/dev/.warren-agent"

// agentConfig is the config the agent reads at start.
func agentConfig(b *Backend, cfg backend.Config, spec *specs.Spec) *boot.Config {
	procs := uint32(0)
	if cfg.CPUs > 0 {
		procs = uint32(cfg.CPUs + 0.999)
	}
	return &boot.Config{
		Spec: boot.SpecFrom(spec), SeccompFilter: b.seccomp,
		Python: b.opts.Python, Node: b.opts.Node, User: cfg.Image.User,
		Procs: procs, Prepared: true, ConnsByFD: true, TrustCA: cfg.TrustCA,
	}
}

// Stop implements backend.Sandbox.
func (s *Sandbox) Stop(ctx context.Context) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	return s.release(ctx)
}

// release ends whatever of the sandbox runs and removes its runtime
// state: the container (runsc delete kills the sentry and gofer and
// removes the cgroup it made), the bundle, the root's mount.
func (s *Sandbox) release(ctx context.Context) error {
	s.mu.Lock()
	run, done, ctl, client := s.run, s.done, s.ctl, s.client
	s.run, s.ctl, s.client, s.cg, s.pid = nil, nil, nil, nil, 0
	s.mu.Unlock()
	if client != nil {
		client.Close()
	}
	var errs []error
	// SIGKILL to everything in the sandbox's cgroup first (the sentry,
	// its gofer and stubs): runsc delete would first ask the sentry to
	// end its processes, which waits for as long as the sentry does not
	// answer (stopped, or busy). `runsc run` then sees its sandbox end,
	// removes runsc's state of it and exits; `runsc delete` is left for
	// what it did not remove (it was killed, or there was none: a
	// sandbox an earlier server ran), one runsc process less per stop.
	if cg, err := s.b.cgroups.Open(s.id); err == nil {
		if err := cg.Kill(); err != nil {
			errs = append(errs, err)
		}
	}
	if run != nil {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = run.Process.Kill()
			<-done
		}
	}
	if _, err := os.Stat(s.b.stateFile(s.id)); !errors.Is(err, os.ErrNotExist) {
		if out, err := s.b.runsc(ctx, "delete", "--force", s.id).CombinedOutput(); err != nil && !notExist(out) {
			errs = append(errs, fmt.Errorf("runsc delete: %w: %s", err, strings.TrimSpace(string(out))))
		}
	}
	if ctl != nil {
		_ = ctl.Close()
	}
	// What runsc left (it failed, or a crash came between): the cgroup
	// with anything still in it.
	if err := s.b.cgroups.Destroy(s.id); err != nil {
		errs = append(errs, err)
	}
	if err := s.releaseNet(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.b.runDir(s.id)); err != nil {
		errs = append(errs, err)
	}
	if err := s.b.unpinBinds(s.id); err != nil {
		errs = append(errs, err)
	}
	if err := unmountRoot(filepath.Join(s.b.sandboxDir(s.id), "rootfs")); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// notExist says runsc's output reports a container it does not know.
func notExist(out []byte) bool {
	return strings.Contains(string(out), "does not exist") || strings.Contains(string(out), "not found")
}

// Remove implements backend.Sandbox.
func (s *Sandbox) Remove(ctx context.Context) error {
	if err := s.Stop(ctx); err != nil {
		return err
	}
	return s.b.disk.Remove(s.b.sandboxDir(s.id))
}

// mountRoot mounts the sandbox's overlay root on target.
func mountRoot(target string, lower []string, upper, work string) error {
	if isMounted(target) {
		return nil // a crash between start and stop left it: still the same layers
	}
	opts := "lowerdir=" + strings.Join(lower, ":") + ",upperdir=" + upper + ",workdir=" + work
	if len(opts) >= unix.Getpagesize() {
		return fmt.Errorf("rootfs: overlay options are %d bytes, more than one page", len(opts))
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mount the root's overlay: %w", err)
	}
	return nil
}

// unmountRoot unmounts target if it is mounted.
func unmountRoot(target string) error {
	for isMounted(target) {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("unmount the root: %w", err)
		}
	}
	return nil
}

// isMounted reports whether p is a mount point.
func isMounted(p string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(p, &st) != nil || unix.Lstat(filepath.Dir(p), &parent) != nil {
		return false
	}
	if st.Dev != parent.Dev {
		return true
	}
	// The same device: a bind of the parent's file system, or no mount.
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && unescape(f[4]) == p {
			return true
		}
	}
	return false
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Close releases what the backend holds beside its sandboxes (which it
// leaves as they are): the network namespace runsc bind-mounts into its
// state directory once, for its gofers (stacked, when runsc made it more
// than once concurrently).
func (b *Backend) Close() error {
	p := filepath.Join(b.opts.RunDir, runscState, "null-netns")
	for unix.Unmount(p, unix.MNT_DETACH) == nil {
	}
	// runsc makes the prefix in every hierarchy, beyond those Warren's
	// manager knows, and removes only each sandbox's own below it.
	if own, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, l := range strings.Split(string(own), "\n") {
			f := strings.SplitN(l, ":", 3)
			if len(f) != 3 {
				continue
			}
			ctrl := strings.TrimPrefix(f[1], "name=")
			if ctrl == "" {
				ctrl = "unified"
			}
			_ = unix.Rmdir(filepath.Join("/sys/fs/cgroup", ctrl, f[2], b.opts.CgroupPrefix)) // empty ones only
		}
	}
	return b.cgroups.Close()
}

// Cgroups lists the sandbox cgroups under the backend's prefix (for leak
// checks).
func (b *Backend) Cgroups() ([]string, error) { return b.cgroups.List() }
