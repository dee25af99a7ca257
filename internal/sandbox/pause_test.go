package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

func paused(t *testing.T, e *env, id string) bool {
	t.Helper()
	p, err := e.be.Sandbox(id).Paused()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPause: pause and resume through the manager, the state each shows,
// leases refused while paused (conflict naming sandbox.resume) or taken
// with LeaseResume, a start that resumes, a stop of a paused sandbox, and
// a restart that finds it paused from the backend.
func TestPause(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	ctx := t.Context()
	info := mustStart(t, m, "a", spec)
	if err := m.Pause(ctx, "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if st := state(t, m, "a"); st != sandbox.Paused || !paused(t, e, info.ID) {
		t.Fatalf("after pause: %s, backend paused %v", st, paused(t, e, info.ID))
	}
	if err := m.Pause(ctx, "ns", "a"); err != nil {
		t.Errorf("second pause: %v", err)
	}
	if got := m.List(sandbox.Filter{State: sandbox.Paused}); len(got) != 1 || got[0].Name != "a" {
		t.Errorf("List(paused) = %v", got)
	}
	if got := m.CountByState()[[2]string{"ns", "paused"}]; got != 1 {
		t.Errorf("CountByState paused = %d", got)
	}
	if u, err := m.Usage("ns", "a"); err != nil || !u.Running || !u.Paused {
		t.Errorf("Usage = %+v, %v", u, err)
	}
	_, err := m.Lease("ns", "a")
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sandbox.resume") {
		t.Fatalf("lease of a paused sandbox: %v", err)
	}
	l, err := m.LeaseResume(ctx, "ns", "a")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if st := state(t, m, "a"); st != sandbox.Running || paused(t, e, info.ID) {
		t.Fatalf("after LeaseResume: %s", st)
	}
	logHas(t, m, "a", "paused (a pause was requested)")
	logHas(t, m, "a", "resumed")

	// A start resumes.
	if err := m.Pause(ctx, "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if got := mustStart(t, m, "a", spec); got.State != sandbox.Running || paused(t, e, info.ID) {
		t.Fatalf("start of a paused sandbox: %+v", got)
	}
	if err := m.Resume(ctx, "ns", "a"); err != nil {
		t.Errorf("resume of a running sandbox: %v", err)
	}

	// A restart finds it paused (from the backend: the database says
	// running) and leaves it so.
	if err := m.Pause(ctx, "ns", "a"); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m2 := e.manager(t)
	if st := state(t, m2, "a"); st != sandbox.Paused || !paused(t, e, info.ID) {
		t.Fatalf("after a restart: %s, backend paused %v", st, paused(t, e, info.ID))
	}
	if _, err := m2.Lease("ns", "a"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("lease after a restart: %v", err)
	}

	// Stopped while paused; then pause and resume are conflicts.
	if err := m2.Stop(ctx, "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if st := state(t, m2, "a"); st != sandbox.Stopped {
		t.Fatalf("stopped while paused: %s", st)
	}
	for _, f := range []func(context.Context, string, string) error{m2.Pause, m2.Resume} {
		if err := f(ctx, "ns", "a"); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("pause/resume of a stopped sandbox: %v", err)
		}
	}
	// Started again: running, not paused.
	if got := mustStart(t, m2, "a", spec); got.State != sandbox.Running {
		t.Errorf("restarted: %s", got.State)
	}
	if err := m2.Pause(ctx, "ns", "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("pause of a missing sandbox: %v", err)
	}
}

// TestIdlePause: with the idle action "pause" an idle sandbox is paused,
// not stopped; its maximum lifetime still stops it; a sandbox's own
// idle_action wins over the server's.
func TestIdlePause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, sandbox.Options{IdleTimeout: time.Minute, MaxLifetime: time.Hour, IdleAction: sandbox.IdlePause})
		m := e.manager(t)
		mustStart(t, m, "idle", spec)
		stopper := spec
		stopper.IdleAction = sandbox.IdleStop
		mustStart(t, m, "stopper", stopper)
		time.Sleep(90 * time.Second)
		synctest.Wait()
		if st := state(t, m, "idle"); st != sandbox.Paused {
			t.Errorf("idle after 90s: %s", st)
		}
		logHas(t, m, "idle", "paused (idle for 1m0s)")
		if st := state(t, m, "stopper"); st != sandbox.Stopped {
			t.Errorf("stopper after 90s: %s", st)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if st := state(t, m, "idle"); st != sandbox.Stopped {
			t.Errorf("paused sandbox past its lifetime: %s", st)
		}
		logHas(t, m, "idle", "maximum lifetime 1h0m0s reached")
	})
}

// unpausable hides the fake's Pauser: a backend that cannot pause.
type unpausable struct{ *fake.Backend }

type unpausableSandbox struct{ backend.Sandbox }

func (b unpausable) Create(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	sb, err := b.Backend.Create(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return unpausableSandbox{sb}, nil
}

func (b unpausable) Open(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	sb, err := b.Backend.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return unpausableSandbox{sb}, nil
}

// TestPauseUnsupported: a backend without Pauser answers unsupported,
// naming itself, and its idle sandboxes are stopped as if the idle
// action were stop.
func TestPauseUnsupported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, sandbox.Options{IdleTimeout: time.Minute, IdleAction: sandbox.IdlePause})
		e.opts.Backend = unpausable{e.be}
		m := e.manager(t)
		mustStart(t, m, "a", spec)
		err := m.Pause(t.Context(), "ns", "a")
		if !errors.Is(err, errdefs.ErrUnsupported) || !strings.Contains(err.Error(), "fake backend") {
			t.Fatalf("pause without Pauser: %v", err)
		}
		if st := state(t, m, "a"); st != sandbox.Running {
			t.Errorf("after a refused pause: %s", st)
		}
		time.Sleep(90 * time.Second)
		synctest.Wait()
		if st := state(t, m, "a"); st != sandbox.Stopped {
			t.Errorf("idle without Pauser: %s", st)
		}
	})
}

func TestIdleActionValidate(t *testing.T) {
	s := spec
	s.IdleAction = "hibernate"
	if err := s.Validate(); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "idle_action") {
		t.Errorf("Validate(idle_action hibernate) = %v", err)
	}
	e := newEnv(t, sandbox.Options{IdleAction: "hibernate"})
	if _, err := sandbox.New(t.Context(), e.opts); err == nil {
		t.Error("a manager with idle action hibernate was made")
	}
}

// TestPausedHoldsItsGrant: a paused sandbox keeps its memory and its
// processes, so it counts as running against the server's --max-running,
// its namespace's quotas and the host's capacity: pausing is no way round
// them.
func TestPausedHoldsItsGrant(t *testing.T) {
	e, m, _ := policyEnv(t, sandbox.Options{MaxRunning: 2}, map[string]sandbox.NamespacePolicy{
		"team-a": {TotalMemoryMiB: 1024},
	})
	ctx := t.Context()
	big := sandbox.Spec{Image: "base", MemoryMiB: 1024, CPUs: 0.5}
	if err := startIn(m, "team-a", "a", big); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(ctx, "team-a", "a"); err != nil {
		t.Fatal(err)
	}
	wantLimit(t, "namespace total memory with a paused sandbox", startIn(m, "team-a", "b", sandbox.Spec{Image: "base", MemoryMiB: 256, CPUs: 0.5}),
		`total_memory of 1024 MiB`)
	if err := startIn(m, "team-b", "c", big); err != nil {
		t.Fatal(err)
	}
	if n := m.Running(); n != 2 {
		t.Errorf("Running() = %d with one running and one paused, want 2", n)
	}
	if err := startIn(m, "team-b", "d", big); !errors.Is(err, errdefs.ErrLimit) {
		t.Errorf("a start beyond --max-running with one paused: %v", err)
	}
	if len(e.be.Running()) != 2 {
		t.Errorf("backend runs %d sandboxes, want 2", len(e.be.Running()))
	}
}
