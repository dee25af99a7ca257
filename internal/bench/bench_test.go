package bench_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/bench"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/timerslack"
)

// env builds a native backend on a private data dir.
func env(b *testing.B) *bench.Env { return envWith(b, 0) }

// envWith builds a native backend keeping prewarm agents spawned ahead.
func envWith(b *testing.B, prewarm int) *bench.Env {
	b.Helper()
	testenv.RequireRoot(b)
	agentPath := testenv.AgentBinary(b)
	// As `warren bench` runs (cmd/warren's hostFlags.backend).
	if err := timerslack.Coarsen(timerslack.Coarse); err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "warren-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		b.Fatal(err)
	}
	be, err := native.New(native.Options{DataDir: filepath.Join(dir, "data"), RunDir: filepath.Join(dir, "run"), AgentPath: agentPath, SpawnerPath: testenv.SpawnerBinary(b), CgroupPrefix: "warren-bench", ExitWithHost: true, Prewarm: prewarm})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	img, err := be.HostImage()
	if err != nil {
		b.Fatal(err)
	}
	return &bench.Env{Backend: be, Image: img, HostPid: func(sb backend.Sandbox) int { return sb.(*native.Sandbox).Pid() }}
}

// loop runs f b.N times and reports, besides the mean (ns/op), the median
// in ms (med-ms): what `warren bench` and the README report, and what a
// few slow outliers on a noisy machine do not move.
func loop(b *testing.B, f func() error) {
	b.Helper()
	var ds []time.Duration
	for b.Loop() {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	b.ReportMetric(float64(bench.Median(ds).Microseconds())/1000, "med-ms")
}

// baseline is loop for what is measured as the host would run it: started
// from a thread with the host's usual timer slack (package timerslack), in
// a process coarsened as warren's is, whichever benchmark ran first.
func baseline(b *testing.B, f func() error) {
	b.Helper()
	if err := timerslack.Coarsen(timerslack.Coarse); err != nil {
		b.Fatal(err)
	}
	defer timerslack.UseOriginal()()
	loop(b, f)
}

func BenchmarkForkExec(b *testing.B) { baseline(b, bench.ForkExec) }

func BenchmarkColdCycle(b *testing.B) {
	e := env(b)
	loop(b, func() error { return e.ColdCycle(context.Background()) })
}

func BenchmarkColdCycleWarmPool(b *testing.B) {
	e := envWith(b, 2)
	loop(b, func() error { return e.ColdCycle(context.Background()) })
}

func BenchmarkBwrap(b *testing.B) {
	f := bench.Bwrap()
	if f == nil {
		b.Skip("bwrap not installed")
	}
	baseline(b, f)
}

func BenchmarkCrun(b *testing.B) {
	testenv.RequireRoot(b)
	run, cleanup, err := bench.Crun(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	if run == nil {
		b.Skip("crun not installed")
	}
	baseline(b, run)
}

func BenchmarkExecTrue(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	sb, stop, err := e.Warm(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	loop(b, func() error { return bench.Exec(ctx, sb, "/bin/true") })
}

func BenchmarkPythonHost(b *testing.B) { baseline(b, bench.PythonHost) }

func BenchmarkPythonSandbox(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	sb, stop, err := e.Warm(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	loop(b, func() error { return bench.Exec(ctx, sb, "/usr/bin/python3", "-c", "print(1)") })
}

func BenchmarkRepl(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	sb, stop, err := e.Warm(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	loop(b, func() error { return bench.Repl(ctx, sb) })
}

// BenchmarkAgentIdleRSS reports the idle agent's resident memory as a metric.
func BenchmarkAgentIdleRSS(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	sb, stop, err := e.Warm(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	if err := bench.Exec(ctx, sb, "/bin/true"); err != nil {
		b.Fatal(err)
	}
	var rss int64
	for b.Loop() {
		if rss, err = e.AgentRSS(sb); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rss)/(1<<20), "MiB-rss")
}

// BenchmarkColdCycleStoredImage compares a cold cycle from a stored image
// with one from the host image, alternating, and reports both medians and
// their difference (issue #3's target: at most 1 ms slower).
func BenchmarkColdCycleStoredImage(b *testing.B) {
	host := env(b)
	// Not b.TempDir: its parent is private, and sandbox root (a mapped
	// uid) must reach the layers.
	dir, err := os.MkdirTemp("", "warren-bench-image-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		b.Fatal(err)
	}
	shift := layer.IDMap{}
	if m := host.Backend.(*native.Backend).UserNS(); m != nil {
		shift = layer.IDMap{HostBase: m.Host, Size: m.Size}
	}
	ctx := context.Background()
	img, err := bench.StoredImage(ctx, dir, shift)
	if err != nil {
		b.Fatal(err)
	}
	stored := &bench.Env{Backend: host.Backend, Image: img}
	dh, ds, err := bench.Paired(b.N, func() error { return host.ColdCycle(ctx) }, func() error { return stored.ColdCycle(ctx) })
	if err != nil {
		b.Fatal(err)
	}
	mh, ms := bench.Median(dh), bench.Median(ds)
	b.ReportMetric(float64(mh.Microseconds())/1000, "host-ms")
	b.ReportMetric(float64(ms.Microseconds())/1000, "stored-ms")
	b.ReportMetric(float64((ms-mh).Microseconds())/1000, "stored-minus-host-ms")
}
