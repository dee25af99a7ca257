package bench

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"time"
)

// Command returns a whole-process measurement: argv run to its end, its
// output discarded unless it fails.
func Command(argv ...string) func() error {
	return func() error {
		var out bytes.Buffer
		cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // argv is fixed by the caller: a baseline or warren itself
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%v: %w: %s", argv, err, bytes.TrimSpace(out.Bytes()))
		}
		return nil
	}
}

// Interleaved times each of fs n times, one call of each per round (after
// one warm-up call of each), starting each round one further along, so
// that drift of a shared machine and a position in the round land on all
// alike. out[i] are fs[i]'s durations.
func Interleaved(n int, fs []func() error) (out [][]time.Duration, err error) {
	for _, f := range fs {
		if err := f(); err != nil {
			return nil, err
		}
	}
	out = make([][]time.Duration, len(fs))
	for r := range n {
		for k := range fs {
			i := (r + k) % len(fs)
			start := time.Now()
			if err := fs[i](); err != nil {
				return nil, err
			}
			out[i] = append(out[i], time.Since(start))
		}
	}
	return out, nil
}

// Percentile is the p-th percentile (0 < p <= 100) of ds, nearest rank
// (ds is sorted in place).
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(float64(len(ds))*p/100+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// Anchor is a figure another project published, printed beside ours and
// never mistaken for a measurement.
type Anchor struct{ What, Figure string }

// Published are the anchors of issue #23: what others say of their own
// start times and footprints, on their own hardware.
var Published = []Anchor{
	{"E2B", "~150 ms to a usable sandbox"},
	{"Daytona", "under 90 ms to a sandbox"},
	{"microsandbox", "under 200 ms to a sandbox"},
	{"Firecracker", "125 ms boot, < 5 MiB per VM"},
	{"CubeSandbox", "~48 ms create, ~25 MB per VM at 1000"},
}
