package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// ckptBackend is the fake backend with checkpoints: a checkpoint writes a
// file into its directory (and fails, half-written, while fail is set); a
// restore records what it was given and starts a fake sandbox.
type ckptBackend struct {
	*fake.Backend
	mu       sync.Mutex
	fail     bool
	failName string            // Restore of this id fails
	restored map[string]string // id: hostname
}

type ckptSandbox struct {
	backend.Sandbox
	b *ckptBackend
}

func (s *ckptSandbox) Checkpoint(_ context.Context, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte("0123456789"), 0o600); err != nil {
		return err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.b.fail {
		return errors.New("checkpoint interrupted")
	}
	return nil
}

func (b *ckptBackend) Capabilities() backend.Capabilities {
	c := b.Backend.Capabilities()
	c.Checkpoint = true
	return c
}

func (b *ckptBackend) Create(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	sb, err := b.Backend.Create(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &ckptSandbox{sb, b}, nil
}

func (b *ckptBackend) Open(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	sb, err := b.Backend.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &ckptSandbox{sb, b}, nil
}

func (b *ckptBackend) Restore(ctx context.Context, cfg backend.Config, dir string) (backend.Sandbox, error) {
	if _, err := os.Stat(filepath.Join(dir, "state")); err != nil {
		return nil, err
	}
	b.mu.Lock()
	fail := cfg.Hostname == b.failName
	b.mu.Unlock()
	if fail {
		return nil, errors.New("restore failed")
	}
	sb, err := b.Create(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := sb.Start(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.restored[cfg.ID] = cfg.Hostname
	b.mu.Unlock()
	return sb, nil
}

func newCkptEnv(t *testing.T, pol *sandbox.NamespacePolicy) (*sandbox.Manager, *ckptBackend, string) {
	t.Helper()
	e := newEnv(t, sandbox.Options{})
	cb := &ckptBackend{Backend: e.be, restored: map[string]string{}}
	dir := t.TempDir()
	e.opts.Backend, e.opts.SnapshotDir = cb, dir
	e.opts.Policy = func(string) sandbox.NamespacePolicy { return *pol }
	return e.manager(t), cb, dir
}

func wantKind(t *testing.T, what string, err, kind error, says string) {
	t.Helper()
	if !errors.Is(err, kind) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %v, want %v saying %q", what, err, kind, says)
	}
}

// TestSnapshots: checkpoint, list, get, restore (a new sandbox with its
// name as hostname, admitted as a new one), fork, remove; the names'
// conflicts; a backend without checkpoints is unsupported, naming gvisor.
func TestSnapshots(t *testing.T) {
	m, cb, _ := newCkptEnv(t, &sandbox.NamespacePolicy{})
	ctx := t.Context()
	mustStart(t, m, "a", spec)
	s, err := m.Checkpoint(ctx, "ns", "a", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "s1" || s.Source != "a" || s.Bytes < 10 || s.Image != "base" || s.Created.IsZero() {
		t.Errorf("checkpoint: %+v", s)
	}
	if got, err := m.Snapshot("ns", "s1"); err != nil || got != s {
		t.Errorf("get: %+v, %v; want %+v", got, err, s)
	}
	_, err = m.Checkpoint(ctx, "ns", "a", "s1")
	wantKind(t, "a name taken", err, errdefs.ErrConflict, "already exists")
	info, err := m.Restore(ctx, "ns", "s1", "B_copy")
	if err != nil || info.State != sandbox.Running {
		t.Fatalf("restore: %+v, %v", info, err)
	}
	if h := cb.restored[info.ID]; h != "b-copy" {
		t.Errorf("restored hostname %q, want b-copy", h)
	}
	_, err = m.Restore(ctx, "ns", "s1", "a")
	wantKind(t, "restore onto a name taken", err, errdefs.ErrConflict, "already exists")
	_, err = m.Restore(ctx, "ns", "nope", "c")
	wantKind(t, "restore of no snapshot", err, errdefs.ErrNotFound, "no snapshot")
	copies, err := m.Fork(ctx, "ns", "a", 2, nil)
	if err != nil || len(copies) != 2 {
		t.Fatalf("fork: %+v, %v", copies, err)
	}
	for _, c := range copies {
		if st := state(t, m, c.Name); st != sandbox.Running {
			t.Errorf("fork %s: %s", c.Name, st)
		}
	}
	if list, err := m.Snapshots("ns"); err != nil || len(list) != 1 {
		t.Errorf("list after a fork (its own snapshot removed): %+v, %v", list, err)
	}
	if removed, err := m.RemoveSnapshot("ns", "s1"); !removed || err != nil {
		t.Errorf("remove: %v, %v", removed, err)
	}
	if removed, err := m.RemoveSnapshot("ns", "s1"); removed || err != nil {
		t.Errorf("remove again: %v, %v", removed, err)
	}

	// The fake backend as it is: no checkpoints.
	e := newEnv(t, sandbox.Options{})
	e.opts.SnapshotDir = t.TempDir()
	plain := e.manager(t)
	mustStart(t, plain, "n", spec)
	_, err = plain.Checkpoint(ctx, "ns", "n", "s")
	wantKind(t, "a backend without checkpoints", err, errdefs.ErrUnsupported, "with isolation gvisor")
}

// TestSnapshotQuotaAndFailures: max_snapshots and snapshot_bytes hold; a
// checkpoint that fails half-written leaves no snapshot and no files; a
// leftover of a crash is removed by the next manager; a fork whose one
// copy fails leaves none.
func TestSnapshotQuotaAndFailures(t *testing.T) {
	pol := &sandbox.NamespacePolicy{MaxSnapshots: 2}
	m, cb, dir := newCkptEnv(t, pol)
	ctx := t.Context()
	mustStart(t, m, "a", spec)
	for _, n := range []string{"s1", "s2"} {
		if _, err := m.Checkpoint(ctx, "ns", "a", n); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Checkpoint(ctx, "ns", "a", "s3")
	wantKind(t, "over max_snapshots", err, errdefs.ErrLimit, "max_snapshots")
	if _, err := m.RemoveSnapshot("ns", "s2"); err != nil {
		t.Fatal(err)
	}
	// Each snapshot here is 10 bytes: a fork takes one more's room.
	*pol = sandbox.NamespacePolicy{SnapshotBytes: 15}
	_, err = m.Fork(ctx, "ns", "a", 2, nil)
	wantKind(t, "over snapshot_bytes", err, errdefs.ErrLimit, "snapshot_bytes")
	if list, _ := m.Snapshots("ns"); len(list) != 1 {
		t.Errorf("snapshots after a refused one: %+v", list)
	}
	if _, err := m.RemoveSnapshot("ns", "s1"); err != nil {
		t.Fatal(err)
	}
	cb.mu.Lock()
	cb.failName = "will-fail"
	cb.mu.Unlock()
	infos, err := m.Fork(ctx, "ns", "a", 0, []string{"ok-copy", "will-fail"})
	if err == nil || infos != nil {
		t.Errorf("fork with a failing copy: %+v, %v", infos, err)
	}
	for _, n := range []string{"ok-copy", "will-fail"} {
		if !gone(m, n) {
			t.Errorf("%s left by a failed fork", n)
		}
	}

	cb.mu.Lock()
	cb.fail = true
	cb.mu.Unlock()
	if _, err := m.Checkpoint(ctx, "ns", "a", "half"); err == nil {
		t.Fatal("a failing checkpoint succeeded")
	}
	if st := state(t, m, "a"); st != sandbox.Running {
		t.Errorf("source after a failed checkpoint: %s", st)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "ns"))
	if len(ents) != 0 {
		t.Errorf("left by a failed checkpoint: %v", ents)
	}
	if _, err := m.Snapshot("ns", "half"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a failed checkpoint is listed: %v", err)
	}
	// A crash mid-checkpoint leaves its temporary directory: the next
	// manager removes it, and it was never listed.
	crash := filepath.Join(dir, "ns", ".tmp-crashed-123")
	if err := os.MkdirAll(filepath.Join(crash, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if list, _ := m.Snapshots("ns"); len(list) != 0 {
		t.Errorf("a half-written snapshot is listed: %+v", list)
	}
	e := newEnv(t, sandbox.Options{})
	e.opts.SnapshotDir = dir
	e.manager(t)
	if _, err := os.Stat(crash); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a crash's leftover survived a new manager: %v", err)
	}
}
