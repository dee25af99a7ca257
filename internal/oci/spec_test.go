package oci

import (
	"math"
	"math/rand/v2"
	"testing"
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
