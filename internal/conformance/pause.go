package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

// pause checks backend.Pauser where a backend has it: a paused sandbox
// keeps its memory and uses no CPU, goes on where it was after Resume, and
// stops without a hang while paused.
func (h *Harness) pause(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{MemoryBytes: 256 << 20})
	p, ok := sb.(backend.Pauser)
	if !ok {
		t.Skipf("backend %s has no Pauser (pausing is refused as unsupported)", h.Backend.Name())
	}
	ctx := context.Background()
	// 48 MiB touched, then a busy loop.
	if _, err := sb.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: []string{"/usr/bin/python3", "-c",
		"b = bytearray(48 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nwhile True: pass"}}); err != nil {
		t.Fatal(err)
	}
	stats := func() backend.Stats {
		t.Helper()
		st, err := sb.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := stats(); st.MemoryBytes < 48<<20 || st.CPUUsage < 50*time.Millisecond; st = stats() {
		if time.Now().After(deadline) {
			t.Fatalf("the workload did not start: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if paused, err := p.Paused(); err != nil || paused {
		t.Fatalf("Paused before Pause = %v, %v", paused, err)
	}
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if paused, err := p.Paused(); err != nil || !paused {
		t.Fatalf("Paused after Pause = %v, %v", paused, err)
	}
	before := stats()
	time.Sleep(300 * time.Millisecond)
	after := stats()
	if after.CPUUsage != before.CPUUsage {
		t.Errorf("paused sandbox used %v of CPU in 300 ms", after.CPUUsage-before.CPUUsage)
	}
	// Kept, to the kernel's own bookkeeping: its per-CPU charge caches
	// and freed kernel objects move the count by some pages meanwhile.
	if d := after.MemoryBytes - before.MemoryBytes; d > 1<<20 || d < -1<<20 || after.MemoryBytes < 48<<20 {
		t.Errorf("paused sandbox's memory went from %d to %d bytes (want it kept within 1 MiB, >= 48 MiB)", before.MemoryBytes, after.MemoryBytes)
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if paused, err := p.Paused(); err != nil || paused {
		t.Fatalf("Paused after Resume = %v, %v", paused, err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for stats().CPUUsage < after.CPUUsage+20*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("the workload did not go on after Resume")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := Exec(t, sb, 10*time.Second, "/bin/echo", "back"); r.Code != 0 || r.Stdout != "back\n" {
		t.Fatalf("exec after Resume: %+v", r)
	}
	// Stopped while paused: no hang, every process gone.
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := sb.Stop(stopCtx); err != nil {
		t.Fatalf("stop of a paused sandbox: %v", err)
	}
	select {
	case <-sb.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a paused sandbox's init did not end at Stop")
	}
	t.Logf("stop of a paused sandbox: %v", time.Since(t0))
	if err := p.Pause(ctx); err == nil {
		t.Error("Pause of a stopped sandbox succeeded")
	}
	if paused, err := p.Paused(); err != nil || paused {
		t.Errorf("Paused of a stopped sandbox = %v, %v", paused, err)
	}
}
