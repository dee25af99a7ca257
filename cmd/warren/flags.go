package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/agentbin"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/timerslack"
)

// hostFlags are the flags every command that runs sandboxes shares.
type hostFlags struct {
	dataDir string
	runDir  string
	userNS  string
	ranges  string
	agent   string
	spawner string
	verbose bool
	// diskPool is --disk-pool: "off", "auto" or a size; diskPoolDefault
	// its default, set by the command before register ("" = off: warren
	// run's; warren serve's is auto).
	diskPool        string
	diskPoolDefault string
	// log, when set, replaces the -v text logger (the server logs JSON).
	log *slog.Logger
}

func (h *hostFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.dataDir, "data-dir", envOr("WARREN_DATA_DIR", "/var/lib/warren"), "where sandboxes and images are stored (env WARREN_DATA_DIR)")
	fs.StringVar(&h.runDir, "run-dir", envOr("WARREN_RUN_DIR", "/run/warren"), "where runtime state (agent sockets) lives (env WARREN_RUN_DIR)")
	fs.StringVar(&h.userNS, "userns", "auto", "user namespace: auto (use when the kernel allows), on (require), off")
	fs.StringVar(&h.ranges, "uid-ranges", envOr("WARREN_UID_RANGES", "auto"), "a host uid range of its own for each running sandbox (env WARREN_UID_RANGES):\nauto (where the kernel and the data directory's file system allow: idmapped\nmounts, Linux 6.18), on (require), off (all sandboxes share one range)")
	fs.StringVar(&h.agent, "agent", "", "path of the warren-agent binary (default: embedded, or next to warren; env WARREN_AGENT)")
	fs.StringVar(&h.spawner, "spawner", "", "path of the warren-spawner binary (default: embedded, or next to warren; env WARREN_SPAWNER)")
	def := h.diskPoolDefault
	if def == "" {
		def = "off"
	}
	fs.StringVar(&h.diskPool, "disk-pool", envOr("WARREN_DISK_POOL", def), "disk limits for sandboxes (env WARREN_DISK_POOL): off, auto, or the size of the\nbtrfs image <data-dir>/disk.img made (sparse) and mounted on <data-dir>/sandboxes\nwhen the data directory is not on btrfs, like 100G; auto: half the free space,\nand without limits (said at start) where the image cannot be made or mounted")
	fs.BoolVar(&h.verbose, "v", globals.verbose, "log what happens to stderr")
}

// diskPoolSized reports whether --disk-pool names a size: disk limits the
// operator demands, which a server refuses to start without.
func (h *hostFlags) diskPoolSized() bool {
	return h.diskPool != "" && h.diskPool != "off" && h.diskPool != "auto"
}

// diskPoolBytes is --disk-pool in bytes (0: off).
func (h *hostFlags) diskPoolBytes() (int64, error) {
	switch h.diskPool {
	case "", "off":
		return 0, nil
	case "auto":
		var st unix.Statfs_t
		d := h.dataDir // or the nearest existing directory above it
		for unix.Statfs(d, &st) != nil {
			if d == filepath.Dir(d) {
				return 0, fmt.Errorf("--disk-pool auto: no file system found for %s", h.dataDir)
			}
			d = filepath.Dir(d)
		}
		free := int64(st.Bavail) * st.Bsize //nolint:gosec // G115: a file system's free bytes fit
		return max(free/2, diskquota.MinImageBytes), nil
	}
	n, err := parseSize(h.diskPool)
	if err != nil || n < diskquota.MinImageBytes {
		return 0, fmt.Errorf("--disk-pool %q: want off, auto, or a size of at least %d MiB", h.diskPool, diskquota.MinImageBytes>>20)
	}
	return n, nil
}

// diskOffReason says why a backend has no disk limits: --disk-pool off,
// or the backend's reason.
func diskOffReason(pool, why string) string {
	if why == "" {
		return "--disk-pool " + pool
	}
	return why
}

func (h *hostFlags) logger() *slog.Logger {
	if h.log != nil {
		return h.log
	}
	if !h.verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// backend builds the native backend from the flags and the command's own
// choices in opts (ExitWithHost, Prewarm).
func (h *hostFlags) backend(opts native.Options) (*native.Backend, error) {
	bin := filepath.Join(h.dataDir, "bin")
	agentPath, err := agentbin.Find(h.agent, bin)
	if err != nil {
		return nil, err
	}
	spawnerPath, err := agentbin.FindSpawner(h.spawner, bin)
	if err != nil {
		return nil, err
	}
	opts.DataDir, opts.RunDir, opts.AgentPath, opts.SpawnerPath, opts.UserNS, opts.Logger = h.dataDir, h.runDir, agentPath, spawnerPath, h.userNS, h.logger()
	opts.UIDRanges = h.ranges
	if opts.DiskPool == 0 { // a command's own choice (bench) wins
		if opts.DiskPool, err = h.diskPoolBytes(); err != nil {
			return nil, err
		}
	}
	// A process that runs sandboxes runs with a coarse timer slack (package
	// timerslack says why); what it starts for users gets the usual one.
	if err := timerslack.Coarsen(timerslack.Coarse); err != nil {
		opts.Logger.Debug("timer slack not coarsened, or only in part", "err", err.Error())
	}
	return native.New(opts)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// envBool reads a boolean default from the environment: def when k is
// unset or empty, an error naming k when it is not a boolean.
func envBool(k string, def bool) (bool, error) {
	v := os.Getenv(k)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false", k, v)
	}
	return b, nil
}

// parseSize reads a memory size: plain numbers are MiB; suffixes K, M, G
// (binary, optional "iB"/"B") are accepted.
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1 << 20)
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "M"):
		mult, t = 1<<20, t[:len(t)-1]
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, t[:len(t)-1]
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n < 0 || n*float64(mult) > 1<<50 {
		return 0, fmt.Errorf("size %q: want a number of MiB or a size like 512M or 2G", s)
	}
	return int64(n * float64(mult)), nil
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// parseFlags parses args like fs.Parse (every command parses with it),
// but splits one-letter flags written together as docker users do (-it,
// -ti, -aq: see splitShort), and refuses a flag that takes a value and is
// followed by "--" or by another of fs's flags: the flag package would
// take that as the value (`--net -- CMD` sets the network to "--"), so a
// missing value would surface later as a strange one.
func parseFlags(fs *flag.FlagSet, args []string) error {
	args = splitShort(fs, args)
	isFlag := func(a string) bool {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		return strings.HasPrefix(a, "-") && name != "" && fs.Lookup(name) != nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !isFlag(a) {
			break // the flag package reports what it must
		}
		if strings.Contains(a, "=") || isBoolFlag(fs.Lookup(strings.TrimLeft(a, "-"))) {
			continue
		}
		if i+1 < len(args) && (args[i+1] == "--" || isFlag(args[i+1])) {
			return fmt.Errorf("flag %s needs a value, but is followed by %q", a, args[i+1])
		}
		i++
	}
	return fs.Parse(args)
}

// splitShort returns args with each "-abc" among the flags (those before
// the first argument or "--") written "-a -b -c" when fs has no flag
// "abc" and its first letter is a one-letter boolean flag of fs; a later
// letter fs lacks is then what the flag package refuses, by name.
func splitShort(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			return append(out, args[i:]...)
		}
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(name); f != nil || hasVal || strings.HasPrefix(a, "--") || len(name) < 2 || !isBoolFlag(fs.Lookup(name[:1])) {
			out = append(out, a)
			if f != nil && !hasVal && !isBoolFlag(f) && i+1 < len(args) {
				out, i = append(out, args[i+1]), i+1 // its value
			}
			continue
		}
		for _, c := range name {
			out = append(out, "-"+string(c))
		}
	}
	return out
}

// dockerShort registers docker's one-letter names for fs's flags that
// have them (-e for --env, -w for --workdir, ...), sharing their values:
// docker users type them. Not -v, which is warren's verbose flag.
func dockerShort(fs *flag.FlagSet) {
	for short, long := range map[string]string{"e": "env", "w": "workdir", "u": "user", "m": "memory", "p": "publish", "l": "label"} {
		if f := fs.Lookup(long); f != nil {
			fs.Var(f.Value, short, "short for --"+long)
		}
	}
}

func isBoolFlag(f *flag.Flag) bool {
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
