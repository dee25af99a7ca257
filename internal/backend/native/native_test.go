package native_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/timerslack"
	"github.com/warren-sandbox/warren/internal/wire"
)

var (
	shared     *native.Backend
	sharedErr  error
	sharedOnce sync.Once
	sharedDirs struct{ data, run, agent string }
)

// newBackend returns the package's shared backend, on a data directory of
// its own. Privileged: fails under WARREN_TEST_PRIVILEGED=1 without root.
func newBackend(t testing.TB) *native.Backend {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireFile(t, "/usr/bin/python3")
	agentPath, spawnerPath := testenv.AgentBinary(t), testenv.SpawnerBinary(t)
	sharedOnce.Do(func() {
		base, err := os.MkdirTemp("", "warren-native-test-")
		if err != nil {
			sharedErr = err
			return
		}
		// Sandbox root maps to an unprivileged uid that must reach the data dir.
		if err := os.Chmod(base, 0o711); err != nil {
			sharedErr = err
			return
		}
		sharedDirs.data, sharedDirs.run, sharedDirs.agent = filepath.Join(base, "data"), filepath.Join(base, "run"), agentPath
		shared, sharedErr = native.New(native.Options{
			DataDir: sharedDirs.data, RunDir: sharedDirs.run, AgentPath: agentPath, SpawnerPath: spawnerPath,
			CgroupPrefix: fmt.Sprintf("warren-test-%d", os.Getpid()),
		})
	})
	if sharedErr != nil {
		t.Fatalf("native backend: %v", sharedErr)
	}
	return shared
}

// legacyBackend returns a backend on data and run directories of its own
// whose sandboxes all run as the storage uid range (UIDRangesOff), closed
// at the end of the test.
func legacyBackend(t *testing.T) (b *native.Backend, data, run string) {
	t.Helper()
	base := t.TempDir()
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	data, run = filepath.Join(base, "data"), filepath.Join(base, "run")
	b, err := native.New(native.Options{
		DataDir: data, RunDir: run, AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-test-legacy-%d", os.Getpid()), UIDRanges: native.UIDRangesOff,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = b.ReapOrphans(nil)
		_ = b.Close()
	})
	if b.UIDRanges() {
		t.Fatal("uid ranges off, yet on")
	}
	return b, data, run
}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilt()
	if shared != nil {
		_, _ = shared.ReapOrphans(nil)
		_ = shared.Close()
		_ = os.RemoveAll(filepath.Dir(sharedDirs.data))
	}
	os.Exit(code)
}

func harness(t testing.TB) *conformance.Harness {
	return harnessFor(t, newBackend(t), sharedDirs.data, sharedDirs.run)
}

func harnessFor(t testing.TB, b *native.Backend, data, run string) *conformance.Harness {
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	return &conformance.Harness{
		Backend:  b,
		Image:    img,
		UserNS:   b.UserNS() != nil,
		HostPid:  func(sb backend.Sandbox) int { return sb.(*native.Sandbox).Pid() },
		Snapshot: func() (string, error) { return snapshot(b, data, run) },
	}
}

func TestConformance(t *testing.T) {
	h := harness(t)
	if testenv.Strict() && !h.UserNS {
		t.Fatal("user namespaces are unusable on this machine, which PLATFORM.md says supports them")
	}
	conformance.Run(t, h)
}

// TestConformancePooled runs the suite on sandboxes started from the warm
// pool, whose agents stage /proc, /dev, /sys, their masks and the launcher
// before their config arrives (setup.Stage): isolation must not depend on
// which way a sandbox was started. Its backend also runs as `warren run`'s
// does, with the agents' lifeline to this process (ExitWithHost).
func TestConformancePooled(t *testing.T) {
	testenv.RequireRoot(t)
	// Not t.TempDir: sandbox root could not search it, which would turn
	// user namespaces off.
	base := testenv.SearchableDir(t, "warren-pooled-test-")
	data, run := filepath.Join(base, "data"), filepath.Join(base, "run")
	var log syncBuffer
	b, err := native.New(native.Options{
		DataDir: data, RunDir: run, AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-test-pooled-%d", os.Getpid()), Prewarm: 1, ExitWithHost: true,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	h := harnessFor(t, b, data, run)
	if testenv.Strict() && !h.UserNS {
		t.Fatal("user namespaces are unusable on this machine, which PLATFORM.md says supports them")
	}
	conformance.Run(t, h)
	// Most starts took a pooled agent (the pool refills between them) and
	// every pooled start used what its agent staged.
	pooled := strings.Count(log.String(), "pooled=true")
	if staged := strings.Count(log.String(), "pooled=true staged=true"); pooled < 50 || staged != pooled {
		t.Errorf("%d starts from the pool, %d of them staged; want most starts pooled and all of those staged", pooled, staged)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// snapshot lists every host resource a native sandbox can leave behind.
// The warm pool's agents and cgroups are not sandboxes' and come and go
// as it refills: they are left out (TestWarmPool checks the pool's own
// cleanup).
func snapshot(b *native.Backend, data, run string) (string, error) {
	aside := settle(data)
	var out []string
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	// Mounts of this backend's files only: other packages' tests mount
	// and unmount on the host meanwhile (go test runs packages side by
	// side), which made the whole count flaky.
	mine := 0
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, data) || strings.Contains(l, run) {
			mine++
		}
	}
	out = append(out, fmt.Sprintf("host mounts of the data or run directory: %d", mine))
	all, err := b.Cgroups().List()
	if err != nil {
		return "", err
	}
	var cgs []string
	for _, c := range all {
		if !strings.HasPrefix(c, ".pool-") {
			cgs = append(cgs, c)
		}
	}
	out = append(out, fmt.Sprintf("cgroups: %v", cgs))
	for _, d := range []string{run, filepath.Join(data, "sandboxes"), aside} {
		ents, err := os.ReadDir(d)
		if err != nil && !(d == aside && errors.Is(err, fs.ErrNotExist)) {
			return "", err
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		out = append(out, fmt.Sprintf("%s: %v", filepath.Base(d), names))
	}
	// Only this test process's agents count (its children and its
	// spawner's): everything in a sandbox lives in its agent's namespaces.
	// Other test packages running at the same time have sandboxes of their
	// own.
	pids, _ := ourAgents()
	agents, netns := 0, map[string]bool{}
	for _, pid := range pids {
		if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); strings.Contains(string(cg), "/.pool-") {
			continue
		}
		agents++
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil {
			netns[ns] = true
		}
	}
	out = append(out, fmt.Sprintf("agent processes: %d", agents), fmt.Sprintf("net namespaces in use: %d", len(netns)),
		fmt.Sprintf("sandbox roots held: %d", detachedMounts()))
	return strings.Join(out, "\n"), nil
}

// settle waits (a while) for removed sandboxes' files and root mounts,
// which go in the background, to be gone; it returns where they wait.
func settle(data string) (aside string) {
	aside = filepath.Join(data, "sandboxes", ".removed")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ents, err := os.ReadDir(aside); err != nil || len(ents) == 0 {
			break
		}
	}
	return aside
}

// TestStartFailureLeavesNothing: a failed start undoes itself at once (no
// agent, cgroup, runtime directory or mount is held by a sandbox that sits
// there stopped), and Remove then leaves the host as it was. The start
// fails in the agent's setup: after the host has made the cgroup, spawned
// the agent and, for a volume, mounted the root.
func TestStartFailureLeavesNothing(t *testing.T) {
	b := newBackend(t)
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	broken := *img
	broken.Layers = []string{"/nonexistent/layer"}
	for _, tc := range []struct {
		name string
		cfg  backend.Config
		want string // in the start's error
	}{
		{"missing layer", backend.Config{ID: "broken", Image: &broken}, "overlay"},
		{"missing volume", backend.Config{ID: "broken-volume", Image: img,
			Volumes: []backend.Volume{{Source: "/nonexistent-volume", Target: "/data"}}}, "/nonexistent-volume"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := snapshot(b, sharedDirs.data, sharedDirs.run)
			if err != nil {
				t.Fatal(err)
			}
			sb, err := b.Create(context.Background(), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			created, err := snapshot(b, sharedDirs.data, sharedDirs.run)
			if err != nil {
				t.Fatal(err)
			}
			err = sb.Start(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("start: want an error about %q, got %v", tc.want, err)
			}
			failed, err := snapshot(b, sharedDirs.data, sharedDirs.run)
			if err != nil {
				t.Fatal(err)
			}
			if failed != created {
				t.Errorf("failed start left something:\nbefore it:\n%s\nafter it:\n%s", created, failed)
			}
			if err := sb.Remove(context.Background()); err != nil {
				t.Fatal(err)
			}
			after, err := snapshot(b, sharedDirs.data, sharedDirs.run)
			if err != nil {
				t.Fatal(err)
			}
			if before != after {
				t.Errorf("remove after a failed start left something:\nbefore create:\n%s\nafter remove:\n%s", before, after)
			}
		})
	}
}

func TestCreateRejectsBadConfig(t *testing.T) {
	b := newBackend(t)
	img, _ := b.HostImage()
	for _, cfg := range []backend.Config{
		{ID: "../etc", Image: img},
		{ID: "", Image: img},
		{ID: "UPPER", Image: img},
		{ID: "ok", Image: nil},
		{ID: "ok", Image: img, MemoryBytes: 1 << 20},
		{ID: "ok", Image: img, CPUs: -1},
		{ID: "ok", Image: img, Network: "host"},
	} {
		if _, err := b.Create(context.Background(), cfg); err == nil {
			t.Errorf("Create(%+v) succeeded", cfg)
		}
	}
	sb, err := b.Create(context.Background(), backend.Config{ID: "dup", Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(context.Background()) }()
	if _, err := b.Create(context.Background(), backend.Config{ID: "dup", Image: img}); err == nil {
		t.Error("second Create with the same id succeeded")
	}
}

func TestUpperLayerKeptAcrossRestart(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo kept > /root/state"); r.Code != 0 {
		t.Fatalf("write: %+v %s", r.ExitStatus, r.Stderr)
	}
	ctx := context.Background()
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r := conformance.Exec(t, sb, 0, "/bin/cat", "/root/state"); r.Stdout != "kept\n" {
		t.Errorf("after restart: %q %+v", r.Stdout, r.ExitStatus)
	}
}

// TestDataDirOnOverlayRefused: an overlay upper layer cannot live on
// overlayfs (a data directory inside a container's root); New says so
// instead of every start failing with EINVAL.
func TestDataDirOnOverlayRefused(t *testing.T) {
	testenv.RequireRoot(t)
	base := t.TempDir()
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := filepath.Join(base, "m")
	opts := "lowerdir=" + filepath.Join(base, "l") + ",upperdir=" + filepath.Join(base, "u") + ",workdir=" + filepath.Join(base, "w")
	if err := unix.Mount("overlay", m, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	defer func() { _ = unix.Unmount(m, unix.MNT_DETACH) }()
	_, err := native.New(native.Options{DataDir: filepath.Join(m, "data"), RunDir: filepath.Join(base, "run"), AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t)})
	if err == nil || !strings.Contains(err.Error(), "overlayfs") {
		t.Errorf("New on an overlayfs data dir: %v", err)
	}
}

// TestManyLayers starts a sandbox on an image of 200 layers, more than one
// page of overlay mount options can name with their full paths: every
// layer's file is visible, and a higher layer's copy wins.
func TestManyLayers(t *testing.T) {
	b := newBackend(t)
	uid, gid := b.RootIDs()
	base := filepath.Join(sharedDirs.data, "images", "many-layers-test")
	if err := os.MkdirAll(base, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	const n = 200
	var layers []string // top-most first
	for i := n - 1; i >= 0; i-- {
		// Long names, as real layer paths (sha256 digests) are.
		d := filepath.Join(base, fmt.Sprintf("%064d", i))
		if err := os.MkdirAll(filepath.Join(d, "layers"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{fmt.Sprintf("layers/%d", i), "top"} {
			if err := os.WriteFile(filepath.Join(d, f), []byte(fmt.Sprint(i)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{d, filepath.Join(d, "layers")} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		layers = append(layers, d)
	}
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{Image: &image.Image{Name: "many", Layers: layers}})
	ctx := context.Background()
	ents, err := sb.Agent().List(ctx, "/layers")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != n {
		t.Errorf("sandbox sees %d layer files, want %d", len(ents), n)
	}
	top, err := sb.Agent().ReadFile(ctx, "/top")
	if err != nil || string(top) != fmt.Sprint(n-1) {
		t.Errorf("/top = %q, %v; want the top layer's %d", top, err, n-1)
	}
}

// TestImageUser: the image's User runs every process that names none; a
// request's user still wins; a user the image lacks fails the start.
func TestImageUser(t *testing.T) {
	h := harness(t)
	asUser := *h.Image
	asUser.User = "1234:2345"
	sb := h.Sandbox(t, backend.Config{Image: &asUser})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo $(id -u) $(id -g)"); r.Stdout != "1234 2345\n" {
		t.Errorf("default user: %q %+v %s", r.Stdout, r.ExitStatus, r.Stderr)
	}
	res, err := backend.Exec(context.Background(), sb, &wire.ExecRequest{Argv: []string{"id", "-u"}, User: "0"},
		func(_ string, data []byte) {
			if string(data) != "0\n" {
				t.Errorf("explicit user 0: %q", data)
			}
		})
	if err != nil || res.Code != 0 {
		t.Errorf("explicit user: %+v %v", res, err)
	}

	missing := *h.Image
	missing.User = "no-such-user"
	bad, err := h.Backend.Create(context.Background(), backend.Config{ID: fmt.Sprintf("baduser-%d", os.Getpid()), Image: &missing})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bad.Remove(context.Background()) }()
	if err := bad.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "no-such-user") {
		t.Errorf("start with a user the image lacks: %v", err)
	}
}

// TestAgentCopy: the backend execs its own copy of the agent under
// RunDir/.agent; copies no live backend holds (older builds) are swept,
// a copy a live backend holds is not.
func TestAgentCopy(t *testing.T) {
	testenv.RequireRoot(t)
	agentPath := testenv.AgentBinary(t)
	base, err := os.MkdirTemp("", "warren-agentcopy-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(base) }()
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	opts := native.Options{DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"), AgentPath: agentPath,
		SpawnerPath: testenv.SpawnerBinary(t), CgroupPrefix: fmt.Sprintf("warren-agentcopy-%d", os.Getpid())}
	a, err := native.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the sandbox below goes first, so
	// Close finds the cgroup prefix empty and removes it.
	t.Cleanup(func() { _ = a.Close() })
	dir := filepath.Join(base, "run", ".agent")
	copies := func() []string {
		ents, _ := os.ReadDir(dir)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	mine := copies()
	if len(mine) != 1 || !strings.HasPrefix(mine[0], "warren-agent-") {
		t.Fatalf("agent copies: %v", mine)
	}
	stale := filepath.Join(dir, "warren-agent-000000000000000000000000")
	if err := os.WriteFile(stale, []byte("old build"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := native.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := copies(); len(got) != 1 || got[0] != mine[0] {
		t.Errorf("after a second backend: %v, want only %v (the stale copy swept, the held one kept)", got, mine)
	}
	// The first backend still starts sandboxes from its copy.
	img, err := a.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	h := &conformance.Harness{Backend: a, Image: img}
	sb := h.Sandbox(t, backend.Config{})
	if r := conformance.Exec(t, sb, 0, "/bin/true"); r.Code != 0 {
		t.Errorf("exec after the sweep: %+v", r.ExitStatus)
	}
}

// TestAgentProcs: an agent runs its Go code on as many threads at once as
// its sandbox has CPUs (rounded up; every CPU without a limit), after a
// start on one.
func TestAgentProcs(t *testing.T) {
	h := harness(t)
	for _, c := range []struct {
		cpus float64
		want int
	}{{1, 1}, {0.5, 1}, {2, min(2, runtime.NumCPU())}, {0, runtime.NumCPU()}} {
		sb := h.Sandbox(t, backend.Config{ID: fmt.Sprintf("procs-%d", int(c.cpus*10)), CPUs: c.cpus})
		health, err := sb.Agent().Health(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if health.Procs != c.want {
			t.Errorf("cpus %v: agent GOMAXPROCS %d, want %d", c.cpus, health.Procs, c.want)
		}
		if err := sb.Remove(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTimerSlack: with the host coarse, as warren runs, the agent runs with
// the coarse timer slack and every kind of sandbox process (a command, a
// background process, a REPL's interpreter) with the host's original.
func TestTimerSlack(t *testing.T) {
	h := harness(t)
	if err := timerslack.Coarsen(timerslack.Coarse); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint(timerslack.Original())
	if want == "0" {
		t.Fatal("the host's timer slack cannot be read")
	}
	sb := h.Sandbox(t, backend.Config{ID: "slack"})
	defer func() { _ = sb.Remove(context.Background()) }()
	r := conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/proc/self/timerslack_ns")
	if got := strings.TrimSpace(r.Stdout); got != want {
		t.Errorf("a command's timer slack is %q ns (%s), want the host's %s", got, r.Stderr, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := sb.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: []string{"/bin/cat", "/proc/self/timerslack_ns"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Agent().Wait(ctx, p.ID, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	out, err := sb.Agent().Output(ctx, p.ID, wire.Stdout, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out.Data)); got != want {
		t.Errorf("a background process's timer slack is %q ns, want the host's %s", got, want)
	}
	res, err := sb.Agent().Repl(ctx, wire.ReplRequest{Language: "python", Code: "open('/proc/self/timerslack_ns').read().strip()"})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Result; got == nil || *got != "'"+want+"'" {
		t.Errorf("the Python REPL's timer slack is %s (%s), want the host's '%s'", deref(got), res.Error, want)
	}
	pid := sb.(*native.Sandbox).Pid()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var slacks []string
	for _, tid := range tasks {
		// Per process in /proc/PID, but any thread's id names its own.
		b, err := os.ReadFile("/proc/" + tid.Name() + "/timerslack_ns")
		if err != nil {
			t.Fatal(err)
		}
		slacks = append(slacks, strings.TrimSpace(string(b)))
	}
	if coarse := fmt.Sprint(timerslack.Coarse.Nanoseconds()); !slices.Contains(slacks, coarse) {
		t.Errorf("agent threads' timer slacks %v, none is the agent's %s", slacks, coarse)
	}
}

// deref is *p, or "nil".
func deref(p *string) string {
	if p == nil {
		return "nil"
	}
	return *p
}

// TestStartUnderUmask: warren's own umask changes nothing: a sandbox
// starts under umask 077 (the directories sandbox root passes through keep
// their modes) and its processes get umask 022.
func TestStartUnderUmask(t *testing.T) {
	h := harness(t)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	sb := h.Sandbox(t, backend.Config{ID: "umask"})
	defer func() { _ = sb.Remove(context.Background()) }()
	r := conformance.Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "umask; touch /tmp/f; stat -c %a /tmp/f")
	if r.Stdout != "0022\n644\n" {
		t.Errorf("in the sandbox: %q %+v %s", r.Stdout, r.ExitStatus, r.Stderr)
	}
}

// TestUserNSProbe: the spawner's probe of user namespaces decides. A uid
// range the kernel cannot map (it would pass 2^32) fails it: required
// (UserNSOn), New refuses and says why; by default (auto) sandboxes run
// without a user namespace. With a usable range the backend has one.
func TestUserNSProbe(t *testing.T) {
	testenv.RequireRoot(t)
	base := testenv.SearchableDir(t, "warren-userns-probe-test-")
	opts := func(mode string, uidBase uint32) native.Options {
		return native.Options{
			DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
			AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
			CgroupPrefix: fmt.Sprintf("warren-test-userns-probe-%d", os.Getpid()), ExitWithHost: true,
			UserNS: mode, UIDBase: uidBase, UIDRanges: native.UIDRangesOff,
		}
	}
	const unmappable = 1<<32 - 1000
	if b, err := native.New(opts(native.UserNSOn, unmappable)); err == nil {
		_ = b.Close()
		t.Error("UserNS on with an unmappable uid range: New succeeded")
	} else if !strings.Contains(err.Error(), "user namespaces required but unusable") {
		t.Errorf("UserNS on with an unmappable uid range: %v", err)
	}
	if left := cgroupsNamed(opts("", 0).CgroupPrefix); len(left) > 0 {
		t.Errorf("the refused New left cgroups: %v", left)
	}
	b, err := native.New(opts(native.UserNSAuto, unmappable))
	if err != nil {
		t.Fatal(err)
	}
	if b.UserNS() != nil {
		t.Errorf("auto with an unmappable uid range: user namespace %+v, want none", b.UserNS())
	}
	if err := b.Close(); err != nil {
		t.Error(err)
	}
	b, err = native.New(opts(native.UserNSOn, native.DefaultUIDBase))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	if m := b.UserNS(); m == nil || m.Host != native.DefaultUIDBase {
		t.Errorf("UserNS on: user namespace %+v, want one at %d", m, native.DefaultUIDBase)
	}
}
