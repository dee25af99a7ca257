package gvisor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/conformance"
)

// replSnapshot is a sandbox with an idle Python REPL holding state (the
// issue's case), and a snapshot of it.
func replSnapshot(b *testing.B) (*conformance.Harness, backend.Sandbox, string) {
	h := harness(b)
	src := h.Sandbox(b, backend.Config{})
	repl(b, src, "x = 41")
	snap := filepath.Join(b.TempDir(), "snap")
	if err := src.(*gvisor.Sandbox).Checkpoint(context.Background(), snap); err != nil {
		b.Fatal(err)
	}
	return h, src, snap
}

// BenchmarkCheckpoint: checkpoint of an idle Python REPL sandbox, the
// source running on after each.
func BenchmarkCheckpoint(b *testing.B) {
	_, src, _ := replSnapshot(b)
	dir := b.TempDir()
	i := 0
	for b.Loop() {
		i++
		d := filepath.Join(dir, fmt.Sprint(i))
		if err := src.(*gvisor.Sandbox).Checkpoint(context.Background(), d); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = os.RemoveAll(d)
		b.StartTimer()
	}
}

// restoreCopies restores n copies from snap concurrently, each until its
// REPL gives a result.
func restoreCopies(b *testing.B, h *conformance.Harness, snap string, n, round int) []backend.Sandbox {
	gb := h.Backend.(*gvisor.Backend)
	out := make([]backend.Sandbox, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := backend.Config{ID: fmt.Sprintf("bench-%d-%d-%d", os.Getpid(), round, i), Image: h.Image, Hostname: "copy"}
			sb, err := gb.Restore(context.Background(), cfg, snap)
			if err != nil {
				b.Error(err)
				return
			}
			out[i] = sb
			if got := repl(b, sb, "x + 1"); got != "42" {
				b.Errorf("x + 1 = %s", got)
			}
		}()
	}
	wg.Wait()
	return out
}

func benchRestore(b *testing.B, n int) {
	h, _, snap := replSnapshot(b)
	round := 0
	for b.Loop() {
		round++
		sbs := restoreCopies(b, h, snap, n, round)
		b.StopTimer()
		for _, sb := range sbs {
			if sb != nil {
				_ = sb.Remove(context.Background())
			}
		}
		b.StartTimer()
	}
}

// BenchmarkRestore: a restore to its first REPL result.
func BenchmarkRestore(b *testing.B) { benchRestore(b, 1) }

// BenchmarkFork4: four restores at once, to each one's first REPL result.
func BenchmarkFork4(b *testing.B) { benchRestore(b, 4) }
