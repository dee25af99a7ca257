package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/mcp"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/rpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/secrets"
	"github.com/warren-sandbox/warren/internal/workspace"
)

const serveAbout = `
Serves the microsandbox-compatible JSON-RPC API (POST /api/v1/rpc), Warren's
extended methods, WebSocket streams (/api/v1/ws), MCP (/mcp), Prometheus
metrics (/metrics) and a health route (/api/v1/health).

Every request needs an API key ('warren key create') unless --dev is given.
The key-signing secret is created on first start in the data directory
(secret.key, mode 0600).

An image a sandbox starts with that the store lacks is pulled from its
registry (--pull, on by default), from public addresses only, anonymously.

Every API call, run, egress decision, refusal, key change and sandbox's
usage is recorded in a tamper-evident audit log (<data dir>/audit; read it
with 'warren audit'). A server that cannot write it refuses requests.

Sandboxes keep running when the server stops; the next 'warren serve' on
the same data directory reattaches to them and removes what it does not
know. Logs are JSON lines on stderr.

With --config FILE the server reads its settings and the namespaces'
quotas from a TOML file (docs/policy.md, docs/warren.example.toml); SIGHUP
reloads the quotas.

Examples:
  warren serve --dev
  warren serve --listen 0.0.0.0:5555 --idle-timeout 5m
  warren serve --config /etc/warren/warren.toml
  warren serve --cluster ~/.kube/config --node-name node-a   # node mode (docs/kubernetes.md)`

// serveConfig is everything serve needs, from flags.
type serveConfig struct {
	hf               hostFlags
	net              netFlags
	tiers            tierFlags
	cluster          clusterFlags
	listen           string
	dev              bool
	prewarm          int
	idleTimeout      time.Duration
	idleAction       string
	maxLifetime      time.Duration
	stoppedRetention time.Duration
	maxSandboxes     int
	maxRunning       int
	pythonImage      string
	nodeImage        string
	logText          bool
	volumeRoots      stringList
	maxTarDownload   string
	// disk is each sandbox's disk limit unless it asks for one, when the
	// backend has disk limits (--disk-pool).
	disk        string
	pull        bool
	pullMaxSize string
	pullTimeout time.Duration
	maxOutput   string
	// The caps per sandbox and the admission's CPU factor; "auto" =
	// derived from the host (sandbox.Host.Limits).
	maxMemory     string
	maxCPUs       string
	pids          string
	openFiles     string
	cpuOvercommit string
	// keepFileMax keeps fs.file-max even when it is below what the
	// sandboxes' memory can hold open.
	keepFileMax bool
	// keepKernelLimits keeps kernel.pid_max and kernel.pty.max even when
	// --max-running sandboxes' pids and terminals do not fit them.
	keepKernelLimits bool
	// configPath is --config; policy is its live part (serveconfig.go),
	// nil without a file.
	configPath string
	policy     *livePolicy
	// The audit log (internal/audit): on unless audit is false, in
	// auditDir (default <data dir>/audit).
	audit              bool
	auditDir           string
	auditCheckpointing time.Duration
}

func serveCmd(ctx context.Context, args []string) error {
	var c serveConfig
	fs, err := c.flagSet()
	if err != nil {
		return err
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	if err := c.applyConfig(fs); err != nil {
		return err
	}
	return serve(ctx, &c)
}

// flagSet registers serve's flags on a new flag set.
func (c *serveConfig) flagSet() (*flag.FlagSet, error) {
	fs := newFlagSet("warren serve", "warren serve [flags]", serveAbout)
	fs.StringVar(&c.configPath, "config", envOr("WARREN_CONFIG", ""), "configuration file (TOML; env WARREN_CONFIG; docs/policy.md): its [server] keys set these flags\n(a flag given here wins), its namespaces get quotas; SIGHUP reloads it")
	c.hf.diskPoolDefault = "auto" // disk limits on wherever they can be
	c.hf.register(fs)
	c.net.register(fs)
	c.tiers.register(fs)
	c.cluster.register(fs)
	fs.StringVar(&c.listen, "listen", envOr("WARREN_LISTEN", "127.0.0.1:5555"), "address to listen on (env WARREN_LISTEN)")
	fs.BoolVar(&c.dev, "dev", false, "development mode: no API keys needed, every caller may use every namespace")
	fs.IntVar(&c.prewarm, "prewarm", 2, "agents kept spawned ahead of time so starts are faster (0 = none)")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", sandbox.DefaultIdleTimeout, "stop a sandbox after this long without requests (per-sandbox override: idle_timeout)")
	fs.StringVar(&c.idleAction, "idle-action", sandbox.IdleStop, "what the idle timeout does: stop, or pause (memory kept, no CPU; per-sandbox override: idle_action)")
	fs.DurationVar(&c.maxLifetime, "max-lifetime", sandbox.DefaultMaxLifetime, "stop a sandbox this long after it started (per-sandbox override: max_lifetime)")
	fs.DurationVar(&c.stoppedRetention, "stopped-retention", sandbox.DefaultStoppedRetention, "remove stopped sandboxes (and their files) after this long; negative = keep")
	fs.IntVar(&c.maxSandboxes, "max-sandboxes", sandbox.DefaultMaxSandboxes, "sandboxes this server holds at most, stopped ones included")
	fs.IntVar(&c.maxRunning, "max-running", sandbox.DefaultMaxRunning, "sandboxes running at once at most")
	fs.StringVar(&c.pythonImage, "python-image", envOr("WARREN_PYTHON_IMAGE", image.HostName), "image for the language names python, python3, microsandbox/python;\nhost = the host image with python, python3 and pip")
	fs.StringVar(&c.nodeImage, "node-image", envOr("WARREN_NODE_IMAGE", image.HostName), "image for the language names node, nodejs, javascript, microsandbox/node;\nhost = the host image with node and npm")
	fs.BoolVar(&c.logText, "log-text", false, "log human-readable text instead of JSON")
	fs.Var(&c.volumeRoots, "volume-root", "allow sandbox.start volumes from beneath this host directory (repeatable; env WARREN_VOLUME_ROOTS,\ncolon-separated); without it volumes are refused. Sandbox root writes there as host uid 1610612736")
	fs.StringVar(&c.disk, "disk", envOr("WARREN_DISK", "10G"), "disk limit of each sandbox that asks for none (disk_mib), its files and /tmp together, when disk\nlimits are on (--disk-pool): a size like 10G (env WARREN_DISK); 0 = none. The configuration's [defaults] disk wins")
	fs.StringVar(&c.maxTarDownload, "max-tar-download", "1G", "largest tar stream one download sends: a size like 512M or 2G (plain numbers are MiB)")
	pull, err := envBool("WARREN_PULL", true)
	if err != nil {
		return nil, err
	}
	fs.BoolVar(&c.pull, "pull", pull, "pull an image the store lacks when a sandbox starts with it, as microsandbox does (env WARREN_PULL);\nanonymously, bounded by --pull-max-size and --pull-timeout. --pull=false refuses such starts")
	fs.StringVar(&c.pullMaxSize, "pull-max-size", "8G", "largest image (unpacked bytes) one such pull may fetch: a size like 512M or 8G")
	fs.DurationVar(&c.pullTimeout, "pull-timeout", image.DefaultPullTimeout, "longest one such pull may take")
	fs.StringVar(&c.maxOutput, "max-output", envOr("WARREN_MAX_OUTPUT", "64M"), "output one sandbox.command.run or sandbox.repl.run returns at most, 1M to 1G (REPL runs: at most 64M;\nplain numbers are MiB; env WARREN_MAX_OUTPUT); beyond it the output is cut, saying so")
	fs.StringVar(&c.maxMemory, "max-memory", envOr("WARREN_MAX_MEMORY", "auto"), "memory one sandbox may ask for at most: a size like 4G (env WARREN_MAX_MEMORY);\nauto = a quarter of the host's memory less its reserve. A start asking for more is refused")
	fs.StringVar(&c.maxCPUs, "max-cpus", envOr("WARREN_MAX_CPUS", "auto"), "CPUs one sandbox may ask for at most (env WARREN_MAX_CPUS); auto = the host's CPUs")
	fs.StringVar(&c.pids, "pids", envOr("WARREN_PIDS", strconv.Itoa(backend.DefaultPids)), "processes and threads each sandbox may run (env WARREN_PIDS)")
	fs.StringVar(&c.openFiles, "open-files", envOr("WARREN_OPEN_FILES", "auto"), "open files (RLIMIT_NOFILE) of each sandbox process (env WARREN_OPEN_FILES);\nauto = the host's fs.file-max per pid, 128 to 1024")
	fs.StringVar(&c.cpuOvercommit, "cpu-overcommit", envOr("WARREN_CPU_OVERCOMMIT", strconv.Itoa(sandbox.DefaultCPUOvercommit)), "CPUs granted to running sandboxes together, as a multiple of the host's (env WARREN_CPU_OVERCOMMIT)")
	keepFileMax, err := envBool("WARREN_KEEP_FILE_MAX", false)
	if err != nil {
		return nil, err
	}
	fs.BoolVar(&c.keepFileMax, "keep-file-max", keepFileMax, "keep the host's fs.file-max when it is below what the sandboxes' memory can hold open (env WARREN_KEEP_FILE_MAX);\nwithout it the server raises fs.file-max at start to the host's memory over "+strconv.Itoa(sandbox.FileBytes)+" bytes")
	keepKernelLimits, err := envBool("WARREN_KEEP_KERNEL_LIMITS", false)
	if err != nil {
		return nil, err
	}
	fs.BoolVar(&c.keepKernelLimits, "keep-kernel-limits", keepKernelLimits, "keep the host's kernel.pid_max and kernel.pty.max when they are below what --max-running\nsandboxes' pids and terminals need (env WARREN_KEEP_KERNEL_LIMITS); without it the server raises\nthem at start (with an eighth for the host); with it, starts are refused on pids or ptys\nbefore --max-running is reached")
	auditOn, err := envBool("WARREN_AUDIT", true)
	if err != nil {
		return nil, err
	}
	fs.BoolVar(&c.audit, "audit", auditOn, "write the tamper-evident audit log: every call, run, egress decision, refusal, key change and usage (env WARREN_AUDIT;\n'warren audit' reads it). A server that cannot write it refuses requests")
	fs.StringVar(&c.auditDir, "audit-dir", envOr("WARREN_AUDIT_DIR", ""), "the audit log's directory (default <data dir>/audit; env WARREN_AUDIT_DIR)")
	fs.DurationVar(&c.auditCheckpointing, "audit-checkpoint-interval", time.Minute, "sign a checkpoint of the audit log this often while records come (and every 10000 records, and at shutdown)")
	return fs, nil
}

// logger writes to w (stderr behind the secrets scrubber).
func (c *serveConfig) logger(w io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if c.hf.verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.logText {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func serve(ctx context.Context, c *serveConfig) error {
	// Knows every secret value read at a start, and replaces any in the
	// log and the audit log (defence in depth: none is put there).
	scrub := secrets.NewScrubber()
	log := c.logger(scrub.Writer(os.Stderr))
	if c.policy != nil {
		// SIGHUP reloads the file; without one, SIGHUP keeps its default
		// (it ends the server, as before).
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for {
				select {
				case <-hup:
					_ = c.policy.reload(log)
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	maxTar, err := parseSize(c.maxTarDownload)
	if err != nil || maxTar <= 0 {
		return fmt.Errorf("--max-tar-download %q: want a positive size like 512M or 2G (plain numbers are MiB)", c.maxTarDownload)
	}
	pullMax, err := parseSize(c.pullMaxSize)
	if err != nil || pullMax <= 0 {
		return fmt.Errorf("--pull-max-size %q: want a positive size like 512M or 8G (plain numbers are MiB)", c.pullMaxSize)
	}
	if c.pullTimeout <= 0 {
		return fmt.Errorf("--pull-timeout %s: want a positive duration", c.pullTimeout)
	}
	maxOut, err := parseSize(c.maxOutput)
	if err != nil || maxOut < rpc.MinMaxOutput || maxOut > rpc.MaxMaxOutput {
		return fmt.Errorf("--max-output %q: want a size from 1M to 1G (plain numbers are MiB)", c.maxOutput)
	}
	if err := c.tiers.validate(); err != nil {
		return err
	}
	if _, err := c.cluster.validate(); err != nil {
		return err
	}
	host, err := sandbox.ReadHost()
	if err != nil {
		return err
	}
	if _, _, err := c.admission(host); err != nil {
		return err
	}
	roots, err := volumeRoots(append(filepath.SplitList(os.Getenv("WARREN_VOLUME_ROOTS")), c.volumeRoots...))
	if err != nil {
		return err
	}
	unlock, err := lockServe(c.hf.dataDir, c.hf.runDir)
	if err != nil {
		return err
	}
	defer unlock()
	// The data directory is this server's: now the host's table of open
	// files may be made fit, and the capacity read from it.
	if host.FileMax, err = c.fileMax(log, host); err != nil {
		return err
	}
	// The flags first (the pids per sandbox), then the kernel's tables
	// made to fit them, then the capacity read from those.
	limits, _, err := c.admission(host)
	if err != nil {
		return err
	}
	if host, err = c.kernelLimits(log, host, limits.Pids); err != nil {
		return err
	}
	limits, capacity, err := c.admission(host)
	if err != nil {
		return err
	}
	auditLog, err := c.openAudit(scrub)
	if err != nil {
		return err
	}
	if auditLog != nil {
		// Deferred before everything that records, so closed after it: the
		// final checkpoint signs the last record.
		defer func() {
			if err := auditLog.Close(); err != nil {
				log.Error("close the audit log", "err", err)
			}
		}()
		if c.policy != nil {
			rec := func(accepted bool, problems []string) {
				err := auditLog.Append(&audit.Record{Kind: audit.KindConfig, Config: &audit.Config{Accepted: accepted, Path: c.policy.path, Problems: problems}})
				if err != nil {
					log.Error("audit: config record", "err", err.Error())
				}
			}
			rec(true, nil) // the file the server starts with
			c.policy.recorder.Store(&rec)
		}
	}
	c.hf.log = log // the backend logs into the server's log
	publish, err := c.net.publishAddress()
	if err != nil {
		return err
	}
	nw, err := c.net.start(c.hf.runDir, log)
	if err != nil {
		return err
	}
	nopts := native.Options{Prewarm: c.prewarm}
	var egressReg *egress.Registry
	var mgr *sandbox.Manager // set below; the network's table goes with the server when no sandbox outlives it
	if nw != nil {
		defer func() {
			if mgr != nil && mgr.Running() == 0 {
				_ = nw.CloseAndRemove()
				return
			}
			_ = nw.Close()
		}()
		nopts.Net, egressReg = nw.Plumb, nw.Registry
	}
	be, err := c.hf.backend(nopts)
	if err != nil {
		return err
	}
	defer func() { _ = be.Close() }()
	diskDefault, err := parseSize(c.disk)
	if err != nil || diskDefault < 0 {
		return fmt.Errorf("--disk %q: want a size like 10G, or 0 for none", c.disk)
	}
	if be.DiskLimits() == "" {
		diskDefault = 0 // nothing to enforce it: the warning below says so
		if c.hf.diskPoolSized() {
			return fmt.Errorf("--disk-pool %s: disk limits are not possible here: %s", c.hf.diskPool, be.DiskLimitsOff())
		}
		if where := c.policy.diskSetting(); where != "" {
			return fmt.Errorf("the configuration sets a disk limit (%s), but this server has no disk limits (%s): fix that or remove it", where, diskOffReason(c.hf.diskPool, be.DiskLimitsOff()))
		}
		if why := be.DiskLimitsOff(); why != "" {
			log.Error("DISK LIMITS OFF: --disk-pool auto could not prepare the disk pool; sandboxes can fill the data directory's file system (docs/policy.md#disk-limits)", "reason", why)
		} else {
			log.Warn("sandboxes have no disk limit (--disk-pool off): one can fill the data directory's file system (docs/policy.md#disk-limits)")
		}
	}
	imgs, db, err := c.hf.imageStore()
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	secret, err := auth.LoadOrCreateSecret(filepath.Join(c.hf.dataDir, "secret.key"))
	if err != nil {
		return err
	}
	signer, err := auth.NewSigner(secret)
	if err != nil {
		return err
	}
	var keys *auth.Keys
	if !c.dev {
		keys = auth.NewKeys(signer, db.DB())
	}
	reg := metrics.NewRegistry()
	if nw != nil {
		nw.Register(reg)
	}
	res := &image.Resolver{Host: be.HostImage, Store: imgs, Python: c.pythonImage, Node: c.nodeImage}
	if c.pull {
		res.OnDemand = &image.OnDemand{MaxBytes: pullMax, Timeout: c.pullTimeout, Logger: log}
	}
	tiers, err := c.isolationTiers(ctx, be, nopts.Net, res, log)
	if err != nil {
		return err
	}
	defer tiers.close()
	secretStore, err := c.policy.secretStore()
	if err != nil {
		return err
	}
	secretStore.ScrubWith(scrub)
	wss, err := c.workspaces(ctx, be, log)
	if err != nil {
		return err
	}
	mopts := sandbox.Options{
		Backend: tiers.def, Tiers: tiers.on, TiersOff: tiers.off, DB: db.DB(), Images: tiers.defImages, Pull: res.Pull,
		LogDir: filepath.Join(c.hf.dataDir, "logs"), SnapshotDir: filepath.Join(c.hf.dataDir, "snapshots"), Logger: log,
		IdleTimeout: c.idleTimeout, IdleAction: c.idleAction, MaxLifetime: c.maxLifetime, StoppedRetention: c.stoppedRetention,
		MaxSandboxes: c.maxSandboxes, MaxRunning: c.maxRunning, VolumeRoots: roots,
		Limits: limits, Capacity: capacity, Egress: egressReg, PublishAddress: publish,
		Secrets: secretStore, SecretsDir: filepath.Join(c.hf.runDir, "secrets"),
		Audit: auditor(auditLog), DiskBytes: diskDefault, Workspaces: wss,
	}
	if c.policy != nil {
		mopts.Policy, mopts.Namespaces = c.policy.Policy, c.policy.Namespaces
		log.Info("config loaded", "path", c.configPath, "namespaces", len(c.policy.boot.Namespaces))
		for _, k := range c.policy.overridden {
			log.Info("config: a command-line flag wins over the file's setting", "key", "server."+k)
		}
	}
	mgr, err = sandbox.New(ctx, mopts)
	if err != nil {
		return err
	}
	defer mgr.Close()
	ropts := rpc.Options{Manager: mgr, Images: imgs, Keys: keys, Dev: c.dev, Logger: log, Metrics: reg, MaxTarDownload: maxTar, MaxOutput: maxOut, Workspaces: wss}
	if auditLog != nil {
		ropts.Audit = auditLog
	}
	api, err := rpc.New(ropts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           routes(api, mcp.Handler(api, log)),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	node, err := c.cluster.registrar(log, ln.Addr().String(), capacity, c.maxRunning, tierNames(c.tiers.isolation, tiers.on))
	if err != nil {
		_ = ln.Close()
		return err
	}
	if node != nil {
		leave, err := joinCluster(ctx, node)
		if err != nil {
			_ = ln.Close()
			return err
		}
		// Stops renewing first at shutdown: the Lease then expires on its
		// own unless the node comes back (kube.Registrar says why).
		defer leave()
		log.Info("registered with the cluster", "node", node.Node, "namespace", node.Namespace, "lease_duration", c.cluster.lease.String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "dev", c.dev, "data_dir", c.hf.dataDir,
		"python_image", c.pythonImage, "node_image", c.nodeImage, "pull_on_demand", c.pull, "network", nw != nil)
	log.Info("sandbox limits", "max_memory_mib", limits.MaxMemoryMiB, "max_cpus", limits.MaxCPUs, "pids", limits.Pids, "open_files", limits.OpenFiles,
		"capacity_memory_mib", capacity.MemoryBytes>>20, "capacity_cpus", capacity.CPUs, "capacity_pids", capacity.Pids,
		"capacity_ptys", capacity.Ptys, "capacity_open_files", capacity.Files)
	if c.dev {
		log.Warn("dev mode: no API key is needed; anyone who can reach " + ln.Addr().String() + " can run code")
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down; sandboxes keep running and are reattached on the next start")
	api.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// fileMax makes fs.file-max at least what all the host's memory, were it
// sandboxes' holding open files, could hold (sandbox.FileMaxNeeded), and
// returns its value. A sandbox's files are charged to its memory cgroup,
// so its memory limit bounds them, however they are held; but the kernel
// refuses a file to everyone without CAP_SYS_ADMIN (every sandbox, and
// unprivileged host users) once fs.file-max files are open on the whole
// host, which the boot default (a file per 10 KiB of memory) lets a few
// sandboxes reach. Raising it costs nothing until files are open. With
// --keep-file-max the server only warns.
func (c *serveConfig) fileMax(log *slog.Logger, h sandbox.Host) (int64, error) {
	need := h.FileMaxNeeded()
	switch {
	case h.FileMax >= need:
		return h.FileMax, nil
	case c.keepFileMax:
		log.Warn("fs.file-max is below what sandboxes' memory can hold open (RLIMIT_NOFILE does not bound files mapped and closed): "+
			"a few sandboxes can take the open files of every other and of unprivileged host users; raise it with sysctl -w fs.file-max="+strconv.FormatInt(need, 10)+
			" (--keep-file-max is set, so the server does not)", "file_max", h.FileMax)
		return h.FileMax, nil
	}
	if err := sandbox.SetFileMax(need); err != nil {
		return 0, fmt.Errorf("fs.file-max %d is below what sandboxes' memory can hold open, %d, and raising it failed: %w "+
			"(set it with sysctl -w fs.file-max=%d, or start with --keep-file-max to keep it, and let a few sandboxes take the host's open files)", h.FileMax, need, err, need)
	}
	log.Info("raised fs.file-max to what sandboxes' memory can hold open", "old", h.FileMax, "new", need)
	return need, nil
}

// kernelLimits makes kernel.pty.max and kernel.pid_max hold every
// terminal and pid --max-running sandboxes may take (each devpts instance
// is capped at oci.MaxPtys, each sandbox at --pids and its agent's
// backend.AgentPids) with the host's reserve left, and returns the host's
// figures as they then are. Below them the admission control refuses
// starts on ptys or pids long before --max-running: the boot defaults
// (4096 ptys, pid_max 32768) hold 168 and 179 sandboxes of 32 pids. A
// terminal's and a task's kernel memory are charged to the memory cgroup
// of the sandbox that makes them, so the raise costs nothing until they
// are used; kernel.threads-max, which the kernel sizes by memory, still
// bounds the pids and is left as it is. With --keep-kernel-limits the
// server only warns.
func (c *serveConfig) kernelLimits(log *slog.Logger, h sandbox.Host, pids int64) (sandbox.Host, error) {
	needPtys, needPids := sandbox.PtysNeeded(c.maxRunning), sandbox.PidsNeeded(c.maxRunning, pids)
	if h.Ptys >= needPtys && h.Pids >= needPids {
		return h, nil
	}
	if c.keepKernelLimits {
		log.Warn("kernel.pty.max or kernel.pid_max is below what --max-running sandboxes need: starts will be refused on ptys or pids before --max-running is reached"+
			" (--keep-kernel-limits is set, so the server does not raise them)", "ptys", h.Ptys, "need_ptys", needPtys, "pids", h.Pids, "need_pids", needPids, "max_running", c.maxRunning)
		return h, nil
	}
	if h.Ptys < needPtys {
		n, err := sandbox.SetPtyMax(needPtys)
		if err != nil {
			return h, fmt.Errorf("kernel.pty.max is below what %d running sandboxes' terminals need, and raising it failed: %w "+
				"(lower --max-running, or start with --keep-kernel-limits and have starts refused on ptys)", c.maxRunning, err)
		}
		log.Info("raised kernel.pty.max to what --max-running sandboxes' terminals need", "max_running", c.maxRunning, "new", n)
	}
	if h.Pids < needPids {
		pidMax, err := readSysctl("kernel/pid_max")
		if err != nil {
			return h, err
		}
		if pidMax < min(needPids, sandbox.MaxPidMax) {
			n, err := sandbox.SetPidMax(needPids)
			if err != nil {
				return h, fmt.Errorf("kernel.pid_max is below what %d running sandboxes of %d pids need, and raising it failed: %w "+
					"(lower --max-running or --pids, or start with --keep-kernel-limits and have starts refused on pids)", c.maxRunning, pids, err)
			}
			log.Info("raised kernel.pid_max to what --max-running sandboxes' pids need", "max_running", c.maxRunning, "pids", pids, "new", n)
		}
	}
	nh, err := sandbox.ReadHost()
	if err != nil {
		return h, err
	}
	h.Ptys, h.Pids = nh.Ptys, nh.Pids
	if h.Pids < needPids {
		log.Info("kernel.threads-max bounds the sandboxes' pids below --max-running", "pids_capacity", h.Pids-h.Pids/sandbox.HostReserve, "sandboxes", (h.Pids-h.Pids/sandbox.HostReserve)/(pids+backend.AgentPids))
	}
	return h, nil
}

// readSysctl reads the number in /proc/sys/name.
func readSysctl(name string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name)) //nolint:gosec // G304: fixed names under /proc/sys
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// admission is the caps per sandbox and the capacity of all running
// sandboxes, from the flags and the host's figures.
func (c *serveConfig) admission(h sandbox.Host) (sandbox.Limits, sandbox.Capacity, error) {
	l := h.Limits()
	var errs []error
	if c.maxMemory != "auto" {
		n, err := parseSize(c.maxMemory)
		if err != nil || n < backend.MinMemoryBytes || n>>20 > sandbox.MaxMemoryMiB {
			errs = append(errs, fmt.Errorf("--max-memory %q: want auto or a size from %dM to %dG (plain numbers are MiB)", c.maxMemory, backend.MinMemoryBytes>>20, sandbox.MaxMemoryMiB>>10))
		}
		l.MaxMemoryMiB = n >> 20
	}
	if c.maxCPUs != "auto" {
		n, err := strconv.ParseFloat(c.maxCPUs, 64)
		if err != nil || !(n >= backend.MinCPUs && n <= sandbox.MaxCPUs) {
			errs = append(errs, fmt.Errorf("--max-cpus %q: want auto or %v to %d", c.maxCPUs, backend.MinCPUs, sandbox.MaxCPUs))
		}
		l.MaxCPUs = n
	}
	pids, err := strconv.ParseInt(c.pids, 10, 64)
	if err != nil || pids < backend.MinPids || pids > h.Pids {
		errs = append(errs, fmt.Errorf("--pids %q: want %d up to the host's pid_max, %d", c.pids, backend.MinPids, h.Pids))
	}
	l.Pids = pids
	if c.openFiles != "auto" {
		n, err := strconv.ParseInt(c.openFiles, 10, 64)
		if err != nil || n < 64 || n > h.NrOpen {
			errs = append(errs, fmt.Errorf("--open-files %q: want auto or 64 up to the host's fs.nr_open, %d", c.openFiles, h.NrOpen))
		}
		l.OpenFiles = n
	}
	over, err := strconv.ParseFloat(c.cpuOvercommit, 64)
	if err != nil || !(over >= 0.1 && over <= 1000) {
		errs = append(errs, fmt.Errorf("--cpu-overcommit %q: want a factor from 0.1 to 1000", c.cpuOvercommit))
	}
	return l, h.Capacity(over), errors.Join(errs...)
}

// volumeRoots resolves --volume-root directories to symlink-free absolute
// paths, which is what the policy check compares against.
func volumeRoots(dirs []string) ([]string, error) {
	var out []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		abs, err := filepath.Abs(d)
		if err == nil {
			abs, err = filepath.EvalSymlinks(abs)
		}
		if err != nil {
			return nil, fmt.Errorf("--volume-root %s: %w", d, err)
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--volume-root %s: not a directory", d)
		}
		out = append(out, abs)
	}
	return out, nil
}

// routes is the server's whole HTTP surface: the API, and MCP at /mcp
// behind the API's front door (request id, access log, API key).
func routes(api *rpc.Server, mcpHandler http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", api.Handler())
	mux.Handle("/mcp", api.Authenticated(mcpHandler))
	return mux
}

// openAudit opens the audit log, unless --audit=false.
func (c *serveConfig) openAudit(scrub *secrets.Scrubber) (*audit.Log, error) {
	if !c.audit {
		return nil, nil
	}
	dir := c.auditDir
	if dir == "" {
		dir = filepath.Join(c.hf.dataDir, "audit")
	}
	if c.auditCheckpointing <= 0 {
		return nil, fmt.Errorf("--audit-checkpoint-interval %s: want a positive duration", c.auditCheckpointing)
	}
	return audit.Open(audit.Options{Dir: dir, CheckpointInterval: c.auditCheckpointing, Redact: scrub.ScrubJSON})
}

// auditor is l as the manager's Auditor: nil stays an untyped nil.
func auditor(l *audit.Log) sandbox.Auditor {
	if l == nil {
		return nil
	}
	return l
}

// workspaces is the server's workspace manager: the local store under the
// data directory, the configuration's stores, each namespace's store and
// quota from its policy.
func (c *serveConfig) workspaces(ctx context.Context, be *native.Backend, log *slog.Logger) (*workspace.Manager, error) {
	stores, err := c.policy.workspaceStores(ctx, c.hf.dataDir)
	if err != nil {
		return nil, err
	}
	uid, gid := be.RootIDs()
	opts := workspace.Options{Root: filepath.Join(c.hf.dataDir, "workspaces"), Stores: stores, UID: uid, GID: gid, Logger: log,
		Pool: be.WorkspacePool()} // new workspaces kernel-limited with disk limits on
	if c.policy != nil {
		opts.Namespace = c.policy.workspaceOf
	}
	return workspace.New(opts)
}
