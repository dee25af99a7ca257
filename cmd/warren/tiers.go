package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/warren-sandbox/warren/internal/agentbin"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/wire"
)

// tierFlags choose the server's isolation tiers: the default one and
// where gVisor's runsc is.
type tierFlags struct {
	isolation string
	runsc     string
}

func (t *tierFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.isolation, "isolation", envOr("WARREN_ISOLATION", "native"), "isolation tier of sandboxes that ask for none (env WARREN_ISOLATION): native (namespaces\nand cgroups) or gvisor (a second kernel, gVisor's runsc; docs/isolation.md#tiers)")
	fs.StringVar(&t.runsc, "runsc", envOr("WARREN_RUNSC", ""), "gVisor's runsc binary for the gvisor tier (env WARREN_RUNSC); default: runsc on $PATH, else the one\nscripts/runsc.sh builds (~/.cache/warren-test); off = no gvisor tier")
}

// validate checks the flags alone (before anything is probed).
func (t *tierFlags) validate() error {
	if !slices.Contains(sandbox.TierNames, t.isolation) {
		return fmt.Errorf("--isolation %q: want native or gvisor", t.isolation)
	}
	if t.isolation == "gvisor" && t.runsc == "off" {
		return errors.New("--isolation gvisor with --runsc off: the default tier would not exist")
	}
	return nil
}

// runscInstall is what an error about a missing runsc tells the operator.
const runscInstall = "install it with scripts/runsc.sh, or name one with --runsc"

// findRunsc returns the runsc binary the flag names or, without one, the
// first found on $PATH or in scripts/runsc.sh's cache.
func findRunsc(flagPath string) (string, error) {
	if flagPath != "" {
		if err := executable(flagPath); err != nil {
			return "", fmt.Errorf("runsc %s: %w; %s", flagPath, err, runscInstall)
		}
		return flagPath, nil
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p, nil
	}
	cache := os.Getenv("WARREN_TEST_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		if home == "" {
			home = "/root"
		}
		cache = filepath.Join(home, ".cache", "warren-test")
	}
	// runsc-<version>: the newest version built, by name (the pinned
	// version strings sort by date).
	ms, _ := filepath.Glob(filepath.Join(cache, "runsc-v*"))
	sort.Sort(sort.Reverse(sort.StringSlice(ms)))
	for _, p := range ms {
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("runsc not found on $PATH nor in %s; %s", cache, runscInstall)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

// probeRunsc checks the binary runs and is a runsc: it answers --version
// (a quick check for every server start; warren doctor starts a sandbox).
func probeRunsc(ctx context.Context, p string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--version").CombinedOutput() //nolint:gosec // the operator's runsc
	if err != nil {
		return fmt.Errorf("runsc %s --version: %w (%s)", p, err, bytes.TrimSpace(out))
	}
	if !bytes.HasPrefix(out, []byte("runsc version")) {
		return fmt.Errorf("runsc %s: --version printed %.60q, not runsc's", p, out)
	}
	return nil
}

// gvisorTier builds the gvisor tier's backend on the host flags'
// directories (<data-dir>/gvisor, <run-dir>/gvisor), its sandboxes
// limited on disk (nil: no disk limits; the server passes the native
// backend's pool, so both tiers share it) and given their links by plumb,
// the network plumbing shared with the native tier (nil: loopback only),
// or says why it cannot run here.
func gvisorTier(ctx context.Context, hf *hostFlags, tf *tierFlags, disk *diskquota.Dirs, plumb *netplumb.Host) (*gvisor.Backend, error) {
	if tf.runsc == "off" {
		return nil, errors.New("turned off (--runsc off)")
	}
	p, err := findRunsc(tf.runsc)
	if err != nil {
		return nil, err
	}
	if err := probeRunsc(ctx, p); err != nil {
		return nil, err
	}
	agentPath, err := agentbin.Find(hf.agent, filepath.Join(hf.dataDir, "bin"))
	if err != nil {
		return nil, err
	}
	return gvisor.New(gvisor.Options{
		// Its run directory starts with a dot: the native backend's
		// reaper takes every other entry of the run directory for one of
		// its sandboxes and deletes it, and this one holds the pins of
		// volume sources (bind mounts) that a recursive delete would
		// descend into.
		DataDir: filepath.Join(hf.dataDir, "gvisor"), RunDir: filepath.Join(hf.runDir, ".gvisor"),
		RunscPath: p, AgentPath: agentPath, Disk: disk, Logger: hf.logger(), Net: plumb,
	})
}

// smokeGvisor starts a gvisor sandbox, runs /bin/true in it and removes
// it: the doctor's check that the tier works here.
func smokeGvisor(ctx context.Context, be *gvisor.Backend) (time.Duration, error) {
	img, err := be.HostImage()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	sb, err := be.Create(ctx, backend.Config{ID: fmt.Sprintf("doctor-gvisor-%d", os.Getpid()), Image: img, MemoryBytes: 256 << 20, CPUs: 1, PidsMax: 64})
	if err != nil {
		return 0, err
	}
	defer func() { _ = sb.Remove(context.WithoutCancel(ctx)) }()
	if err := sb.Start(ctx); err != nil {
		return 0, err
	}
	res, err := backend.Exec(ctx, sb, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil)
	if err != nil {
		return 0, err
	}
	if res.Code != 0 {
		return 0, fmt.Errorf("/bin/true exited %d %s", res.Code, res.Error)
	}
	return time.Since(start), nil
}

// serverTiers are the server's isolation tiers, for sandbox.Options.
type serverTiers struct {
	def       backend.Backend
	defImages sandbox.ImageResolver
	on        map[string]sandbox.Tier
	off       map[string]string
	gv        *gvisor.Backend
}

// isolationTiers sets up the tiers: native always, gvisor where runsc is
// found and answers, the default one as --isolation says. A default tier
// that cannot run here stops the server; another one is listed as off,
// with why, and refused to whoever asks for it.
func (c *serveConfig) isolationTiers(ctx context.Context, nat *native.Backend, plumb *netplumb.Host, res *image.Resolver, log *slog.Logger) (*serverTiers, error) {
	t := &serverTiers{on: map[string]sandbox.Tier{"native": {Backend: nat, Images: res.Resolve}}, off: map[string]string{}}
	gv, err := gvisorTier(ctx, &c.hf, &c.tiers, nat.DiskDirs(), plumb)
	switch {
	case err != nil && c.tiers.isolation == "gvisor":
		return nil, fmt.Errorf("--isolation gvisor: the gvisor tier cannot run here: %w", err)
	case err != nil:
		t.off["gvisor"] = "gvisor: " + err.Error()
		log.Info("isolation tier off", "tier", "gvisor", "reason", err.Error())
	default:
		// gVisor's host image is its own (root's files, served by its
		// gofer); stored images are shared.
		gres := *res
		gres.Host = gv.HostImage
		t.gv = gv
		t.on["gvisor"] = sandbox.Tier{Backend: gv, Images: gres.Resolve}
	}
	d := t.on[c.tiers.isolation]
	t.def, t.defImages = d.Backend, d.Images
	log.Info("isolation tiers", "default", c.tiers.isolation, "gvisor", t.gv != nil)
	return t, nil
}

// close ends the gvisor tier's sandboxes with the server (a server that
// starts next cannot reach their agents: Capabilities.Reattach) and
// releases what the backend holds. Their files stay, for a restart.
func (t *serverTiers) close() {
	if t.gv == nil {
		return
	}
	_, _ = t.gv.ReapOrphans(nil)
	_ = t.gv.Close()
}

// doctorGvisor checks the gvisor tier end to end: runsc found and
// answering, then a sandbox started and /bin/true run in it.
func doctorGvisor(ctx context.Context, hf *hostFlags, tf *tierFlags) error {
	gv, err := gvisorTier(ctx, hf, tf, nil, nil)
	if err != nil {
		return fmt.Errorf("does not work here: %w", err)
	}
	defer func() { _ = gv.Close() }()
	if _, err := smokeGvisor(ctx, gv); err != nil {
		return fmt.Errorf("does not work here: runsc found, but a sandbox did not run: %w", err)
	}
	return nil
}
