package gvisor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/bench"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire"
)

// cycle creates a sandbox of cfg on be, starts it, runs /bin/true in it
// and removes it: the cycle every benchmark here times.
func cycle(tb testing.TB, be backend.Backend, cfg backend.Config) {
	tb.Helper()
	ctx := context.Background()
	sb, err := be.Create(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	if st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil); err != nil || st.Code != 0 {
		tb.Fatal(st, err)
	}
	if err := sb.Remove(ctx); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkCycle: create, start, exec /bin/true, remove.
func BenchmarkCycle(b *testing.B) {
	h := harness(b)
	for i := range b.N {
		cycle(b, h.Backend, backend.Config{ID: fmt.Sprintf("bench-%d-%d", os.Getpid(), i), Image: h.Image})
	}
}

// BenchmarkExec: exec /bin/true in a running sandbox, on a pooled
// connection.
func BenchmarkExec(b *testing.B) {
	sb := harness(b).Sandbox(b, backend.Config{})
	ctx := context.Background()
	for b.Loop() {
		if st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil); err != nil || st.Code != 0 {
			b.Fatal(st, err)
		}
	}
}

// BenchmarkAgentChannel weighs the agent channel: a health request on a
// pooled connection, and on a new one (a socket pair whose end goes to
// the agent as a descriptor) each time.
func BenchmarkAgentChannel(b *testing.B) {
	sb := harness(b).Sandbox(b, backend.Config{})
	ctx := context.Background()
	c := sb.Agent()
	for _, fresh := range []bool{false, true} {
		b.Run(map[bool]string{false: "pooled", true: "new-connection"}[fresh], func(b *testing.B) {
			for b.Loop() {
				if fresh {
					c.Close()
				}
				if _, err := c.Health(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPauseResume: pause a running sandbox (runsc pause and the
// freezer) and resume it.
func BenchmarkPauseResume(b *testing.B) {
	sb := harness(b).Sandbox(b, backend.Config{})
	p := sb.(backend.Pauser)
	ctx := context.Background()
	for b.Loop() {
		if err := p.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		if err := p.Resume(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVsRunsc weighs the backend against runsc by itself, each
// iteration one of each interleaved (a loaded host's drift hits both):
// "cycle" is BenchmarkCycle's create → exec true → remove against a
// bare `runsc run` of /bin/true (same flags, a root of the host's /usr);
// "exec" is an exec of true through the agent against `runsc exec` in
// the same running sandbox. Reported: each side's median and their ratio.
func BenchmarkVsRunsc(b *testing.B) {
	h := harness(b)
	runsc := testenv.RunscBinary(b)
	ctx := context.Background()
	report := func(b *testing.B, ours, bare []time.Duration) {
		m, n := median(ours), median(bare)
		b.ReportMetric(float64(m.Microseconds())/1000, "warren-ms")
		b.ReportMetric(float64(n.Microseconds())/1000, "runsc-ms")
		b.ReportMetric(float64(m)/float64(n), "ratio")
	}
	b.Run("cycle", func(b *testing.B) {
		dir := b.TempDir()
		bare, cleanup, err := bench.OCIRuntime(runsc, dir, "--root="+filepath.Join(dir, "state"),
			"--platform=systrap", "--network=none", "--overlay2=none", "--directfs=false")
		if err != nil {
			b.Fatal(err)
		}
		defer cleanup()
		var ours, theirs []time.Duration
		for i := range b.N {
			t0 := time.Now()
			cycle(b, h.Backend, backend.Config{ID: fmt.Sprintf("vs-%d-%d", os.Getpid(), i), Image: h.Image})
			ours = append(ours, time.Since(t0))
			t0 = time.Now()
			if err := bare(); err != nil {
				b.Fatal(err)
			}
			theirs = append(theirs, time.Since(t0))
		}
		report(b, ours, theirs)
	})
	b.Run("exec", func(b *testing.B) {
		sb := h.Sandbox(b, backend.Config{})
		root := filepath.Join(sharedBase, "run", ".runsc")
		var ours, theirs []time.Duration
		for range b.N {
			t0 := time.Now()
			if st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil); err != nil || st.Code != 0 {
				b.Fatal(st, err)
			}
			ours = append(ours, time.Since(t0))
			t0 = time.Now()
			if out, err := exec.Command(runsc, "--root="+root, "exec", sb.ID(), "/bin/true").CombinedOutput(); err != nil { //nolint:gosec // the test's runsc
				b.Fatalf("runsc exec: %v: %s", err, out)
			}
			theirs = append(theirs, time.Since(t0))
		}
		report(b, ours, theirs)
	})
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
