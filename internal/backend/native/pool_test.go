package native_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/timerslack"
)

// TestWarmPool runs sandboxes from pre-spawned agents: they must end up in
// their own cgroup (limits hold, the cgroup namespace is rooted there) and
// closing the backend must leave no agent, directory or cgroup behind. It
// runs with the pool's cgroups renamed at start (cgroup v1) and with the
// agents moved into new ones (what cgroup v2 needs, forced here).
func TestWarmPool(t *testing.T) {
	for _, migrate := range []bool{false, true} {
		t.Run(map[bool]string{false: "rename", true: "migrate"}[migrate], func(t *testing.T) { testWarmPool(t, migrate) })
	}
}

func testWarmPool(t *testing.T, migrate bool) {
	testenv.RequireRoot(t)
	agentPath := testenv.AgentBinary(t)
	base := testenv.SearchableDir(t, "warren-pool-test-")
	prefix := fmt.Sprintf("warren-pool-test-%d-%v", os.Getpid(), migrate)
	// Other tests' backends (the shared one) may have agents and a
	// spawner of their own.
	others := countAgents()
	b, err := native.New(native.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
		AgentPath: agentPath, SpawnerPath: testenv.SpawnerBinary(t), CgroupPrefix: prefix, Prewarm: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if migrate {
		native.ForcePoolMigration(b)
	}
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	h := &conformance.Harness{Backend: b, Image: img}
	// Let the pool fill, so the starts below take pooled agents.
	waitFor(t, func() bool { return countAgents() >= others+3 }) // the spawner and two agents
	// Waiting agents are in the scheduler's idle class, sandboxes not.
	agents, _ := ourAgents()
	waiting := 0
	for _, pid := range agents {
		if strings.Contains(cgroupOf(t, pid), prefix+"/.pool-") {
			waiting++
			if v := cpuIdle(t, pid); v != "1" {
				t.Errorf("pooled agent %d: cpu.idle %q, want 1", pid, v)
			}
		}
	}
	if waiting < 2 { // two ready, perhaps a third spawned for the next free slot
		t.Errorf("%d agents in pool cgroups, want at least 2", waiting)
	}
	for i := range 5 {
		id := fmt.Sprintf("pooled-%d", i)
		sb := h.Sandbox(t, backend.Config{ID: id, MemoryBytes: 64 << 20})
		if cg := cgroupOf(t, sb.(*native.Sandbox).Pid()); !strings.HasSuffix(cg, "/"+prefix+"/"+id) {
			t.Errorf("pooled sandbox %d's agent is in cgroup %s, not its own", i, cg)
		}
		if v := cpuIdle(t, sb.(*native.Sandbox).Pid()); v != "0" {
			t.Errorf("pooled sandbox %d: cpu.idle %q, want 0", i, v)
		}
		r := conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/proc/self/cgroup")
		for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
			if strings.Contains(l, ":memory:") && !strings.HasSuffix(l, ":/") {
				t.Errorf("cgroup namespace not rooted at the sandbox's cgroup: %q", l)
			}
		}
		// The staged launcher, made before the config came, still gives
		// the sandbox's processes the host's timer slack.
		r = conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/proc/self/timerslack_ns")
		if got, want := strings.TrimSpace(r.Stdout), fmt.Sprint(timerslack.Original()); got != want {
			t.Errorf("pooled sandbox %d: a process's timer slack %q ns, want the host's %s", i, got, want)
		}
		r = conformance.Python(t, sb, 30*time.Second, "b = bytearray(256 << 20)")
		if !r.OOMKilled {
			t.Errorf("pooled sandbox %d: 256 MiB under a 64 MiB limit was not OOM-killed: %+v", i, r.ExitStatus)
		}
		if err := sb.Remove(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return countAgents() == others })
	if _, err := os.Stat(filepath.Join(base, "run", ".pool")); !os.IsNotExist(err) {
		t.Errorf("pool directory left behind: %v", err)
	}
	if left := cgroupsNamed(prefix); len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
}

// cgroupsNamed are the cgroup directories up to 8 levels deep (this host
// puts a process's cgroup 2 levels down, a backend's prefix below it) whose
// name starts with prefix: a backend's prefix and what is below it.
func cgroupsNamed(prefix string) []string {
	var found []string
	for depth := 1; depth <= 8; depth++ {
		m, _ := filepath.Glob("/sys/fs/cgroup/*/" + strings.Repeat("*/", depth-1) + prefix + "*")
		found = append(found, m...)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/" + prefix + "*"); len(m) > 0 { // cgroup v2
		found = append(found, m...)
	}
	return found
}

// TestPoolSeesLaterHostMounts: a file system the host mounts after the
// pool's agents staged (a volume's, say) reaches a sandbox started from the
// pool, rather than the empty directory beneath it. The host's mounts are
// private on this machine (no systemd); the test makes its own shared one,
// as systemd makes /.
func TestPoolSeesLaterHostMounts(t *testing.T) {
	testenv.RequireRoot(t)
	base := testenv.SearchableDir(t, "warren-pool-mount-test-")
	shared := filepath.Join(base, "shared")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", shared, "tmpfs", 0, "mode=0755,size=1m"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Unmount(shared, syscall.MNT_DETACH) }()
	if err := syscall.Mount("", shared, "", syscall.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(shared, "late")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("warren-pool-mount-test-%d", os.Getpid())
	b, err := native.New(native.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
		AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t), CgroupPrefix: prefix, Prewarm: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: it runs after the sandbox's own (cleanups
	// run last first), when the prefix is empty and can go.
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if left := cgroupsNamed(prefix); len(left) > 0 {
			t.Errorf("cgroups left behind: %v", left)
		}
	})
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	h := &conformance.Harness{Backend: b, Image: img}
	waitFor(t, func() bool {
		agents, _ := ourAgents()
		for _, pid := range agents {
			mi, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
			if strings.Contains(cgroupOf(t, pid), prefix+"/.pool-") && strings.Contains(string(mi), "/.pool/stage ") {
				return true
			}
		}
		return false
	})
	if err := syscall.Mount("tmpfs", vol, "tmpfs", 0, "mode=0755,size=1m"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Unmount(vol, syscall.MNT_DETACH) }()
	if err := os.WriteFile(filepath.Join(vol, "marker"), []byte("mounted later\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := h.Sandbox(t, backend.Config{ID: "late-mount", Volumes: []backend.Volume{{Source: vol, Target: "/late", ReadOnly: true}}})
	if r := conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/late/marker"); r.Stdout != "mounted later\n" {
		t.Errorf("a host mount made after the agent staged, seen from a pooled sandbox: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
}

// cgroupOf returns the cgroup of pid's sandbox in the cpu controller's hierarchy.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	v2 := ""
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			v2 = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpu" {
				return "/sys/fs/cgroup/cpu" + parts[2]
			}
		}
	}
	// On v2 an agent's threads are in its sandbox's two threaded leaves:
	// "agent", and "work" for the launcher thread, which the process's
	// line names when the launcher is its first thread. The sandbox's
	// cgroup, with cpu.idle, is their parent.
	return "/sys/fs/cgroup" + strings.TrimSuffix(strings.TrimSuffix(v2, "/agent"), "/work")
}

// cpuIdle reads cpu.idle of pid's cgroup.
func cpuIdle(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cgroupOf(t, pid), "cpu.idle"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// countAgents counts this test binary's agent and spawner processes.
func countAgents() int {
	agents, spawners := ourAgents()
	return len(agents) + len(spawners)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSpawnerDies kills the spawner under a running sandbox: the sandbox
// keeps working and stops cleanly (its agent, now this process's child,
// is reaped), and the next start gets a new spawner.
func TestSpawnerDies(t *testing.T) {
	h := harness(t)
	ctx := context.Background()
	sb := h.Sandbox(t, backend.Config{ID: "spawner-dies"})
	pid := sb.(*native.Sandbox).Pid()
	sp := testenv.ParentPID(pid)
	if sp == os.Getpid() || sp <= 1 {
		t.Fatalf("agent %d's parent is %d, not a spawner", pid, sp)
	}
	if err := syscall.Kill(sp, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// This process is a child subreaper: the orphaned agent comes here.
	waitFor(t, func() bool { return testenv.ParentPID(pid) == os.Getpid() })
	if r := conformance.Exec(t, sb, 10*time.Second, "/bin/echo", "alive"); r.Stdout != "alive\n" {
		t.Errorf("exec after the spawner died: %+v", r)
	}
	other := h.Sandbox(t, backend.Config{ID: "spawner-new"})
	if p := testenv.ParentPID(other.(*native.Sandbox).Pid()); p == sp || p == os.Getpid() {
		t.Errorf("new sandbox's parent is %d; want a new spawner", p)
	}
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err)
	})
}
