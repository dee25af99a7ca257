package oci

import (
	"math"
	"math/rand/v2"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestResourceLimitsRoundTrip: the limits a backend reads back from a
// spec's resources are the ones it was built with, down to the quota the
// cgroup gets (CPUs × period, rounded), so a backend that reads the spec
// writes the same cgroup values as one handed the numbers directly.
func TestResourceLimitsRoundTrip(t *testing.T) {
	cpus := []float64{0, 0.01, 0.29, 1.0 / 3, 0.5, 1, 2.675, 1024}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		cpus = append(cpus, 0.01+r.Float64()*1024)
	}
	for i, c := range cpus {
		p := Params{RootPath: "/r", MemoryBytes: int64(i) << 20, CPUs: c, PidsMax: int64(i)}
		sp, err := Build(p)
		if err != nil {
			t.Fatal(err)
		}
		got := ResourceLimits(sp.Linux.Resources)
		if got.MemoryBytes != p.MemoryBytes || got.PidsMax != p.PidsMax {
			t.Errorf("%+v: read back %+v", p, got)
		}
		if q, want := math.Round(got.CPUs*CPUPeriod), math.Round(c*CPUPeriod); q != want {
			t.Errorf("cpus %v: quota %v read back, want %v", c, q, want)
		}
		if c == 0 && sp.Linux.Resources.CPU != nil {
			t.Errorf("cpus 0 wrote a quota")
		}
	}
	if l := ResourceLimits(nil); l != (Limits{}) {
		t.Errorf("no resources: %+v", l)
	}
}

// TestReadOnlyRoot: a read-only root's writable paths become binds of
// themselves (relative sources, inside the root), parents first, once
// each, after the standard mounts and before the volumes; without it the
// paths add nothing.
func TestReadOnlyRoot(t *testing.T) {
	vol := specs.Mount{Destination: "/workspace", Type: "bind", Source: "/srv/ws", Options: []string{"bind"}}
	p := Params{RootPath: "/r", ReadOnlyRoot: true, WritablePaths: []string{"/tmp", "/home/u/sub", "/home/u", "/tmp"}, Volumes: []specs.Mount{vol}}
	s, err := Build(p)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly {
		t.Error("root not read-only")
	}
	n := len(StandardMounts())
	want := []string{"/home/u", "/home/u/sub", "/tmp"}
	got := s.Mounts[n:]
	if len(got) != len(want)+1 || got[len(want)].Destination != "/workspace" {
		t.Fatalf("mounts after the standard ones: %+v", got)
	}
	for i, d := range want {
		m := got[i]
		if m.Destination != d || m.Source != d[1:] || m.Type != "bind" {
			t.Errorf("writable bind %d: %+v, want %s bound from %q", i, m, d, d[1:])
		}
	}
	p.ReadOnlyRoot = false
	s, err = Build(p)
	if err != nil {
		t.Fatal(err)
	}
	if s.Root.Readonly || len(s.Mounts) != n+1 {
		t.Errorf("without a read-only root: readonly %v, %d mounts", s.Root.Readonly, len(s.Mounts))
	}
}
