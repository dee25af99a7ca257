package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/warren-sandbox/warren/internal/agentbin"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/bench"
	"github.com/warren-sandbox/warren/internal/timerslack"
)

// contender is one row of warren bench --compare: a way of running
// /bin/true in a fresh sandbox (or, for the floor, none).
type contender struct {
	name string
	run  func() error
}

// benchCompare runs, interleaved in one run, every way of running /bin/true
// in a fresh sandbox that this host has: Warren's (in process, cold and
// from a warm pool; whole-process `warren run`; gVisor when runsc is
// found) and the other runtimes installed, all on the host's /usr
// read-only, and prints medians, p99 and the ratio to fork+exec.
func benchCompare(ctx context.Context, hf hostFlags, n int, runsc string) error {
	tmp, err := os.MkdirTemp("", "warren-compare-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := os.Chmod(tmp, 0o711); err != nil { //nolint:gosec // 0711: the gVisor sandboxes' stores below tmp must be traversable
		return err
	}
	// Baselines run with the host's usual timer slack (package timerslack).
	baseline := func(f func() error) func() error {
		return func() error {
			defer timerslack.UseOriginal()()
			return f()
		}
	}
	cs := []contender{{"fork+exec /bin/true (the floor)", baseline(bench.Command("/bin/true"))}}
	var skipped []string

	be, pooled, img, closeAll, err := hf.benchBackends()
	if err != nil {
		return err
	}
	defer closeAll()
	cold, warm := &bench.Env{Backend: be, Image: img}, &bench.Env{Backend: pooled, Image: img}
	cs = append(cs,
		contender{"warren native, cold (in process)", func() error { return cold.ColdCycle(ctx) }},
		contender{"warren native, warm pool (in process)", func() error { return warm.ColdCycle(ctx) }})
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Its own directories: the run's sweep must not meet the backends'
	// sandboxes above.
	cs = append(cs, contender{"warren run -- /bin/true (whole process)", baseline(bench.Command(exe, "run",
		"--data-dir", filepath.Join(tmp, "run-data"), "--run-dir", filepath.Join(tmp, "run-run"), "--", "/bin/true"))})

	if runsc == "" {
		runsc, _ = exec.LookPath("runsc")
	}
	if runsc != "" {
		gb, closeGB, err := gvisorBackend(hf, tmp, runsc)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("warren gvisor: %v", err))
		} else {
			defer closeGB()
			cs = append(cs, contender{"warren gvisor, cold (in process)", func() error { return gb.ColdCycle(ctx) }})
		}
	} else {
		skipped = append(skipped, "warren gvisor and runsc: runsc not found (make runsc, then --runsc PATH)")
	}
	if bw := bench.Bwrap(); bw != nil {
		cs = append(cs, contender{"bubblewrap", baseline(bw)})
	} else {
		skipped = append(skipped, "bubblewrap: not installed")
	}
	for _, rt := range []struct {
		name   string
		path   string
		global []string
	}{
		{"crun", lookPath("crun"), nil},
		{"runc", lookPath("runc"), nil},
		{"runsc", runsc, []string{"--network=none", "--root", filepath.Join(tmp, "runsc-root")}},
	} {
		if rt.path == "" {
			if rt.name != "runsc" {
				skipped = append(skipped, rt.name+": not installed")
			}
			continue
		}
		run, cleanup, err := bench.OCIRuntime(rt.path, tmp, rt.global...)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", rt.name, err))
			continue
		}
		defer cleanup()
		cs = append(cs, contender{rt.name + " run", run})
	}
	if p := lookPath("podman"); p != "" {
		// The same root as the OCI runtimes' bundles, given as a directory:
		// nothing to pull or import.
		root := filepath.Join(tmp, "podman-rootfs")
		if err := bench.Rootfs(root); err != nil {
			return err
		}
		cs = append(cs, contender{"podman run --rootfs", baseline(bench.Command(p, "run", "--rm", "--network", "none",
			"--rootfs", root, "-v", "/usr:/usr:ro", "/bin/true"))})
	} else {
		skipped = append(skipped, "podman: not installed")
	}

	// A contender that fails (a runtime this host cannot run) is dropped
	// with its reason, not the whole comparison.
	var ok []contender
	for _, c := range cs {
		if err := c.run(); err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", c.name, err))
			continue
		}
		ok = append(ok, c)
	}
	fmt.Fprintf(os.Stderr, "measuring %d ways of running /bin/true in a fresh sandbox, interleaved (%d rounds)...\n", len(ok), n)
	fs := make([]func() error, len(ok))
	for i, c := range ok {
		fs[i] = c.run
	}
	ds, err := bench.Interleaved(n, fs)
	if err != nil {
		return err
	}
	floor := bench.Percentile(ds[0], 50)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "run /bin/true in a fresh sandbox\tmedian\tp99\tx floor")
	for i, c := range ok {
		med, p99 := bench.Percentile(ds[i], 50), bench.Percentile(ds[i], 99)
		fmt.Fprintf(tw, "%s\t%.2f ms\t%.2f ms\t%.1fx\n", c.name, ms(med), ms(p99), float64(med)/float64(floor))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Println("\npublished, not measured here (their hardware, their definitions):")
	for _, a := range bench.Published {
		fmt.Printf("  %-14s %s\n", a.What, a.Figure)
	}
	for _, s := range skipped {
		fmt.Fprintf(os.Stderr, "not measured: %s\n", s)
	}
	return nil
}

// gvisorBackend is a gVisor backend with directories of its own below tmp,
// and what releases what it holds beside its sandboxes (a mount, cgroups).
func gvisorBackend(hf hostFlags, tmp, runsc string) (*bench.Env, func(), error) {
	agent, err := agentbin.Find(hf.agent, filepath.Join(hf.dataDir, "bin"))
	if err != nil {
		return nil, nil, err
	}
	b, err := gvisor.New(gvisor.Options{DataDir: filepath.Join(tmp, "gvisor-data"), RunDir: filepath.Join(tmp, "gvisor-run"),
		RunscPath: runsc, AgentPath: agent, StartTimeout: 30 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	closeB := func() { _ = b.Close() }
	img, err := b.HostImage()
	if err != nil {
		closeB()
		return nil, nil, err
	}
	return &bench.Env{Backend: b, Image: img}, closeB, nil
}

func lookPath(name string) string {
	p, _ := exec.LookPath(name)
	return p
}
