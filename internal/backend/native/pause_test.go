package native_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire"
)

// TestPauseAcrossRestart: a second backend on the same directories (a
// restarted server) finds a paused sandbox paused, from its cgroup, and
// resumes it.
func TestPauseAcrossRestart(t *testing.T) {
	b := newBackend(t)
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := backend.Config{ID: "pause-restart", Image: img}
	sb, err := b.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Remove(context.Background()) })
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.(backend.Pauser).Pause(ctx); err != nil {
		t.Fatal(err)
	}
	b2, err := native.New(native.Options{
		DataDir: sharedDirs.data, RunDir: sharedDirs.run, AgentPath: sharedDirs.agent, SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-test-%d", os.Getpid()),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b2.Close() }()
	sb2, err := b2.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.(*native.Sandbox).Pid() == 0 {
		t.Fatal("a paused sandbox was opened as stopped")
	}
	p2 := sb2.(backend.Pauser)
	if paused, err := p2.Paused(); err != nil || !paused {
		t.Fatalf("Paused after a restart = %v, %v", paused, err)
	}
	if err := p2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := backend.Exec(ectx, sb2, &wire.ExecRequest{Argv: []string{"/bin/true"}}, func(string, []byte) {})
	if err != nil || res.Code != 0 {
		t.Fatalf("exec after resuming through the new backend: %v %+v", err, res)
	}
	if err := sb2.Remove(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPauseResume is the target "pause + resume of a native sandbox
// <= 2 ms": one Pause and one Resume of a running, idle sandbox.
func BenchmarkPauseResume(b *testing.B) {
	be := newBackend(b)
	img, err := be.HostImage()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	sb, err := be.Create(ctx, backend.Config{ID: "bench-pause", Image: img})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sb.Remove(context.Background()) }()
	if err := sb.Start(ctx); err != nil {
		b.Fatal(err)
	}
	p := sb.(backend.Pauser)
	b.ResetTimer()
	for b.Loop() {
		if err := p.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		if err := p.Resume(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
