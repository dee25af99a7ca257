package bench_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/bench"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/sdk/warren"
)

// TestSoak: 64 clients over the whole API of a real `warren serve` for
// 30 s (WARREN_SOAK_CLIENTS and WARREN_SOAK_DURATION to change): no
// unexpected error, goroutines, open files and memory flat under load and
// back after it, and no sandbox directory, mount, cgroup or process left,
// neither after the clients nor after the server stopped. `make soak`
// runs it for minutes.
func TestSoak(t *testing.T) {
	testenv.RequireRoot(t)
	d := 30 * time.Second
	if v := os.Getenv("WARREN_SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("WARREN_SOAK_DURATION: %v", err)
		}
	}
	clients := 64
	if v := os.Getenv("WARREN_SOAK_CLIENTS"); v != "" {
		var err error
		if clients, err = strconv.Atoi(v); err != nil || clients < 1 {
			t.Fatalf("WARREN_SOAK_CLIENTS=%q: want a number of clients", v)
		}
	}
	bin := testenv.WarrenBinary(t)
	t.Cleanup(testenv.RemoveWarrenBinary)
	env := []string{"WARREN_AGENT=" + testenv.AgentBinary(t), "WARREN_SPAWNER=" + testenv.SpawnerBinary(t)}
	srv, err := bench.StartSoakServer(t.Context(), bin, env, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	leftoversSeen(t, srv)
	rep, err := bench.Soak(t.Context(), bench.SoakOptions{
		URL: srv.URL, Key: srv.Key, AdminKey: srv.AdminKey, Sample: srv.Sample,
		Clients: clients, Duration: d, Think: 250 * time.Millisecond,
	})
	if err != nil {
		_ = srv.Stop()
		t.Fatal(err)
	}
	rep.Left = append(rep.Left, srv.Leftovers(false, 30*time.Second)...)
	if err := srv.Stop(); err != nil {
		rep.Left = append(rep.Left, err.Error())
	}
	rep.Left = append(rep.Left, srv.Leftovers(true, 30*time.Second)...)
	var out strings.Builder
	rep.Write(&out)
	t.Log("\n" + out.String())
	if p := rep.Problems(); len(p) > 0 {
		t.Errorf("the soak failed:\n%s", strings.Join(p, "\n"))
	}
}

// leftoversSeen: while a sandbox runs, the leftover check names its
// directory, cgroup and processes (so that its silence after the soak
// means something); once it is removed, nothing.
func leftoversSeen(t *testing.T, srv *bench.SoakServer) {
	t.Helper()
	c := warren.New(warren.WithServerURL(srv.URL), warren.WithAPIKey(srv.Key), warren.WithNamespace("soak"))
	if _, err := c.Create(t.Context(), warren.Spec{Name: "probe", MemoryMiB: 128, CPUs: 0.5}); err != nil {
		t.Fatal(err)
	}
	left := strings.Join(srv.Leftovers(false, 0), "\n")
	for _, want := range []string{"/data/sandboxes/", "/run/", "cgroup", "process "} {
		if !strings.Contains(left, want) {
			t.Errorf("with a sandbox running, the leftovers name nothing with %q:\n%s", want, left)
		}
	}
	if err := c.Remove(t.Context(), "probe"); err != nil {
		t.Fatal(err)
	}
	if left := srv.Leftovers(false, 30*time.Second); len(left) > 0 {
		t.Errorf("after the probe's removal: %s", strings.Join(left, "\n"))
	}
}

// TestSoakVerdicts: the report's checks fail on what they are meant to
// catch, from series made up here: steady growth of each resource after
// the warm-up, resources not back after the load, an unexpected error and
// anything left behind; and pass a flat, noisy series.
func TestSoakVerdicts(t *testing.T) {
	series := func(f func(i int) bench.Reading) []bench.Reading {
		var s []bench.Reading
		for i := range 60 {
			r := f(i)
			r.At = time.Duration(i) * time.Second
			s = append(s, r)
		}
		return s
	}
	flat := func(i int) bench.Reading {
		return bench.Reading{RSS: 100<<20 + int64(i%7)<<20, FDs: 600 + i%5*10, Goroutines: 250 + i%3*40}
	}
	before := bench.Reading{RSS: 30 << 20, FDs: 31, Goroutines: 17}
	for _, c := range []struct {
		name   string
		edit   func(*bench.SoakReport)
		expect string // "" = passes
	}{
		{"flat", func(*bench.SoakReport) {}, ""},
		{"goroutines grow", func(r *bench.SoakReport) {
			r.Samples = series(func(i int) bench.Reading { x := flat(i); x.Goroutines += 5 * i; return x })
		}, "goroutines grew"},
		{"files grow", func(r *bench.SoakReport) {
			r.Samples = series(func(i int) bench.Reading { x := flat(i); x.FDs += 3 * i; return x })
		}, "open files grew"},
		{"memory grows", func(r *bench.SoakReport) {
			r.Samples = series(func(i int) bench.Reading { x := flat(i); x.RSS += int64(i) << 22; return x })
		}, "RSS grew"},
		{"growth only in the warm-up", func(r *bench.SoakReport) {
			r.Samples = series(func(i int) bench.Reading { x := flat(i); x.Goroutines += 10 * min(i, 15); return x })
		}, ""},
		{"goroutines not back", func(r *bench.SoakReport) { r.After.Goroutines = before.Goroutines + 64 }, "not back after the load"},
		{"files not back", func(r *bench.SoakReport) { r.After.FDs = before.FDs + 64 }, "not back after the load"},
		{"unexpected error", func(r *bench.SoakReport) { r.Failures = map[string]int{"sandbox.exec: boom": 3} }, "unexpected error (3x): sandbox.exec: boom"},
		{"left behind", func(r *bench.SoakReport) { r.Left = []string{"mount /x"} }, "left behind: mount /x"},
		{"too short", func(r *bench.SoakReport) { r.Samples = r.Samples[:20] }, "too few samples"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &bench.SoakReport{Clients: 64, Warmup: 20 * time.Second, Samples: series(flat), Before: before, After: before,
				Slack: bench.Slack{Goroutines: 128, FDs: 64, RSSFraction: 0.25, RSSBytes: 64 << 20, Settle: 20}}
			c.edit(r)
			p := strings.Join(r.Problems(), "\n")
			if c.expect == "" && p != "" {
				t.Errorf("problems: %s", p)
			}
			if c.expect != "" && !strings.Contains(p, c.expect) {
				t.Errorf("problems %q, want one saying %q", p, c.expect)
			}
		})
	}
}
