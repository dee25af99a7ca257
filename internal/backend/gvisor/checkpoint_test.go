package gvisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire"
)

// repl runs code in sb's Python REPL and returns its result.
func repl(t testing.TB, sb backend.Sandbox, code string) string {
	t.Helper()
	r, err := sb.Agent().Repl(context.Background(), wire.ReplRequest{Language: "python", Code: code})
	if err != nil {
		t.Fatalf("repl %q: %v", code, err)
	}
	if r.Status != wire.ReplSuccess {
		t.Fatalf("repl %q: %+v", code, r)
	}
	if r.Result == nil {
		return ""
	}
	return *r.Result
}

func run(t testing.TB, sb backend.Sandbox, argv ...string) string {
	t.Helper()
	r := conformance.Exec(t, sb, 30*time.Second, argv...)
	if r.Code != 0 {
		t.Fatalf("%v: exit %d: %s", argv, r.Code, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// warmSnapshot is the host's leftovers after one sandbox ran: what runsc
// makes once per backend (its null network namespace) is there from then.
func warmSnapshot(t *testing.T, h *conformance.Harness) (string, error) {
	t.Helper()
	sb, err := h.Backend.Create(context.Background(), backend.Config{ID: fmt.Sprintf("warm-%d", os.Getpid()), Image: h.Image})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sb.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h.Snapshot()
}

// TestCheckpointRestore checkpoints a sandbox with REPL state, a file and
// a background process; the source runs on, and two copies restored from
// the snapshot have all three, a hostname of their own, and are
// independent of the source and of each other. Sandbox code cannot hand
// the agent a control socket of its own. Nothing is left after.
func TestCheckpointRestore(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*gvisor.Backend)
	before, err := warmSnapshot(t, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var sbs []backend.Sandbox
	defer func() {
		for _, sb := range sbs {
			if err := sb.Remove(context.Background()); err != nil {
				t.Error(err)
			}
		}
		after, err := h.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("left on the host:\n%s\nbefore:\n%s", after, before)
		}
	}()
	src, err := b.Create(ctx, backend.Config{ID: fmt.Sprintf("ckpt-%d", os.Getpid()), Image: h.Image, Hostname: "source"})
	if err != nil {
		t.Fatal(err)
	}
	sbs = append(sbs, src)
	if err := src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	repl(t, src, "x = 41")
	run(t, src, "sh", "-c", "echo kept > /tmp/f")
	p, err := src.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: []string{"sh", "-c", "while :; do sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	// Sandbox code (root, without the host's CAP_SYS_ADMIN grant) cannot
	// attach a socket of its own, nor rename the sandbox.
	r := conformance.Exec(t, src, 30*time.Second, "sh", "-c", "/dev/.warren-agent attach evil 3</dev/null")
	if r.Code == 0 {
		t.Errorf("an attach from inside succeeded: %s", r.Stdout)
	}
	if got := run(t, src, "hostname"); got != "source" {
		t.Errorf("hostname %q after an attach from inside", got)
	}

	snap := filepath.Join(t.TempDir(), "snap")
	if err := src.(*gvisor.Sandbox).Checkpoint(ctx, snap); err != nil {
		t.Fatal(err)
	}
	// The source runs on, its connection new.
	if got := repl(t, src, "x"); got != "41" {
		t.Errorf("source after checkpoint: x = %s", got)
	}
	repl(t, src, "x = 7")
	run(t, src, "sh", "-c", "echo changed > /tmp/f")

	var copies []backend.Sandbox
	for i := range 2 {
		cfg := backend.Config{ID: fmt.Sprintf("copy-%d-%d", os.Getpid(), i), Image: h.Image, Hostname: fmt.Sprintf("copy%d", i)}
		sb, err := b.Restore(ctx, cfg, snap)
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
		copies = append(copies, sb)
	}
	for i, c := range copies {
		if c.(*gvisor.Sandbox).Pid() <= 0 {
			t.Errorf("copy %d: no sentry pid", i)
		}
		if got := repl(t, c, "x + 1"); got != "42" {
			t.Errorf("copy %d: x + 1 = %s, want 42", i, got)
		}
		if got := run(t, c, "cat", "/tmp/f"); got != "kept" {
			t.Errorf("copy %d: /tmp/f = %q", i, got)
		}
		if got := run(t, c, "hostname"); got != fmt.Sprintf("copy%d", i) {
			t.Errorf("copy %d: hostname %q", i, got)
		}
		ps, err := c.Agent().Processes(ctx)
		if err != nil || len(ps) != 1 || ps[0].ID != p.ID || !ps[0].Running {
			t.Errorf("copy %d: processes %+v, %v; want %s running", i, ps, err, p.ID)
		}
	}
	repl(t, copies[0], "x = 100")
	if got := repl(t, copies[1], "x"); got != "41" {
		t.Errorf("copy 1 sees copy 0's x: %s", got)
	}
	if got := repl(t, src, "x"); got != "7" {
		t.Errorf("source sees a copy's x: %s", got)
	}
	if got := run(t, src, "cat", "/tmp/f"); got != "changed" {
		t.Errorf("source /tmp/f = %q", got)
	}
	// A checkpoint of a restored copy works as well (its agent detaches
	// from the socket the restore attached).
	if err := copies[0].(*gvisor.Sandbox).Checkpoint(ctx, filepath.Join(t.TempDir(), "again")); err != nil {
		t.Fatal(err)
	}
	if got := repl(t, copies[0], "x"); got != "100" {
		t.Errorf("copy 0 after its checkpoint: x = %s", got)
	}
}

// TestRestoreBadSnapshot: a restore from a snapshot that is not one fails
// with the reason and leaves nothing.
func TestRestoreBadSnapshot(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*gvisor.Backend)
	before, err := warmSnapshot(t, h)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{"checkpoint", "upper"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint", "checkpoint.img"), []byte("not a checkpoint"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := backend.Config{ID: fmt.Sprintf("bad-%d", os.Getpid()), Image: h.Image}
	// Another build's agent: refused before anything runs.
	if err := os.WriteFile(filepath.Join(dir, "agent"), []byte("/old/warren-agent-0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Restore(context.Background(), cfg, dir); !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "another warren build") {
		t.Errorf("restore with another agent: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agent"), []byte(testenv.AgentBinary(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = b.Restore(context.Background(), cfg, dir)
	if err == nil {
		t.Fatal("restore of garbage succeeded")
	}
	t.Logf("restore of garbage: %v", err)
	if after, _ := h.Snapshot(); after != before {
		t.Errorf("left on the host:\n%s\nbefore:\n%s", after, before)
	}
}
