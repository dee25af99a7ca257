package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/bench"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/timerslack"
)

const benchAbout = `
Measures, in one run and as medians, what Warren promises to be fast, next
to baselines run at the same time on the same machine:

  fork+exec of /bin/true               the floor for any sandbox
  warren cold create -> exec -> destroy  vs bubblewrap and crun (when installed);
                                       the same from a pool of pre-spawned agents,
                                       with a uid range per sandbox vs one shared,
                                       and from a stored image vs the host image
                                       and with networking on vs off, cold and pooled,
                                       and with a disk limit vs none
  exec /bin/true in a running sandbox  through the agent
  python3 -c 'print(1)'                in a sandbox vs on the host
  REPL 1+1 round trip                  warm Python interpreter
  idle agent memory                    resident set of warren-agent

Ratios are against the baseline of the same run; the machine may be noisy,
so compare ratios, not absolute numbers, across runs.

'warren bench --compare' puts Warren beside every other runtime installed
here, whole processes included, and prints others' published figures
(labelled as such).

'warren bench soak' runs many clients over a server's API for minutes and
checks that nothing fails, grows or is left behind (see its --help).

'warren bench density' starts up to 1000 idle sandboxes on a server and
measures the memory each costs and start and exec latency as they pile up.`

// benchBackends opens what bench and bench --compare both measure: a
// backend whose sandboxes start cold, one with a warm pool of two (what a
// daemon uses), and the host's image; closeAll closes both.
func (h *hostFlags) benchBackends() (cold, pooled *native.Backend, img *image.Image, closeAll func(), err error) {
	if cold, err = h.backend(native.Options{ExitWithHost: true}); err != nil {
		return nil, nil, nil, nil, err
	}
	if pooled, err = h.backend(native.Options{ExitWithHost: true, Prewarm: 2}); err != nil {
		_ = cold.Close()
		return nil, nil, nil, nil, err
	}
	closeAll = func() { _ = cold.Close(); _ = pooled.Close() }
	_, _ = cold.ReapOrphans(nil)
	if img, err = cold.HostImage(); err != nil {
		closeAll()
		return nil, nil, nil, nil, err
	}
	return cold, pooled, img, closeAll, nil
}

func benchCmd(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "soak" {
		return soakCmd(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "density" {
		return densityCmd(ctx, args[1:])
	}
	fs := newFlagSet("warren bench", "warren bench [flags] | warren bench soak|density [flags]", benchAbout)
	var hf hostFlags
	hf.register(fs)
	n := fs.Int("n", 200, "iterations per measurement (python: n/4)")
	compare := fs.Bool("compare", false, "instead: run /bin/true in a fresh sandbox every way this host has (warren native cold, pooled\nand as a whole warren run; warren gvisor; bubblewrap, crun, runc, runsc, podman where installed),\ninterleaved, with medians, p99 and ratios to fork+exec; -n rounds")
	runsc := fs.String("runsc", "", "with --compare: the runsc binary (default: runsc in PATH)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *n < 5 || *n > 100000 {
		return fmt.Errorf("-n %d: want 5..100000", *n)
	}
	if *compare {
		return benchCompare(ctx, hf, *n, *runsc)
	}
	be, pooled, img, closeAll, err := hf.benchBackends()
	if err != nil {
		return err
	}
	defer closeAll()
	env := &bench.Env{Backend: be, Image: img, HostPid: func(sb backend.Sandbox) int { return sb.(*native.Sandbox).Pid() }}
	tmp, err := os.MkdirTemp("", "warren-bench-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measurement\tmedian\tratio\tbaseline")
	row := func(name string, d time.Duration, ratioTo time.Duration, base string) {
		r := ""
		if ratioTo > 0 {
			r = fmt.Sprintf("%.2fx", float64(d)/float64(ratioTo))
		}
		fmt.Fprintf(tw, "%s\t%.3f ms\t%s\t%s\n", name, float64(d.Microseconds())/1000, r, base)
	}
	measure := func(name string, iters int, f func() error) (time.Duration, error) {
		fmt.Fprintf(os.Stderr, "measuring %s (%d runs)...\n", name, iters)
		ds, err := bench.Sample(iters, f)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		return bench.Median(ds), nil
	}
	// The baselines run as any process of the host would: with its usual
	// timer slack, not warren's coarse one (package timerslack).
	baseline := func(name string, iters int, f func() error) (time.Duration, error) {
		defer timerslack.UseOriginal()()
		return measure(name, iters, f)
	}

	floor, err := baseline("fork+exec", *n, bench.ForkExec)
	if err != nil {
		return err
	}
	row("fork+exec /bin/true (host)", floor, 0, "")
	cold, err := measure("warren cold cycle", *n, func() error { return env.ColdCycle(ctx) })
	if err != nil {
		return err
	}
	row("warren create+exec true+destroy", cold, floor, "fork+exec")
	penv := &bench.Env{Backend: pooled, Image: img}
	warm, err := measure("warren cold cycle, warm agent pool", *n, func() error { return penv.ColdCycle(ctx) })
	if err != nil {
		return err
	}
	row("  same, from a warm agent pool", warm, floor, "fork+exec")
	if err := os.Chmod(tmp, 0o711); err != nil { //nolint:gosec // 0711: the throwaway stores below tmp must be traversable by the sandboxes' uid range
		return err
	}
	if be.UIDRanges() {
		// What a uid range of its own costs a start (a range lock, the
		// layers and upper directory idmapped): the same cycle on a
		// backend whose sandboxes share one range, alternating.
		fhf := hf
		fhf.dataDir, fhf.runDir, fhf.ranges = filepath.Join(tmp, "shared", "data"), filepath.Join(tmp, "shared", "run"), native.UIDRangesOff
		shared, err := fhf.backend(native.Options{ExitWithHost: true})
		if err != nil {
			return fmt.Errorf("backend with one shared uid range: %w", err)
		}
		defer func() { _ = shared.Close() }()
		simg, err := shared.HostImage()
		if err != nil {
			return err
		}
		fenv := &bench.Env{Backend: shared, Image: simg}
		fmt.Fprintf(os.Stderr, "measuring cold cycle, own uid range vs one shared range, alternating (%d runs each)...\n", *n)
		own, one, err := bench.Paired(*n, func() error { return env.ColdCycle(ctx) }, func() error { return fenv.ColdCycle(ctx) })
		if err != nil {
			return fmt.Errorf("uid range cycle: %w", err)
		}
		ownMed, oneMed := bench.Median(own), bench.Median(one)
		row("  same, each sandbox in a uid range of its own", ownMed, oneMed, "one shared range, alternating")
		fmt.Fprintf(tw, "  own range - shared range\t%+.3f ms\t\t\n", float64((ownMed-oneMed).Microseconds())/1000)
	}
	// A stored image against the host image, alternating, in a throwaway
	// store (no registry).
	shift := layer.IDMap{}
	if m := be.UserNS(); m != nil {
		shift = layer.IDMap{HostBase: m.Host, Size: m.Size}
	}
	storedImg, err := bench.StoredImage(ctx, filepath.Join(tmp, "stored"), shift)
	if err != nil {
		return fmt.Errorf("stored image: %w", err)
	}
	senv := &bench.Env{Backend: be, Image: storedImg}
	fmt.Fprintf(os.Stderr, "measuring cold cycle, host vs stored image, alternating (%d runs each)...\n", *n)
	hostRuns, storedRuns, err := bench.Paired(*n, func() error { return env.ColdCycle(ctx) }, func() error { return senv.ColdCycle(ctx) })
	if err != nil {
		return fmt.Errorf("stored image cycle: %w", err)
	}
	hostMed, storedMed := bench.Median(hostRuns), bench.Median(storedRuns)
	row("  same, from a stored image", storedMed, hostMed, "host image, alternating")
	fmt.Fprintf(tw, "  stored image - host image\t%+.3f ms\t\t\n", float64((storedMed-hostMed).Microseconds())/1000)
	if err := benchDisk(ctx, hf, tmp, *n, row, tw); err != nil {
		fmt.Fprintf(os.Stderr, "disk limits skipped: %v\n", err)
		fmt.Fprintf(tw, "  disk limit on\tskipped\t\t(see warren doctor)\n")
	}
	if err := benchNetwork(ctx, hf, tmp, *n, row); err != nil {
		fmt.Fprintf(os.Stderr, "networking skipped: %v\n", err)
		fmt.Fprintf(tw, "  networking on\tskipped\t\t(see warren doctor)\n")
	}
	if bw := bench.Bwrap(); bw != nil {
		if d, err := baseline("bubblewrap", *n, bw); err == nil {
			row("bubblewrap (same shape)", d, floor, "fork+exec")
			row("  warren / bubblewrap", cold, d, "bubblewrap")
		} else {
			fmt.Fprintf(os.Stderr, "bubblewrap skipped: %v\n", err)
		}
	}
	if cr, cleanup, err := bench.Crun(tmp); err == nil && cr != nil {
		if d, err := baseline("crun", *n, cr); err == nil {
			row("crun (same shape)", d, floor, "fork+exec")
			row("  warren / crun", cold, d, "crun")
		} else {
			fmt.Fprintf(os.Stderr, "crun skipped: %v\n", err)
		}
		cleanup()
	}
	sb, stop, err := env.Warm(ctx)
	if err != nil {
		return err
	}
	defer stop()
	// Idle memory of an agent that has served a request, before the
	// measurements below grow its heap.
	if err := bench.Exec(ctx, sb, "/bin/true"); err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond)
	rss, err := env.AgentRSS(sb)
	if err != nil {
		return err
	}
	d, err := measure("exec true", *n, func() error { return bench.Exec(ctx, sb, "/bin/true") })
	if err != nil {
		return err
	}
	row("exec true in running sandbox", d, floor, "fork+exec")
	pyHost, err := baseline("python host", *n/4, bench.PythonHost)
	if err != nil {
		return err
	}
	row("python3 -c print(1) (host)", pyHost, 0, "")
	pySb, err := measure("python sandbox", *n/4, func() error { return bench.Exec(ctx, sb, "/usr/bin/python3", "-c", "print(1)") })
	if err != nil {
		return err
	}
	row("python3 -c print(1) (sandbox)", pySb, pyHost, "python host")
	repl, err := measure("repl 1+1", *n, func() error { return bench.Repl(ctx, sb) })
	if err != nil {
		return err
	}
	row("REPL 1+1 round trip", repl, 0, "")
	fmt.Fprintf(tw, "idle agent RSS\t%.2f MiB\t\t\n", float64(rss)/(1<<20))
	return tw.Flush()
}

// benchDisk measures what a disk limit costs the cold cycle: a sandbox
// capped at 1 GiB, its directory a subvolume on a btrfs image (a backend
// with --disk-pool), against the same cycle on a backend without limits,
// alternating, each in directories of its own. The image is unmounted at
// the end.
func benchDisk(ctx context.Context, hf hostFlags, tmp string, n int, row func(string, time.Duration, time.Duration, string), tw io.Writer) error {
	open := func(name string, pool int64) (*bench.Env, *native.Backend, error) {
		h := hf
		h.dataDir, h.runDir, h.diskPool = filepath.Join(tmp, name, "data"), filepath.Join(tmp, name, "run"), "off"
		be, err := h.backend(native.Options{ExitWithHost: true, DiskPool: pool})
		if err != nil {
			return nil, nil, err
		}
		img, err := be.HostImage()
		if err != nil {
			_ = be.Close()
			return nil, nil, err
		}
		return &bench.Env{Backend: be, Image: img}, be, nil
	}
	off, offBe, err := open("disk-off", 0)
	if err != nil {
		return err
	}
	defer func() { _ = offBe.Close() }()
	on, onBe, err := open("disk-on", 4<<30)
	if err != nil {
		return err
	}
	defer func() {
		_ = onBe.Close()
		_ = diskquota.Unmount(filepath.Join(tmp, "disk-on", "data", "sandboxes"))
	}()
	if onBe.DiskLimits() == "" {
		return errors.New("disk limits unavailable here")
	}
	on.DiskBytes = 1 << 30
	fmt.Fprintf(os.Stderr, "measuring cold cycle, 1 GiB disk limit vs none, alternating (%d runs each)...\n", n)
	limited, plain, err := bench.Paired(n, func() error { return on.ColdCycle(ctx) }, func() error { return off.ColdCycle(ctx) })
	if err != nil {
		return fmt.Errorf("disk limit cycle: %w", err)
	}
	lm, pm := bench.Median(limited), bench.Median(plain)
	row("  same, with a 1 GiB disk limit", lm, pm, "no limit, alternating")
	fmt.Fprintf(tw, "  disk limit - none\t%+.3f ms\t\t\n", float64((lm-pm).Microseconds())/1000)
	return nil
}

// benchNetwork measures what a sandbox's network costs a start: the cold
// cycle and a pooled start (create -> first exec) with networking on
// (a link, the egress table, a resolver and proxy) against the same with
// loopback only, alternating, each on backends with directories of their
// own (and a network each: its own table and address range).
func benchNetwork(ctx context.Context, hf hostFlags, tmp string, n int, row func(string, time.Duration, time.Duration, string)) error {
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	// The resolver's upstream, for the DNS row: a name of the
	// documentation range, answered on loopback.
	const dnsName = "bench.warren.test"
	upstream, stopUpstream, err := bench.FakeUpstream(dnsName, netip.MustParseAddr("198.51.100.10"))
	if err != nil {
		return err
	}
	defer stopUpstream()
	open := func(name string, prewarm int, netOn bool) (*bench.Env, *native.Backend, *network.Network, error) {
		bhf := hf
		bhf.dataDir, bhf.runDir = filepath.Join(tmp, name, "data"), filepath.Join(tmp, name, "run")
		opts := native.Options{ExitWithHost: true, Prewarm: prewarm}
		env := &bench.Env{}
		var nw *network.Network
		if netOn {
			var err error
			nw, err = network.Start(network.Options{Prefix: native.InstancePrefix(bhf.runDir), Upstreams: []netip.AddrPort{upstream}})
			if err != nil {
				return nil, nil, nil, err
			}
			closers = append(closers, func() { _ = nw.CloseAndRemove() })
			opts.Net, env.Network = nw.Plumb, backend.NetworkEgress
		}
		b, err := bhf.backend(opts)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("backend %s: %w", name, err)
		}
		closers = append(closers, func() { _ = b.Close() })
		if env.Image, err = b.HostImage(); err != nil {
			return nil, nil, nil, err
		}
		env.Backend = b
		return env, b, nw, nil
	}
	on, _, onNet, err := open("net-on", 0, true)
	if err != nil {
		return err
	}
	off, _, _, err := open("net-off", 0, false)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "measuring cold cycle, networking on vs off, alternating (%d runs each)...\n", n)
	dOn, dOff, err := bench.Paired(n, func() error { return on.ColdCycle(ctx) }, func() error { return off.ColdCycle(ctx) })
	if err != nil {
		return fmt.Errorf("cold cycle with networking: %w", err)
	}
	offMed := bench.Median(dOff)
	row("  cold cycle, networking on", bench.Median(dOn), offMed, fmt.Sprintf("loopback only, alternating: %.3f ms", ms(offMed)))
	pon, bon, _, err := open("net-on-pooled", 2, true)
	if err != nil {
		return err
	}
	poff, boff, _, err := open("net-off-pooled", 2, false)
	if err != nil {
		return err
	}
	// Each start waits for both pools to be full: what it measures is the
	// start, not a refill's spawn (and link) beside it.
	settled := func() bool { return bon.PoolSettled() && boff.PoolSettled() }
	fmt.Fprintf(os.Stderr, "measuring pooled start (create -> first exec), networking on vs off, alternating (%d runs each)...\n", n)
	dOn, dOff, err = bench.PairedTimed(n, func() (time.Duration, error) { return pon.PooledStart(ctx, settled) },
		func() (time.Duration, error) { return poff.PooledStart(ctx, settled) })
	if err != nil {
		return fmt.Errorf("pooled start with networking: %w", err)
	}
	offMed = bench.Median(dOff)
	row("pooled create -> first exec, networking on", bench.Median(dOn), offMed, fmt.Sprintf("loopback only, alternating: %.3f ms", ms(offMed)))

	// A DNS answer for an allowed name the resolver has cached, as a stub
	// resolver in the sandbox sees it (python's socket calls included).
	sb, stop, err := on.Warm(ctx)
	if err != nil {
		return err
	}
	defer stop()
	addr := sb.(backend.Networked).NetAddr()
	pol, err := egress.Compile([]string{dnsName})
	if err != nil {
		return err
	}
	if err := onNet.Registry.Add(addr, egress.NewSandbox("bench", sb.ID(), pol)); err != nil {
		return err
	}
	defer func() { _ = onNet.Registry.Remove(addr) }()
	fmt.Fprintln(os.Stderr, "measuring a cached DNS answer inside a sandbox (100 queries)...")
	d, err := bench.DNSInSandbox(ctx, sb, addr.Prev(), dnsName, 100)
	if err != nil {
		return fmt.Errorf("dns in a sandbox: %w", err)
	}
	row("DNS answer, allowed and cached, in a sandbox", d, 0, "")
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
