package bench_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/bench"
)

func TestPercentile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5}, {99, 10}, {10, 1}, {100, 10}, {1, 1}} {
		if got := bench.Percentile(ds, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if bench.Percentile(nil, 50) != 0 {
		t.Error("empty: want 0")
	}
}

// Interleaved calls every function once per round, rotating which goes
// first, and stops at the first error.
func TestInterleaved(t *testing.T) {
	var order []int
	fs := []func() error{
		func() error { order = append(order, 0); return nil },
		func() error { order = append(order, 1); return nil },
		func() error { order = append(order, 2); return nil },
	}
	out, err := bench.Interleaved(2, fs)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 2, 0, 1, 2, 1, 2, 0}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	for i, ds := range out {
		if len(ds) != 2 {
			t.Errorf("fs[%d]: %d samples, want 2", i, len(ds))
		}
	}
	boom := errors.New("boom")
	if _, err := bench.Interleaved(3, []func() error{func() error { return nil }, func() error { return boom }}); !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	if err := bench.Command("/bin/false")(); err == nil {
		t.Fatal("a failing command measured as fine")
	}
}
