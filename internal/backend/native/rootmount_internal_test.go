package native

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestIdleRootsBounded: stopped sandboxes keep their roots for keepRoot,
// at most maxIdleRoots of them; a restart takes one back; Close releases
// every root. (The mounts are stand-ins here: what is tested is the
// bookkeeping; TestRootHeldAcrossStop holds real ones.)
func TestIdleRootsBounded(t *testing.T) {
	oldKeep, oldMax := keepRoot, maxIdleRoots
	defer func() { keepRoot, maxIdleRoots = oldKeep, oldMax }()
	keepRoot, maxIdleRoots = time.Hour, 2
	b := &Backend{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var sbs []*Sandbox
	for i := 0; i < 4; i++ {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := &Sandbox{b: b, root: &rootMount{fd: fd}}
		b.roots.mu.Lock()
		if b.roots.held == nil {
			b.roots.held = map[*Sandbox]bool{}
		}
		b.roots.held[s] = true
		b.roots.mu.Unlock()
		sbs = append(sbs, s)
	}
	held := func() (n int) {
		for _, s := range sbs {
			s.mu.Lock()
			if s.root != nil {
				n++
			}
			s.mu.Unlock()
		}
		return n
	}
	for _, s := range sbs[:3] {
		s.mu.Lock()
		s.idleRootLocked()
		s.mu.Unlock()
	}
	if n := held(); n != 3 || b.roots.idle != 2 {
		t.Errorf("3 stopped with room for 2: %d roots held (want 3: 2 idle, 1 running), %d idle", n, b.roots.idle)
	}
	sbs[0].mu.Lock()
	sbs[0].wakeRootLocked()
	sbs[0].mu.Unlock()
	if b.roots.idle != 1 || sbs[0].root == nil {
		t.Errorf("after a restart: %d idle, root %v", b.roots.idle, sbs[0].root)
	}
	keepRoot = 10 * time.Millisecond
	sbs[3].mu.Lock()
	sbs[3].idleRootLocked()
	sbs[3].mu.Unlock()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		sbs[3].mu.Lock()
		gone := sbs[3].root == nil
		sbs[3].mu.Unlock()
		if gone {
			break
		}
	}
	if sbs[3].root != nil {
		t.Error("a stopped root outlived keepRoot")
	}
	b.releaseRoots()
	if n := held(); n != 0 || b.roots.idle != 0 || len(b.roots.held) != 0 {
		t.Errorf("after releaseRoots: %d held, %d idle, %d tracked", n, b.roots.idle, len(b.roots.held))
	}
}
