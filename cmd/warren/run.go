package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/network"
	"github.com/warren-sandbox/warren/internal/portfwd"
	"github.com/warren-sandbox/warren/internal/wire"
)

const runAbout = `
Runs CMD in a fresh sandbox and removes the sandbox afterwards. CMD's stdout
and stderr are passed through whole and warren exits with CMD's exit code:
124 when --timeout killed it, 137 when the memory limit killed it (an
out-of-memory message says so on stderr), 127 when CMD was not found.

The sandbox has its own pid, mount, ipc, uts, net and cgroup namespaces (and
a user namespace where the kernel allows), a read-only view of the image, and
a writable layer of its own. Its network is loopback only, unless --egress
(or --net egress) gives it a link of its own whose traffic leaves only as the
rules allow, as a warren serve sandbox's does: its DNS is answered by warren
(allowed names only) and it reaches only what an allowed name resolved to or
an address rule names (docs/network.md). A denial fails fast inside the
sandbox (NXDOMAIN, a refused connection); at the end warren says on stderr
how many connections and DNS queries were denied, and with -v lists them.
--publish HOST:GUEST serves sandbox port GUEST on 127.0.0.1:HOST while CMD
runs (it gives the sandbox that link too; CMD must listen on 0.0.0.0).

Examples:
  warren run -- /usr/bin/python3 -c 'print(1)'
  warren run --memory 256M --cpus 0.5 --timeout 10s -- sh -c 'echo hi'
  echo data | warren run -i -- wc -c
  warren run --egress pypi.org --egress '*.pythonhosted.org' -- pip download six
  warren run --publish 8080:8000 -- python3 -m http.server 8000`

// storedImage looks name up in the image store and holds it (image rm
// and prune leave it alone) until release.
func storedImage(hf *hostFlags, name string) (img *image.Image, release func(), err error) {
	st, db, err := hf.imageStore()
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = db.Close() }()
	if img, err = st.Get(name); err != nil {
		return nil, nil, err
	}
	release, err = st.Hold(img)
	if err != nil {
		return nil, nil, err
	}
	return img, release, nil
}

func runCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren run", "warren run [flags] -- CMD [ARGS...]", runAbout)
	var hf hostFlags
	hf.register(fs)
	var tf tierFlags
	tf.register(fs)
	img := fs.String("image", "host", "image to run: host (the host's /usr, read-only; no download) or a name from 'warren image ls'")
	mem := fs.String("memory", fmt.Sprintf("%dM", backend.DefaultMemoryBytes>>20), "memory limit (MiB, or with K/M/G suffix); 0 = unlimited")
	cpus := fs.Float64("cpus", backend.DefaultCPUs, fmt.Sprintf("CPU limit in cores, %v (a 1 ms quota per 100 ms period) up to %d; 0 = unlimited", backend.MinCPUs, backend.MaxCPUs))
	pids := fs.Int64("pids", backend.DefaultPids, fmt.Sprintf("maximum number of processes and threads, at least %d (the agent's own threads are not counted); 0 = unlimited", backend.MinPids))
	timeout := fs.Duration("timeout", 0, "kill CMD after this long (e.g. 30s; below 1ms counts as 1ms); 0 = no limit")
	workdir := fs.String("workdir", "", "working directory inside the sandbox, an absolute path (default: the image's, or /)")
	netMode := fs.String("net", "", "network: none (loopback only; the default) or egress (a link whose traffic leaves only as\n--egress rules allow: with none, nothing leaves)")
	var egressRules stringList
	fs.Var(&egressRules, "egress", "let the sandbox reach RULE (repeatable; implies --net egress): NAME (ports 80, 443), *.SUFFIX,\nNAME:PORT, NAME:*, ADDR[/BITS][:PORT] (docs/network.md)")
	var publishArgs stringList
	fs.Var(&publishArgs, "publish", "serve sandbox port GUEST on 127.0.0.1:HOST while CMD runs: HOST:GUEST or PORT (repeatable;\nimplies --net egress)")
	var nf netFlags
	nf.registerUpstream(fs)
	stdin := fs.Bool("i", false, "pass warren's stdin to CMD (read whole, up to 16 MiB)")
	var envs, volumeArgs stringList
	fs.Var(&envs, "env", "set an environment variable K=V (repeatable)")
	fs.Var(&volumeArgs, "volume", "bind a host directory or file: HOST:GUEST or HOST:GUEST:ro (repeatable); with user namespaces\nsandbox root writes as host uid 1610612736, so HOST must be writable by it")
	disk := fs.String("disk", "0", "disk limit of the sandbox's files, /tmp included (MiB, or with K/M/G suffix; 0 = none);\nenforced with --disk-pool")
	readOnly := fs.Bool("read-only", false, "make the root file system read-only except /tmp, /workspace and --write-path")
	var writePaths stringList
	fs.Var(&writePaths, "write-path", "with --read-only: keep this absolute path writable too (repeatable)")
	dockerShort(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := tf.validate(); err != nil {
		return err
	}
	timeoutMs, err := timeoutMillis(*timeout)
	if err != nil {
		return err
	}
	volumes, err := localVolumes(volumeArgs)
	if err != nil {
		return err
	}
	argv := fs.Args()
	if len(argv) == 0 && *img == image.HostName {
		return usageError{fs.Name(), "missing CMD (what to run; the host image has no default command)"}
	}
	memBytes, err := parseSize(*mem)
	if err != nil {
		return err
	}
	diskBytes, err := parseSize(*disk)
	if err != nil {
		return fmt.Errorf("--disk: %w", err)
	}
	for _, e := range envs {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("--env %q: want K=V", e)
		}
	}
	ports, err := runPorts(publishArgs, netMode)
	if err != nil {
		return err
	}
	mode, policy, ups, err := runNetSettings(fs, *netMode, egressRules, &nf)
	if err != nil {
		return err
	}
	cfg := backend.Config{Env: envs, Workdir: *workdir, MemoryBytes: memBytes, CPUs: *cpus, PidsMax: *pids, Network: mode, Volumes: volumes, Ports: ports,
		DiskBytes: diskBytes, ReadOnlyRoot: *readOnly, WritablePaths: writePaths}
	// Before anything starts: the limits' ranges, an absolute workdir.
	if err := cfg.CheckSettings(); err != nil {
		return err
	}
	var in []byte
	if *stdin {
		in, err = io.ReadAll(io.LimitReader(os.Stdin, wire.MaxStdin+1))
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		if len(in) > wire.MaxStdin {
			return fmt.Errorf("stdin is larger than %d MiB", wire.MaxStdin>>20)
		}
	}

	// Bound before anything starts: a host port that is taken fails here.
	fwds, err := bindRunPorts(ports)
	if err != nil {
		return err
	}
	defer closeForwarders(fwds)

	// Clear what an earlier `warren run` killed with SIGKILL left behind:
	// its network's table here, its sandbox's state below.
	sweepRuns(hf.runDir, hf.logger())
	opts := native.Options{ExitWithHost: true}
	var nw *network.Network
	if mode == backend.NetworkEgress {
		if nw, err = startRunNetwork(hf.runDir, ups, hf.logger()); err != nil {
			return err
		}
		// After the sandbox's removal (deferred below, so run before).
		defer func() {
			if err := nw.CloseAndRemove(); err != nil {
				fmt.Fprintf(os.Stderr, "warren run: cleanup: %v\n", err)
			}
		}()
		opts.Net = nw.Plumb
	}
	var be backend.Backend
	var hostImage func() (*image.Image, error)
	if tf.isolation == "gvisor" {
		// A disk limit: on the data directory's pool, as native's; the
		// network: the run's plumbing.
		var disk *diskquota.Dirs
		if diskBytes > 0 {
			size, err := hf.diskPoolBytes()
			if err == nil && size == 0 {
				err = errors.New("--disk-pool off")
			}
			if err == nil {
				disk, err = native.OpenDiskPool(hf.dataDir, size)
			}
			if err != nil {
				return fmt.Errorf("--disk: disk limits are off: %w (warren doctor says why)", err)
			}
		}
		gv, err := gvisorTier(ctx, &hf, &tf, disk, opts.Net)
		if err != nil {
			return fmt.Errorf("--isolation gvisor: %w", err)
		}
		defer func() { _ = gv.Close() }()
		be, hostImage = gv, gv.HostImage
	} else {
		nb, err := hf.backend(opts)
		if err != nil {
			return err
		}
		defer func() { _ = nb.Close() }()
		if diskBytes > 0 && nb.DiskLimits() == "" {
			return errors.New("--disk: disk limits are off (--disk-pool off, or unavailable here: warren doctor says why)")
		}
		_, _ = nb.ReapOrphans(nil)
		be, hostImage = nb, nb.HostImage
	}
	var sbImg *image.Image
	if *img == image.HostName {
		sbImg, err = hostImage()
	} else {
		var release func()
		sbImg, release, err = storedImage(&hf, *img)
		if err == nil {
			defer release()
		}
	}
	if err != nil {
		return err
	}
	if len(argv) == 0 {
		// Like docker run: the image's entrypoint and command.
		argv = append(append([]string(nil), sbImg.Entrypoint...), sbImg.Cmd...)
		if len(argv) == 0 {
			return fmt.Errorf("image %q has no entrypoint or command: give CMD after --", *img)
		}
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	cfg.ID, cfg.Image = "run-"+hex.EncodeToString(rnd[:]), sbImg
	sb, err := be.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := sb.Remove(rctx); err != nil {
			fmt.Fprintf(os.Stderr, "warren run: cleanup: %v\n", err)
		}
	}()
	if err := sb.Start(ctx); err != nil {
		return err
	}
	if nw != nil {
		es, addr, err := registerEgress(nw, sb, policy)
		if err != nil {
			return err
		}
		// Out of the registry before the sandbox's removal frees its
		// address; the report first, after CMD's own output.
		defer func() { _ = nw.Registry.Remove(addr) }()
		defer reportDenied(os.Stderr, es, hf.verbose)
		// Closed (with every connection through them) before the
		// sandbox's address goes.
		defer closeForwarders(fwds)
		for i, f := range fwds {
			f.Serve(netip.AddrPortFrom(addr, ports[i].Guest), nil)
			if hf.verbose {
				fmt.Fprintf(os.Stderr, "warren run: port %d published on %s\n", ports[i].Guest, f.Addr())
			}
		}
	}
	// Output is written through as it comes, so none of it needs a cap.
	req := &wire.ExecRequest{Argv: argv, Stdin: in, TimeoutMs: timeoutMs, NoOutputLimit: true}
	res, err := backend.Exec(ctx, sb, req, func(stream string, data []byte) {
		if stream == wire.Stderr {
			_, _ = os.Stderr.Write(data)
		} else {
			_, _ = os.Stdout.Write(data)
		}
	})
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return exitError{130}
		}
		// The agent missed the host's deadline (it hung, or was stopped):
		// still the timeout's outcome, enforced by stopping the sandbox.
		if errors.Is(err, backend.ErrAgentUnresponsive) && res.TimedOut {
			fmt.Fprintf(os.Stderr, "warren run: killed after the %s timeout (%v)\n", *timeout, err)
			return exitError{124}
		}
		return err
	}
	switch {
	case res.Error != "":
		fmt.Fprintf(os.Stderr, "warren run: %s\n", res.Error)
	case res.TimedOut:
		fmt.Fprintf(os.Stderr, "warren run: killed after the %s timeout\n", *timeout)
		return exitError{124}
	case res.OOMKilled:
		fmt.Fprintf(os.Stderr, "warren run: killed: out of memory (limit %s)\n", *mem)
	case res.Truncated:
		// Only an agent that ignores NoOutputLimit cuts output.
		fmt.Fprintf(os.Stderr, "warren run: the sandbox's agent cut the output short\n")
		if res.Code == 0 {
			return exitError{1}
		}
	}
	if res.Code != 0 {
		return exitError{res.Code}
	}
	return nil
}

// timeoutMillis turns --timeout into the agent's milliseconds, rounding up:
// a positive timeout never becomes 0, which would mean none.
func timeoutMillis(d time.Duration) (int64, error) {
	if d < 0 {
		return 0, fmt.Errorf("--timeout %s: negative; want a duration like 30s, or 0 for none", d)
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms, nil
}

// localVolumes parses --volume values. The caller is root on this machine,
// so any host path may be bound; symlinks in it are resolved here, since
// the backend mounts only symlink-free paths.
func localVolumes(args []string) ([]backend.Volume, error) {
	var vs []backend.Volume
	for _, a := range args {
		host, rest, ok := strings.Cut(a, ":")
		if !ok {
			return nil, fmt.Errorf("--volume %q: want HOST:GUEST or HOST:GUEST:ro", a)
		}
		abs, err := filepath.Abs(host)
		if err == nil {
			abs, err = filepath.EvalSymlinks(abs)
		}
		if err != nil {
			return nil, fmt.Errorf("--volume %q: %w", a, err)
		}
		v, err := backend.ParseVolume(abs + ":" + rest)
		if err == nil {
			err = backend.CheckVolumeSource(nil, v)
		}
		if err != nil {
			return nil, fmt.Errorf("--volume %q: %w", a, err)
		}
		vs = append(vs, v)
	}
	return vs, nil // counts and duplicates: Create's validation
}

// runPorts reads --publish (microsandbox's ports: HOST:GUEST or PORT);
// publishing needs the sandbox's link, so it sets --net egress unless
// --net none says otherwise, which is an error.
func runPorts(args []string, netMode *string) ([]backend.PortMapping, error) {
	if len(args) == 0 {
		return nil, nil
	}
	var ps []backend.PortMapping
	for _, a := range args {
		p, err := backend.ParsePort(a)
		if err != nil {
			return nil, fmt.Errorf("--publish: %w", err)
		}
		ps = append(ps, p)
	}
	switch *netMode {
	case "":
		*netMode = backend.NetworkEgress
	case backend.NetworkNone:
		return nil, errors.New("--publish gives the sandbox a network: not with --net none")
	}
	return ps, backend.ValidatePorts(ps)
}

// bindRunPorts binds --publish's host ports on loopback; on an error none
// stays bound.
func bindRunPorts(ps []backend.PortMapping) ([]*portfwd.Forwarder, error) {
	var fwds []*portfwd.Forwarder
	for _, p := range ps {
		f, err := portfwd.Listen(netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), p.Host), portfwd.Limits{})
		if err != nil {
			closeForwarders(fwds)
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("--publish %s: host port %d on 127.0.0.1 is taken: choose another", p, p.Host)
			}
			return nil, fmt.Errorf("--publish %s: %w", p, err)
		}
		fwds = append(fwds, f)
	}
	return fwds, nil
}

func closeForwarders(fwds []*portfwd.Forwarder) {
	for _, f := range fwds {
		_ = f.Close()
	}
}

// runNetSettings checks warren run's network flags before anything starts:
// the mode (--egress implies egress), the rules compiled (an invalid one
// is named), the resolvers.
func runNetSettings(fs *flag.FlagSet, mode string, rules []string, nf *netFlags) (string, *egress.Policy, []netip.AddrPort, error) {
	switch mode {
	case "":
		mode = backend.NetworkNone
		if len(rules) > 0 {
			mode = backend.NetworkEgress
		}
	case backend.NetworkNone:
		if len(rules) > 0 {
			return "", nil, nil, errors.New("--egress gives the sandbox a network: not with --net none")
		}
	case backend.NetworkEgress:
	default:
		return "", nil, nil, fmt.Errorf("--net %q: want none (loopback only) or egress (docs/network.md)", mode)
	}
	if mode == backend.NetworkNone {
		upstream := false
		fs.Visit(func(f *flag.Flag) { upstream = upstream || f.Name == "dns-upstream" })
		if upstream {
			return "", nil, nil, errors.New("--dns-upstream: the sandbox has no network: add --egress RULE or --net egress")
		}
		return mode, nil, nil, nil
	}
	policy, err := egress.Compile(rules)
	if err != nil {
		return "", nil, nil, fmt.Errorf("--egress: %w", err)
	}
	ups, err := nf.upstreamAddrs()
	if err != nil {
		return "", nil, nil, err
	}
	return mode, policy, ups, nil
}

// startRunNetwork starts this process's own network instance: its table,
// links and pool slot are no other process's (network.OwnedPrefix), and go
// with it (CloseAndRemove, or the next run's sweep after a SIGKILL).
func startRunNetwork(runDir string, ups []netip.AddrPort, log *slog.Logger) (*network.Network, error) {
	prefix, err := network.OwnedPrefix(native.InstancePrefix(runDir))
	if err != nil {
		return nil, err
	}
	nw, err := network.Start(network.Options{Prefix: prefix, Upstreams: ups, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("%w (a sandbox's network needs nftables and veth: see warren doctor)", err)
	}
	return nw, nil
}

// registerEgress puts the running sandbox's egress state under its link's
// address, where the resolver and the proxy look a packet's source up.
func registerEgress(nw *network.Network, sb backend.Sandbox, p *egress.Policy) (*egress.Sandbox, netip.Addr, error) {
	var addr netip.Addr
	if n, ok := sb.(backend.Networked); ok {
		addr = n.NetAddr()
	}
	if !addr.IsValid() {
		return nil, netip.Addr{}, errors.New("network: the sandbox has no link")
	}
	es := egress.NewSandbox("", sb.ID(), p)
	if err := nw.Registry.Add(addr, es); err != nil {
		return nil, netip.Addr{}, fmt.Errorf("network: %w", err)
	}
	return es, addr, nil
}

// reportDenied says on w what es's rules denied: one line of counts, or
// with verbose each denied query and connection the log kept.
func reportDenied(w io.Writer, es *egress.Sandbox, verbose bool) {
	counts := es.Counts()
	conns, queries := counts["tcp"].Denied, counts["dns"].Denied
	if conns+queries == 0 {
		return
	}
	if !verbose {
		fmt.Fprintf(w, "warren run: egress denied %d connection(s) and %d DNS query(ies) (-v lists them)\n", conns, queries)
		return
	}
	var listed uint64
	for _, r := range es.Log(0, 0) {
		if r.Verdict != "deny" {
			continue
		}
		listed++
		what := "DNS query for " + printable(r.Name)
		if r.Kind != "dns" {
			what = fmt.Sprintf("connection to %s", net.JoinHostPort(r.Addr, strconv.Itoa(int(r.Port))))
			if r.Name != "" {
				what += " for " + printable(r.Name)
			}
		}
		fmt.Fprintf(w, "warren run: egress denied %s: %s\n", what, printable(r.Reason))
	}
	if listed < conns+queries {
		fmt.Fprintf(w, "warren run: egress denied %d more (the log keeps the last %d records)\n", conns+queries-listed, egress.LogSize)
	}
}

// printable quotes what a sandbox chose (a name, a Host) for a terminal.
func printable(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
