package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
)

// The manager's own tests run against the fake backend: no root, every
// state reachable on demand, time under synctest's control. What the
// native backend does with a sandbox is the conformance suite's concern.

// env is a manager's surroundings: a fake backend and a real database,
// both outliving any one manager, as the host and the disk outlive a
// daemon.
type env struct {
	be   *fake.Backend
	db   *store.Store
	opts sandbox.Options
}

// images: "host" (no id, as the real host image) and "base", stored under
// an id.
var baseImage = &image.Image{Name: "base", ID: "sha256:b", Layers: []string{"/layers/b"}}

func resolve(_ context.Context, name string) (*image.Image, error) {
	switch name {
	case image.HostName:
		return &image.Image{Name: image.HostName, Layers: []string{"/"}}, nil
	case "base", baseImage.ID:
		img := *baseImage
		return &img, nil
	}
	return nil, fmt.Errorf("%q: %w", name, image.ErrNotFound)
}

func newEnv(t *testing.T, opts sandbox.Options) *env {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	be := fake.New()
	// Last in, first out: the managers close, then the "host" stops its
	// sandboxes, then the database closes.
	t.Cleanup(func() { _ = db.Close() })
	t.Cleanup(be.Close)
	opts.Backend, opts.DB, opts.Images = be, db.DB(), resolve
	if opts.LogDir == "" {
		opts.LogDir = filepath.Join(dir, "logs")
	}
	return &env{be: be, db: db, opts: opts}
}

// manager opens a manager on e, closed at the test's end.
func (e *env) manager(t *testing.T) *sandbox.Manager {
	t.Helper()
	m, err := sandbox.New(t.Context(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// rows counts the sandboxes the database records.
func (e *env) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.DB().QueryRow(`SELECT count(*) FROM sandboxes`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var spec = sandbox.Spec{Image: "base", MemoryMiB: 512, CPUs: 1}

func mustStart(t *testing.T, m *sandbox.Manager, name string, s sandbox.Spec) sandbox.Info {
	t.Helper()
	info, err := m.Start(t.Context(), "ns", name, s, false)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return info
}

func state(t *testing.T, m *sandbox.Manager, name string) sandbox.State {
	t.Helper()
	info, err := m.Get("ns", name)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return info.State
}

func gone(m *sandbox.Manager, name string) bool {
	_, err := m.Get("ns", name)
	return errors.Is(err, errdefs.ErrNotFound)
}

func logHas(t *testing.T, m *sandbox.Manager, name, want string) {
	t.Helper()
	lines, err := m.Logs("ns", name, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if strings.Contains(l, want) {
			return
		}
	}
	t.Errorf("log of %s lacks %q:\n%s", name, want, strings.Join(lines, "\n"))
}

// TestLifecycle: start, stop, restart and remove, each reflected in the
// manager, the backend and the database.
func TestLifecycle(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	info := mustStart(t, m, "a", spec)
	if info.State != sandbox.Running || info.Started.IsZero() {
		t.Fatalf("started: %+v", info)
	}
	sb := e.be.Sandbox(info.ID)
	if sb == nil || !slices.Equal(e.be.Running(), []string{info.ID}) {
		t.Fatalf("backend runs %v, want %s", e.be.Running(), info.ID)
	}
	cfg := sb.Config()
	if cfg.MemoryBytes != 512<<20 || cfg.CPUs != 1 || cfg.Image.ID != baseImage.ID {
		t.Errorf("backend config %+v", cfg)
	}
	// Starting a running sandbox changes nothing.
	starts := len(e.be.Calls())
	if again := mustStart(t, m, "a", sandbox.Spec{Image: "base", MemoryMiB: 64, CPUs: 1}); again.ID != info.ID || again.Spec.MemoryMiB != 512 {
		t.Errorf("second start: %+v", again)
	}
	if len(e.be.Calls()) != starts {
		t.Errorf("a start of a running sandbox called the backend: %v", e.be.Calls()[starts:])
	}
	if _, err := m.Start(t.Context(), "ns", "a", spec, true); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("create of an existing sandbox: %v", err)
	}

	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if st := state(t, m, "a"); st != sandbox.Stopped || len(e.be.Running()) != 0 {
		t.Fatalf("after stop: %s, backend runs %v", st, e.be.Running())
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Errorf("stop of a stopped sandbox: %v", err)
	}
	logHas(t, m, "a", "stopped: a stop was requested")

	// A restart keeps the id (and so the files) and applies the new spec.
	info = mustStart(t, m, "a", sandbox.Spec{Image: "base", MemoryMiB: 256, CPUs: 2})
	if info.ID != sb.ID() || info.State != sandbox.Running {
		t.Fatalf("restart: %+v", info)
	}
	if cfg := sb.Config(); cfg.MemoryBytes != 256<<20 || cfg.CPUs != 2 {
		t.Errorf("restart config %+v", cfg)
	}

	if ok, err := m.Remove(t.Context(), "ns", "a"); !ok || err != nil {
		t.Fatalf("remove: %v %v", ok, err)
	}
	if !gone(m, "a") || e.be.Sandbox(info.ID) != nil || e.rows(t) != 0 {
		t.Errorf("after remove: manager has it %v, backend %v, rows %d", !gone(m, "a"), e.be.Sandbox(info.ID), e.rows(t))
	}
	if ok, err := m.Remove(t.Context(), "ns", "a"); ok || err != nil {
		t.Errorf("second remove: %v %v", ok, err)
	}
	if err := m.Stop(t.Context(), "ns", "a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("stop of a removed sandbox: %v", err)
	}
}

// TestStartDuringStart: a second start of a sandbox that is starting is
// told so; a stop during a start waits for it and then stops.
func TestStartDuringStart(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	entered, release := make(chan struct{}), make(chan struct{})
	e.be.SetStartHook(func(string) error { close(entered); <-release; return nil })
	done := make(chan error, 1)
	go func() {
		_, err := m.Start(context.Background(), "ns", "a", spec, false)
		done <- err
	}()
	<-entered
	if st := state(t, m, "a"); st != sandbox.Starting {
		t.Fatalf("state during the start: %s", st)
	}
	if _, err := m.Start(t.Context(), "ns", "a", spec, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("start during a start: %v", err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- m.Stop(context.Background(), "ns", "a") }()
	select {
	case err := <-stopped:
		t.Fatalf("stop returned during the start: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if st := state(t, m, "a"); st != sandbox.Stopped || len(e.be.Running()) != 0 {
		t.Errorf("after start then stop: %s, backend runs %v", st, e.be.Running())
	}
}

// TestConcurrentLifecycle: starts, stops and removals of one name from
// many goroutines leave the manager, the backend and the database in
// agreement, whatever the order (run with -race).
func TestConcurrentLifecycle(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	var wg sync.WaitGroup
	for g := range 8 {
		r := rand.New(rand.NewPCG(uint64(g), 1))
		wg.Go(func() {
			for range 30 {
				var err error
				switch r.IntN(3) {
				case 0:
					_, err = m.Start(context.Background(), "ns", "a", spec, false)
					if errors.Is(err, errdefs.ErrConflict) {
						err = nil // starting or stopping: another goroutine's
					}
				case 1:
					err = m.Stop(context.Background(), "ns", "a")
					if errors.Is(err, errdefs.ErrNotFound) {
						err = nil
					}
				case 2:
					_, err = m.Remove(context.Background(), "ns", "a")
				}
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	ids, _ := e.be.IDs()
	info, err := m.Get("ns", "a")
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if len(ids) != 0 || e.rows(t) != 0 {
			t.Errorf("removed, but the backend holds %v and the database %d rows", ids, e.rows(t))
		}
	case err != nil:
		t.Fatal(err)
	default:
		if !slices.Equal(ids, []string{info.ID}) || e.rows(t) != 1 {
			t.Errorf("%s holds the name; the backend holds %v and the database %d rows", info.ID, ids, e.rows(t))
		}
		running := slices.Equal(e.be.Running(), []string{info.ID})
		if (info.State == sandbox.Running) != running {
			t.Errorf("manager says %s, backend running: %v", info.State, running)
		}
	}
}

// TestLimits: MaxRunning bounds what runs (a stop frees a place), and
// MaxSandboxes what exists (stopped ones count, a removal frees a place).
func TestLimits(t *testing.T) {
	e := newEnv(t, sandbox.Options{MaxRunning: 2, MaxSandboxes: 3})
	m := e.manager(t)
	mustStart(t, m, "a", spec)
	mustStart(t, m, "b", spec)
	if _, err := m.Start(t.Context(), "ns", "c", spec, false); !errors.Is(err, errdefs.ErrLimit) {
		t.Fatalf("third running: %v", err)
	}
	if !gone(m, "c") {
		t.Error("a start refused by the limit left a record")
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	// A stopped sandbox's restart counts against MaxRunning too.
	mustStart(t, m, "c", spec)
	if _, err := m.Start(t.Context(), "ns", "a", spec, false); !errors.Is(err, errdefs.ErrLimit) {
		t.Errorf("restart past MaxRunning: %v", err)
	}
	if err := m.Stop(t.Context(), "ns", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(t.Context(), "ns", "d", spec, false); !errors.Is(err, errdefs.ErrLimit) {
		t.Errorf("fourth sandbox: %v", err)
	}
	if _, err := m.Remove(t.Context(), "ns", "b"); err != nil {
		t.Fatal(err)
	}
	mustStart(t, m, "d", spec)
	if n := len(e.be.Running()); n != 2 {
		t.Errorf("backend runs %d", n)
	}
}

// TestRefusedFirstStart: a first start refused as invalid (an image the
// store lacks, a refusal by the backend) leaves no record, no name taken,
// nothing on the host; a start that fails otherwise leaves the sandbox
// errored with the reason, and a later start recovers it.
func TestRefusedFirstStart(t *testing.T) {
	e := newEnv(t, sandbox.Options{MaxSandboxes: 1})
	m := e.manager(t)
	_, err := m.Start(t.Context(), "ns", "a", sandbox.Spec{Image: "nonesuch", MemoryMiB: 512, CPUs: 1}, false)
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unknown image: %v", err)
	}
	e.be.SetStartHook(func(string) error { return errdefs.Errorf(errdefs.ErrInvalid, "refused") })
	if _, err := m.Start(t.Context(), "ns", "a", spec, false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("refused by the backend: %v", err)
	}
	if !gone(m, "a") || e.rows(t) != 0 {
		t.Fatalf("refused starts left a record (rows %d)", e.rows(t))
	}
	if ids, _ := e.be.IDs(); len(ids) != 0 {
		t.Fatalf("refused starts left %v on the host", ids)
	}

	// Not a refusal: the sandbox stays, errored, and counts.
	e.be.SetStartHook(func(string) error { return errors.New("no memory today") })
	if _, err := m.Start(t.Context(), "ns", "a", spec, false); err == nil || !strings.Contains(err.Error(), "no memory today") {
		t.Fatalf("failed start: %v", err)
	}
	info, err := m.Get("ns", "a")
	if err != nil || info.State != sandbox.Error || !strings.Contains(info.Error, "no memory today") {
		t.Fatalf("after a failed start: %+v %v", info, err)
	}
	if _, err := m.Start(t.Context(), "ns", "b", spec, false); !errors.Is(err, errdefs.ErrLimit) {
		t.Errorf("the errored sandbox does not count: %v", err)
	}
	logHas(t, m, "a", "start failed")
	// A refusal of a later start keeps the record: the sandbox existed.
	e.be.SetStartHook(func(string) error { return errdefs.Errorf(errdefs.ErrInvalid, "refused again") })
	if _, err := m.Start(t.Context(), "ns", "a", spec, false); err == nil {
		t.Fatal("refused restart succeeded")
	}
	if st := state(t, m, "a"); st != sandbox.Error {
		t.Errorf("after a refused restart: %s", st)
	}
	e.be.SetStartHook(nil)
	if info := mustStart(t, m, "a", spec); info.Error != "" {
		t.Errorf("recovered sandbox keeps the error %q", info.Error)
	}
}

// TestInitDies: an init that exits on its own marks the sandbox errored
// (persisted, logged) and releases it in the backend.
func TestInitDies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, sandbox.Options{})
		m := e.manager(t)
		info := mustStart(t, m, "a", spec)
		stops := func() int {
			n := 0
			for _, c := range e.be.Calls() {
				if c == (fake.Call{Op: "stop", ID: info.ID}) {
					n++
				}
			}
			return n
		}
		e.be.Sandbox(info.ID).Die()
		synctest.Wait()
		got, _ := m.Get("ns", "a")
		if got.State != sandbox.Error || !strings.Contains(got.Error, "init exited unexpectedly") || got.Stopped.IsZero() {
			t.Fatalf("after the init died: %+v", got)
		}
		if stops() != 1 {
			t.Errorf("backend stops: %d, want 1", stops())
		}
		logHas(t, m, "a", "init exited unexpectedly")
		var st string
		if err := e.db.DB().QueryRow(`SELECT state FROM sandboxes WHERE id = ?`, info.ID).Scan(&st); err != nil || st != "error" {
			t.Errorf("persisted state %q %v", st, err)
		}
		// An errored sandbox can be stopped, and started again.
		if err := m.Stop(t.Context(), "ns", "a"); err != nil {
			t.Fatal(err)
		}
		if info := mustStart(t, m, "a", spec); info.State != sandbox.Running {
			t.Errorf("restart: %+v", info)
		}
		// A stop is not a death.
		if err := m.Stop(t.Context(), "ns", "a"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st := state(t, m, "a"); st != sandbox.Stopped {
			t.Errorf("after a stop: %s", st)
		}
	})
}

// TestTimeouts: the janitor stops idle sandboxes and those past their
// lifetime (the server's defaults or the spec's own), and removes stopped
// ones past the retention.
func TestTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, sandbox.Options{IdleTimeout: time.Minute, MaxLifetime: time.Hour, StoppedRetention: 2 * time.Hour})
		m := e.manager(t)
		mustStart(t, m, "idle", spec)
		patient := spec
		patient.IdleTimeout = 5 * time.Minute
		mustStart(t, m, "patient", patient)
		short := spec
		short.MaxLifetime = 10 * time.Minute
		mustStart(t, m, "short", short)
		busy := mustStart(t, m, "busy", spec)

		// keep touches "short" and "busy" every 30 s (a start of a
		// running sandbox counts as activity) until t reaches until.
		t0 := time.Now()
		keep := func(until time.Duration) {
			for time.Since(t0) < until {
				time.Sleep(30 * time.Second)
				for _, n := range []string{"short", "busy"} {
					if st := state(t, m, n); st == sandbox.Running {
						mustStart(t, m, n, spec)
					}
				}
				synctest.Wait()
			}
		}
		keep(90 * time.Second)
		if st := state(t, m, "idle"); st != sandbox.Stopped {
			t.Errorf("idle after 90s: %s", st)
		}
		logHas(t, m, "idle", "stopped: idle for 1m0s")
		for _, n := range []string{"patient", "short", "busy"} {
			if st := state(t, m, n); st != sandbox.Running {
				t.Errorf("%s after 90s: %s", n, st)
			}
		}
		keep(7 * time.Minute)
		if st := state(t, m, "patient"); st != sandbox.Stopped {
			t.Errorf("patient after 7m: %s", st)
		}
		keep(11 * time.Minute)
		if st := state(t, m, "short"); st != sandbox.Stopped {
			t.Errorf("short after 11m: %s", st)
		}
		logHas(t, m, "short", "maximum lifetime 10m0s reached")
		if st := state(t, m, "busy"); st != sandbox.Running {
			t.Errorf("busy after 11m: %s", st)
		}
		keep(61 * time.Minute)
		if st := state(t, m, "busy"); st != sandbox.Stopped {
			t.Errorf("busy after 61m: %s", st)
		}
		logHas(t, m, "busy", "maximum lifetime 1h0m0s reached")

		// Retention: "idle" stopped at about 1m, so it goes after about
		// 2h1m; "busy", stopped at about 1h, stays until about 3h.
		time.Sleep(2*time.Hour + 2*time.Minute - time.Since(t0))
		synctest.Wait()
		if !gone(m, "idle") || e.be.Sandbox("idle") != nil {
			t.Error("idle was kept past the retention")
		}
		if gone(m, "busy") || e.be.Sandbox(busy.ID) == nil {
			t.Error("busy was removed before its retention")
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if len(m.List(sandbox.Filter{})) != 0 || e.rows(t) != 0 {
			t.Errorf("left after every retention: %v, rows %d", m.List(sandbox.Filter{}), e.rows(t))
		}
		if ids, _ := e.be.IDs(); len(ids) != 0 {
			t.Errorf("left on the host: %v", ids)
		}
	})
}

// TestRecover: a new manager on the same database and host reattaches to
// the sandboxes that still run, marks those whose init died errored,
// finishes a half-done stop, and removes what the database does not know.
func TestRecover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, sandbox.Options{})
		m1, err := sandbox.New(t.Context(), e.opts)
		if err != nil {
			t.Fatal(err)
		}
		alive := mustStart(t, m1, "alive", spec)
		dead := mustStart(t, m1, "dead", spec)
		half := mustStart(t, m1, "half", spec)
		gone := mustStart(t, m1, "gone", spec)
		mustStart(t, m1, "stopped", spec)
		if err := m1.Stop(t.Context(), "ns", "stopped"); err != nil {
			t.Fatal(err)
		}
		m1.Close()

		// While no daemon runs: one init dies, one sandbox is recorded
		// mid-stop, and the host holds a sandbox no one recorded.
		e.be.Sandbox(dead.ID).Die()
		if _, err := e.db.DB().Exec(`UPDATE sandboxes SET state = 'stopping' WHERE id = ?`, half.ID); err != nil {
			t.Fatal(err)
		}
		// A remove the daemon was killed in: its intent recorded, the host
		// still holding the sandbox.
		if _, err := e.db.DB().Exec(`UPDATE sandboxes SET state = 'removing' WHERE id = ?`, gone.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := e.be.Create(t.Context(), backend.Config{ID: "sb-orphan", Image: &image.Image{Layers: []string{"/"}}}); err != nil {
			t.Fatal(err)
		}
		calls := len(e.be.Calls())

		m2 := e.manager(t)
		for name, want := range map[string]sandbox.State{"alive": sandbox.Running, "dead": sandbox.Error, "half": sandbox.Stopped, "stopped": sandbox.Stopped} {
			if st := state(t, m2, name); st != want {
				t.Errorf("%s: %s, want %s", name, st, want)
			}
		}
		if info, _ := m2.Get("ns", "dead"); !strings.Contains(info.Error, "agent was not running") {
			t.Errorf("dead's error: %q", info.Error)
		}
		if !slices.Equal(e.be.Running(), []string{alive.ID}) {
			t.Errorf("backend runs %v, want only %s", e.be.Running(), alive.ID)
		}
		if e.be.Sandbox("sb-orphan") != nil {
			t.Error("the orphan was kept")
		}
		if _, err := m2.Get("ns", "gone"); err == nil || e.be.Sandbox(gone.ID) != nil {
			t.Errorf("a removal cut short: get %v, on the backend %v; want both gone", err, e.be.Sandbox(gone.ID) != nil)
		}
		var rows int
		if err := e.db.DB().QueryRow(`SELECT count(*) FROM sandboxes WHERE id = ?`, gone.ID).Scan(&rows); err != nil || rows != 0 {
			t.Errorf("a removal cut short left %d rows (%v)", rows, err)
		}
		for _, c := range e.be.Calls()[calls:] {
			if c.Op == "start" || c.Op == "create" {
				t.Errorf("recovery called %v", c)
			}
		}
		if !slices.Contains(e.be.Calls()[calls:], fake.Call{Op: "reap"}) {
			t.Error("recovery did not reap the backend's orphans")
		}
		logHas(t, m2, "alive", "reattached after a daemon restart")

		// The reattached sandbox is watched and usable as before.
		if err := m2.Stop(t.Context(), "ns", "half"); err != nil {
			t.Fatal(err)
		}
		e.be.Sandbox(alive.ID).Die()
		synctest.Wait()
		if st := state(t, m2, "alive"); st != sandbox.Error {
			t.Errorf("reattached sandbox after its init died: %s", st)
		}
		if info := mustStart(t, m2, "stopped", spec); info.State != sandbox.Running {
			t.Errorf("restart after recovery: %+v", info)
		}
	})
}

// TestUsage: usage comes from the backend's stats and, where the backend
// has the ability, its disk measurement.
func TestUsage(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	info := mustStart(t, m, "a", spec)
	sb := e.be.Sandbox(info.ID)
	sb.SetStats(backend.Stats{MemoryBytes: 3<<20 + 1})
	sb.SetDiskUsage(4096)
	u, err := m.Usage("ns", "a")
	if err != nil {
		t.Fatal(err)
	}
	if !u.Running || u.MemoryMiB == nil || *u.MemoryMiB != 4 || u.DiskBytes == nil || *u.DiskBytes != 4096 || u.CPUPercent == nil {
		t.Errorf("usage %+v", u)
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if u, err := m.Usage("ns", "a"); err != nil || u.Running || u.MemoryMiB != nil || u.DiskBytes == nil {
		t.Errorf("usage when stopped: %+v %v", u, err)
	}
}

// TestSpecValidate: the server's policy and the backend's bounds, each
// checked once, reported together as invalid.
func TestSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec sandbox.Spec
		want string // "" = valid
	}{
		{"defaults", sandbox.Spec{}, ""},
		{"memory minimum", sandbox.Spec{MemoryMiB: 16}, ""},
		{"memory below the backend's minimum", sandbox.Spec{MemoryMiB: 8}, "below the 16 MiB minimum"},
		{"memory above the server's maximum", sandbox.Spec{MemoryMiB: sandbox.MaxMemoryMiB + 1}, "at most 1048576"},
		{"memory that would overflow in bytes", sandbox.Spec{MemoryMiB: 1 << 50}, "at most"},
		{"memory negative", sandbox.Spec{MemoryMiB: -1}, "memory: negative"},
		{"cpus above the server's maximum", sandbox.Spec{CPUs: 257}, "at most 256 on this server"},
		{"cpus below the kernel's quota", sandbox.Spec{CPUs: 0.001}, "0.01"},
		{"cpus NaN", sandbox.Spec{CPUs: math.NaN()}, "NaN"},
		{"workdir relative", sandbox.Spec{Workdir: "w"}, "want an absolute path"},
		{"volume target /proc", sandbox.Spec{Volumes: []backend.Volume{{Source: "/x", Target: "/proc"}}}, "/proc"},
		{"env", sandbox.Spec{Env: []string{"=x"}}, "want K=V"},
		{"label", sandbox.Spec{Labels: map[string]string{"": "x"}}, "label"},
		{"idle timeout", sandbox.Spec{IdleTimeout: sandbox.MaxPeriod + 1}, "idle_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("accepted %+v", tc.spec)
			case tc.want != "" && (!strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalid)):
				t.Errorf("error %q lacks %q or is not invalid", err, tc.want)
			}
		})
	}
}

// TestSpecDefaults: what a spec leaves unset is the server's default,
// recorded in the sandbox's spec and passed on to the backend.
func TestSpecDefaults(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	info := mustStart(t, m, "a", sandbox.Spec{Image: "base"})
	if info.Spec.MemoryMiB != backend.DefaultMemoryBytes>>20 || info.Spec.CPUs != backend.DefaultCPUs {
		t.Errorf("spec %+v", info.Spec)
	}
	cfg := e.be.Sandbox(info.ID).Config()
	if cfg.MemoryBytes != backend.DefaultMemoryBytes || cfg.CPUs != backend.DefaultCPUs || cfg.PidsMax != backend.DefaultPids {
		t.Errorf("backend config %+v", cfg)
	}
	// No image named: the default one, which this server's store lacks.
	if _, err := m.Start(t.Context(), "ns", "b", sandbox.Spec{}, false); err == nil || !strings.Contains(err.Error(), sandbox.DefaultImage) {
		t.Errorf("start without an image: %v", err)
	}
}

// TestReadsDuringFirstStart: what the API reads of a sandbox while its
// first start runs (usage, logs, state) is safe to read then; the race
// detector sees the start's writes of its backend handle and log.
func TestReadsDuringFirstStart(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	for i := range 20 {
		name := fmt.Sprintf("s%d", i)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-done:
					return
				default:
				}
				_, _ = m.Usage("ns", name)
				_, _ = m.Logs("ns", name, 1)
				_, _ = m.Get("ns", name)
			}
		}()
		mustStart(t, m, name, spec)
		done <- struct{}{}
		<-done
	}
}

// TestImagePinnedAcrossRestart: a sandbox keeps the image it first started
// from when the server restarts with its image name mapped elsewhere, the
// host image's language view included (its pin is the view's name, there
// being no id). The resolver maps "python" as the server's flag says.
func TestImagePinnedAcrossRestart(t *testing.T) {
	python := image.HostName
	e := newEnv(t, sandbox.Options{})
	e.opts.Images = func(ctx context.Context, name string) (*image.Image, error) {
		switch name {
		case "python":
			if python == image.HostName {
				return &image.Image{Name: "host+python", Layers: []string{"/"}}, nil
			}
			name = python
		case "host+python":
			return &image.Image{Name: "host+python", Layers: []string{"/"}}, nil
		}
		return resolve(ctx, name)
	}
	m1, err := sandbox.New(t.Context(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	info := mustStart(t, m1, "py", sandbox.Spec{Image: "python", MemoryMiB: 512, CPUs: 1})
	if err := m1.Stop(t.Context(), "ns", "py"); err != nil {
		t.Fatal(err)
	}
	m1.Close()

	python = "base" // warren serve --python-image base
	m2 := e.manager(t)
	mustStart(t, m2, "py", sandbox.Spec{})
	if got := e.be.Sandbox(info.ID).Config().Image; got.Name != "host+python" || slices.Equal(got.Layers, baseImage.Layers) {
		t.Errorf("after the restart the sandbox starts from %+v, want the host's python view it first started from", got)
	}
	// A new sandbox takes the new mapping.
	fresh := mustStart(t, m2, "py2", sandbox.Spec{Image: "python", MemoryMiB: 512, CPUs: 1})
	if got := e.be.Sandbox(fresh.ID).Config().Image; got.ID != baseImage.ID {
		t.Errorf("a new python sandbox starts from %+v, want base", got)
	}
}

// TestUsageCPUHeldToLimit: the CPU percentage is the counter's growth over
// the sampling interval, held to the sandbox's CPU limit (an interval not
// aligned with the quota's periods can count up to a period more).
func TestUsageCPUHeldToLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, sandbox.Options{Tick: time.Second})
		m := e.manager(t)
		for _, tc := range []struct {
			name string
			cpus float64
			want float64
		}{{"one", 1, 100}, {"two", 2, 110}} {
			info := mustStart(t, m, tc.name, sandbox.Spec{Image: "base", MemoryMiB: 512, CPUs: tc.cpus})
			sb := e.be.Sandbox(info.ID)
			// 1.1 s of CPU per second of wall time, from the start on.
			t0 := time.Now()
			for i := 1; i <= 3; i++ {
				sb.SetStats(backend.Stats{CPUUsage: time.Duration(float64(time.Since(t0)+time.Second) * 1.1)})
				time.Sleep(time.Second)
				synctest.Wait()
			}
			u, err := m.Usage("ns", tc.name)
			if err != nil || u.CPUPercent == nil {
				t.Fatalf("%s: %+v %v", tc.name, u, err)
			}
			if got := *u.CPUPercent; math.Abs(got-tc.want) > 0.01 {
				t.Errorf("%s (%g cpus): cpu %.2f%%, want %g%%", tc.name, tc.cpus, got, tc.want)
			}
		}
	})
}

// TestUsageFirstIntervalHeldToLimit: before the first sample the average
// since the start is reported, held to the limit as samples are (an SDK
// client saw 167% of a 1-CPU sandbox on a loaded host).
func TestUsageFirstIntervalHeldToLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, sandbox.Options{Tick: time.Hour})
		m := e.manager(t)
		info := mustStart(t, m, "first", sandbox.Spec{Image: "base", MemoryMiB: 512, CPUs: 1})
		sb := e.be.Sandbox(info.ID)
		time.Sleep(time.Second)
		sb.SetStats(backend.Stats{CPUUsage: 1700 * time.Millisecond})
		u, err := m.Usage("ns", "first")
		if err != nil || u.CPUPercent == nil {
			t.Fatalf("%+v %v", u, err)
		}
		if got := *u.CPUPercent; got > 100 || got < 99 {
			t.Errorf("cpu %.2f%% over the first interval, want 100%% (held to 1 CPU)", got)
		}
	})
}
