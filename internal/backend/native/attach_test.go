package native_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire"
)

// TestReattach is a daemon restart: a second backend on the same
// directories (a new process, as far as the sandbox can tell) opens a
// running sandbox, uses it, stops it; then opens it again stopped and
// starts it with its files kept.
func TestReattach(t *testing.T) {
	b := newBackend(t)
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := backend.Config{ID: "reattach", Image: img}
	sb, err := b.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Remove(context.Background()) })
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	run := func(sb backend.Sandbox, argv ...string) string {
		t.Helper()
		var out []byte
		res, err := backend.Exec(ctx, sb, &wire.ExecRequest{Argv: argv}, func(_ string, d []byte) { out = append(out, d...) })
		if err != nil || res.Code != 0 {
			t.Fatalf("%v: %v %+v", argv, err, res)
		}
		return string(out)
	}
	run(sb, "sh", "-c", "echo kept > /marker")

	b2, err := native.New(native.Options{
		DataDir: sharedDirs.data, RunDir: sharedDirs.run, AgentPath: sharedDirs.agent, SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-test-%d", os.Getpid()),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b2.Close() }()
	ids, err := b2.IDs()
	if err != nil || !slices.Contains(ids, "reattach") {
		t.Fatalf("IDs = %v, %v", ids, err)
	}
	sb2, err := b2.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.(*native.Sandbox).Pid() != sb.(*native.Sandbox).Pid() {
		t.Fatalf("reattached to pid %d, want %d", sb2.(*native.Sandbox).Pid(), sb.(*native.Sandbox).Pid())
	}
	if got := run(sb2, "cat", "/marker"); got != "kept\n" {
		t.Fatalf("marker = %q", got)
	}
	if st, err := sb2.Stats(); err != nil || st.Pids == 0 {
		t.Fatalf("stats through the reattached cgroup: %+v %v", st, err)
	}
	if err := sb2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// The first handle learns of the exit from its own wait for the
	// process it started, which may come a moment after sb2's.
	select {
	case <-sb.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("first handle did not see the agent end")
	}

	sb3, err := b2.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sb3.(*native.Sandbox).Pid() != 0 {
		t.Fatal("stopped sandbox opened as running")
	}
	if err := sb3.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := run(sb3, "cat", "/marker"); got != "kept\n" {
		t.Fatalf("after restart marker = %q", got)
	}
	if err := sb3.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Open(ctx, cfg); err == nil {
		t.Fatal("removed sandbox opened")
	}
}
