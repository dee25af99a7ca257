package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
	"golang.org/x/sys/unix"
)

var testSeq atomic.Int64

func testPrefix() string {
	return fmt.Sprintf("warren-test-%d-%d", os.Getpid(), testSeq.Add(1))
}

// newTestManager returns a Manager (host layout) under a unique prefix, or
// skips/fails per testenv when cgroups are not writable. Everything under
// the prefix, and the prefix itself, is removed at cleanup.
func newTestManager(t *testing.T) *Manager {
	t.Helper()
	testenv.RequireRoot(t)
	m, err := New(testPrefix())
	testenv.Require(t, err == nil, fmt.Sprintf("writable cgroupfs (New: %v)", err))
	cleanupManager(t, m)
	requireWritable(t, m)
	expectV2(t, m)
	return m
}

// expectV2 fails the test when the machine promises a pure cgroup v2
// hierarchy with the memory, cpu and pids controllers
// (WARREN_TEST_CGROUP_V2=1, as scripts/v2vm.sh's virtual machine does) and
// m does not have them: there the tests' v2 branches must run.
func expectV2(t *testing.T, m *Manager) {
	t.Helper()
	if os.Getenv("WARREN_TEST_CGROUP_V2") != "1" {
		return
	}
	if m.Mode() != ModeV2 {
		t.Fatalf("WARREN_TEST_CGROUP_V2=1 but the manager is in mode %s", m.Mode())
	}
	for _, c := range wantV2 {
		if err := m.controllerErr(c); err != nil {
			t.Fatalf("WARREN_TEST_CGROUP_V2=1 but: %v", err)
		}
	}
}

func cleanupManager(t *testing.T, m *Manager) {
	t.Cleanup(func() {
		if _, err := m.Reap(nil); err != nil {
			t.Errorf("cleanup reap: %v", err)
		}
		if err := m.removePrefix(); err != nil {
			t.Errorf("cleanup prefix: %v", err)
		}
	})
}

// requireWritable checks that a cgroup can be created and removed.
func requireWritable(t *testing.T, m *Manager) {
	t.Helper()
	c, err := m.Create("writable-probe", Limits{})
	testenv.Require(t, err == nil, fmt.Sprintf("writable cgroupfs (Create: %v)", err))
	if err := c.Destroy(); err != nil {
		t.Fatalf("destroy probe: %v", err)
	}
}

func requireController(t *testing.T, m *Manager, ctrl string) {
	t.Helper()
	err := m.controllerErr(ctrl)
	testenv.Require(t, err == nil, fmt.Sprintf("cgroup controller %s (%v)", ctrl, err))
}

func mustCreate(t *testing.T, m *Manager, name string, l Limits) *Cgroup {
	t.Helper()
	c, err := m.Create(name, l)
	if err != nil {
		t.Fatalf("Create(%q, %+v): %v", name, l, err)
	}
	t.Cleanup(func() {
		if err := c.Destroy(); err != nil {
			t.Errorf("cleanup destroy %q: %v", name, err)
		}
	})
	return c
}

// command returns a command bounded by a 60 s context.
func command(t *testing.T, name string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return exec.CommandContext(ctx, name, args...)
}

// spawn starts cmd inside c and makes sure it is reaped at cleanup.
func spawn(t *testing.T, c *Cgroup, cmd *exec.Cmd) {
	t.Helper()
	if err := trySpawn(t, c, cmd); err != nil {
		t.Fatal(err)
	}
}

// trySpawn is spawn for goroutines other than the test's.
func trySpawn(t *testing.T, c *Cgroup, cmd *exec.Cmd) error {
	err := c.Spawn(func(fd int) error {
		if fd >= 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		}
		return cmd.Start()
	})
	if err != nil {
		return fmt.Errorf("Spawn %v: %w", cmd.Args, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return nil
}

// waitFor polls cond every 5 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	end := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func assertGone(t *testing.T, c *Cgroup) {
	t.Helper()
	for _, d := range c.dirs {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still present (err %v)", d, err)
		}
	}
}

// hierKey is the /proc/<pid>/cgroup key for hierarchy i.
func hierKey(m *Manager, i int) string {
	if m.mode == ModeV1 {
		return m.hiers[i].ctrls[0]
	}
	return ""
}

func readProcCgroup(t *testing.T, p string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	cg, err := ParseProcSelf(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return cg
}

// assertNoThreadInside checks that no thread of the test process is in c.
// assertNoThreadInside checks no thread of the test process stays in c.
// The thread Spawn forked from is discarded, and a thread's exit completes
// asynchronously, so it is given a moment to go.
func assertNoThreadInside(t *testing.T, c *Cgroup) {
	t.Helper()
	var inside []string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		inside = threadsInside(t, c)
		if len(inside) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, f := range inside {
		t.Errorf("thread of the test process stays in the sandbox cgroup: %s", f)
	}
}

func threadsInside(t *testing.T, c *Cgroup) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/cgroup")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("glob tasks: %v %v", tasks, err)
	}
	var inside []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // thread exited meanwhile
		}
		cg, err := ParseProcSelf(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.m.hiers {
			if p, in := cg[hierKey(c.m, i)], c.procPath(i); p == in || strings.HasPrefix(p, in+"/") {
				inside = append(inside, f+": "+p)
			}
		}
	}
	return inside
}

func TestCreateDestroyLeavesNothing(t *testing.T) {
	m := newTestManager(t)
	t.Logf("mode %s, hierarchies: %+v", m.Mode(), m.hiers)
	l := Limits{}
	for _, c := range []string{"memory", "cpu", "pids"} {
		if m.controllerErr(c) == nil {
			switch c {
			case "memory":
				l.MemoryBytes = 64 << 20
			case "cpu":
				l.CPUs = 1.5
			case "pids":
				l.PidsMax = 100
			}
		}
	}
	const n = 30
	var took []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		c, err := m.Create("cd", l)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range c.dirs {
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				t.Fatalf("%s not created: %v", d, err)
			}
		}
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
		assertGone(t, c)
		if err := c.Destroy(); err != nil {
			t.Fatalf("second Destroy: %v", err)
		}
	}
	slices.Sort(took)
	t.Logf("Create(%+v)+Destroy over %d hierarchies: median %v, max %v", l, len(m.hiers), took[n/2], took[n-1])
	if names, err := m.List(); err != nil || len(names) != 0 {
		t.Errorf("List after destroy = %v, %v", names, err)
	}
}

func TestCreateRollback(t *testing.T) {
	m := newTestManager(t)

	injected := errors.New("injected")
	testHookCreate = func(*Cgroup) error { return injected }
	_, err := m.Create("rb", Limits{})
	testHookCreate = nil
	if !errors.Is(err, injected) {
		t.Fatalf("Create with injected failure = %v", err)
	}
	assertGone(t, m.cgroup("rb"))

	if m.controllerErr("cpu") == nil {
		// 0.001 CPUs is a 100µs quota; the kernel's minimum is 1ms.
		_, err := m.Create("rb", Limits{MemoryBytes: 0, CPUs: 0.001, PidsMax: 5})
		if err == nil {
			t.Fatal("Create with a 100µs CPU quota succeeded")
		}
		t.Logf("kernel rejection: %v", err)
		assertGone(t, m.cgroup("rb"))
	}

	for _, l := range []Limits{{MemoryBytes: -1}, {CPUs: -1}, {PidsMax: -2}} {
		if _, err := m.Create("rb", l); err == nil {
			t.Errorf("Create(%+v) succeeded", l)
		}
	}
	for _, bad := range []string{"", "..", "a/b", "cgroup.procs"} {
		if _, err := m.Create(bad, Limits{}); err == nil {
			t.Errorf("Create(%q) succeeded", bad)
		} else if errors.Is(err, fs.ErrExist) {
			t.Errorf("Create(%q) = %v, looks like a stale cgroup", bad, err)
		}
	}
	if names, _ := m.List(); len(names) != 0 {
		t.Errorf("List = %v", names)
	}
}

func TestStaleAndOpen(t *testing.T) {
	m := newTestManager(t)
	c := mustCreate(t, m, "a", Limits{})
	if _, err := m.Create("a", Limits{}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second Create = %v, want fs.ErrExist", err)
	}
	o, err := m.Open("a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.dirs, c.dirs) {
		t.Errorf("Open dirs %v != %v", o.dirs, c.dirs)
	}
	if _, err := o.Stats(); err != nil {
		t.Errorf("Stats of opened: %v", err)
	}
	if _, err := m.Open("missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(missing) = %v", err)
	}

	// A stale directory in one hierarchy only: Create reports ErrExist and
	// creates nothing elsewhere; Open reports the missing parts.
	stale := m.cgroup("stale")
	last := stale.dirs[len(stale.dirs)-1]
	if err := os.Mkdir(last, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create("stale", Limits{}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Create over stale = %v, want fs.ErrExist", err)
	}
	for _, d := range stale.dirs[:len(stale.dirs)-1] {
		if _, err := os.Lstat(d); err == nil {
			t.Errorf("Create over stale made %s", d)
		}
	}
	if _, err := os.Stat(last); err != nil {
		t.Errorf("Create over stale removed the stale dir: %v", err)
	}
	if len(stale.dirs) > 1 {
		if _, err := m.Open("stale"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(partial) = %v", err)
		}
	}
	if names, _ := m.List(); !slices.Equal(names, []string{"a", "stale"}) {
		t.Errorf("List = %v", names)
	}
	// What Open refuses, Destroy by name removes: the next start of a
	// sandbox whose cgroup a crash left half there must be able to
	// clear it.
	if err := m.Destroy("stale"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(last); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Destroy by name left the partial cgroup: %v", err)
	}
	if err := m.Destroy("missing"); err != nil {
		t.Errorf("Destroy(missing) = %v", err)
	}
}

func TestSpawnPlacesChild(t *testing.T) {
	m := newTestManager(t)
	c := mustCreate(t, m, "spawn", Limits{})

	check := func(t *testing.T) {
		var out bytes.Buffer
		cmd := command(t, "/bin/cat", "/proc/self/cgroup")
		cmd.Stdout = &out
		if err := trySpawn(t, c, cmd); err != nil {
			t.Error(err)
			return
		}
		if err := cmd.Wait(); err != nil {
			t.Error(err)
			return
		}
		cg, err := ParseProcSelf(&out)
		if err != nil {
			t.Error(err)
			return
		}
		for i := range m.hiers {
			if got, want := cg[hierKey(m, i)], c.procPath(i); got != want {
				t.Errorf("child's %q cgroup = %q, want %q\n%s", hierKey(m, i), got, want, out.String())
			}
		}
	}
	check(t)
	assertNoThreadInside(t, c)

	// Concurrent spawns, into this and other cgroups.
	other := mustCreate(t, m, "spawn2", Limits{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				check(t)
				cmd := command(t, "/bin/true")
				if err := trySpawn(t, other, cmd); err != nil {
					t.Error(err)
					continue
				}
				_ = cmd.Wait()
			}
		}()
	}
	wg.Wait()
	assertNoThreadInside(t, c)
	assertNoThreadInside(t, other)
	if pids, err := c.Procs(); err != nil || len(pids) != 0 {
		t.Errorf("Procs after children exited = %v, %v", pids, err)
	}

	// Spawn's error is start's error, and the thread still leaves.
	boom := errors.New("boom")
	if err := c.Spawn(func(int) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Spawn = %v", err)
	}
	assertNoThreadInside(t, c)
}

func TestMemoryLimitOOM(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "memory")
	testenv.RequireFile(t, "/usr/bin/python3")
	const limit = 32 << 20
	c := mustCreate(t, m, "mem", Limits{MemoryBytes: limit})

	d := c.dirOf("memory")
	files := map[string]string{"memory.max": strconv.Itoa(limit), "memory.swap.max": "0"}
	if m.mode == ModeV1 {
		files = map[string]string{"memory.limit_in_bytes": strconv.Itoa(limit), "memory.memsw.limit_in_bytes": strconv.Itoa(limit)}
	}
	for f, want := range files {
		b, err := os.ReadFile(filepath.Join(d, f))
		if errors.Is(err, fs.ErrNotExist) && (f == "memory.swap.max" || f == "memory.memsw.limit_in_bytes") {
			continue // no swap accounting in this kernel (Probe says so)
		}
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %s", f, b, err, want)
		}
	}

	cmd := command(t, "/usr/bin/python3", "-c", "b = b'x' * (200 << 20)")
	spawn(t, c, cmd)
	err := cmd.Wait()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("python allocating 200MB under a 32MiB limit: %v (want SIGKILL)", err)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	if n, err := c.OOMKills(); err != nil || n != st.OOMKills {
		t.Errorf("OOMKills() = %d, %v; Stats says %d", n, err, st.OOMKills)
	}
	if st.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want >= 1", st.OOMKills)
	}
	if st.MemoryPeak > limit {
		t.Errorf("MemoryPeak %d above the limit", st.MemoryPeak)
	}
}

func TestSetLimits(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "memory")
	c := mustCreate(t, m, "set", Limits{MemoryBytes: 64 << 20})
	memFile := "memory.max"
	if m.mode == ModeV1 {
		memFile = "memory.limit_in_bytes"
	}
	read := func() string {
		b, _ := os.ReadFile(filepath.Join(c.dirOf("memory"), memFile))
		return strings.TrimSpace(string(b))
	}
	// Lower, raise above the old memsw, then unlimited: v1 ordering rules.
	for _, v := range []int64{32 << 20, 256 << 20, 0, 16 << 20} {
		if err := c.SetLimits(Limits{MemoryBytes: v}); err != nil {
			t.Fatalf("SetLimits(%d): %v", v, err)
		}
		got := read()
		if v > 0 && got != strconv.FormatInt(v, 10) {
			t.Errorf("after SetLimits(%d): %s = %s", v, memFile, got)
		}
		if v == 0 && got != "max" && !strings.HasPrefix(got, "92233720368547") {
			t.Errorf("after SetLimits(0): %s = %s", memFile, got)
		}
		if m.mode == ModeV2 {
			b, err := os.ReadFile(filepath.Join(c.dirOf("memory"), "memory.swap.max"))
			if want := map[bool]string{true: "0", false: "max"}[v > 0]; err == nil && strings.TrimSpace(string(b)) != want {
				t.Errorf("after SetLimits(%d): memory.swap.max = %q, want %s", v, b, want)
			}
		}
	}
	if m.controllerErr("pids") == nil {
		if err := c.SetLimits(Limits{PidsMax: 7}); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(c.dirOf("pids"), "pids.max"))
		if strings.TrimSpace(string(b)) != "7" {
			t.Errorf("pids.max = %q", b)
		}
	}
}

func TestSetIdle(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "cpu")
	c := mustCreate(t, m, "idle", Limits{CPUs: 0.5})
	for _, idle := range []bool{true, false, true} {
		if err := c.SetIdle(idle); err != nil {
			t.Fatalf("SetIdle(%v): %v", idle, err)
		}
		b, err := os.ReadFile(filepath.Join(c.dirOf("cpu"), "cpu.idle"))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.TrimSpace(string(b)), map[bool]string{true: "1", false: "0"}[idle]; got != want {
			t.Errorf("after SetIdle(%v): cpu.idle = %s", idle, got)
		}
	}
}

func TestPidsLimit(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "pids")
	testenv.RequireFile(t, "/usr/bin/python3")
	c := mustCreate(t, m, "pids", Limits{PidsMax: 8})
	if b, err := os.ReadFile(filepath.Join(c.dirOf("pids"), "pids.max")); err != nil || strings.TrimSpace(string(b)) != "8" {
		t.Errorf("pids.max = %q, %v", b, err)
	}

	// Fork 50 sleepers, count the forks that succeeded, report, then wait.
	script := `
import os, sys, time
n = 0
for i in range(50):
    try:
        pid = os.fork()
    except OSError:
        continue
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n, flush=True)
time.sleep(30)
`
	cmd := command(t, "/usr/bin/python3", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	spawn(t, c, cmd)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read count: %v", err)
	}
	started, _ := strconv.Atoi(strings.TrimSpace(line))
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started %d of 50; stats %+v", started, st)
	if started >= 50 || started < 1 {
		t.Errorf("started %d sleepers, want 1..49", started)
	}
	if st.PidsCurrent > 8 || st.PidsCurrent < 1 {
		t.Errorf("PidsCurrent = %d, want 1..8", st.PidsCurrent)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func TestCPUQuotaThrottles(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "cpu")
	testenv.RequireFile(t, "/usr/bin/python3")
	c := mustCreate(t, m, "cpu", Limits{CPUs: 0.2})
	quotaFile, want := "cpu.max", "20000 100000"
	if m.mode == ModeV1 {
		quotaFile, want = "cpu.cfs_quota_us", "20000"
	}
	if b, err := os.ReadFile(filepath.Join(c.dirOf("cpu"), quotaFile)); err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("%s = %q, %v; want %q", quotaFile, b, err, want)
	}
	cmd := command(t, "/usr/bin/python3", "-c", "import time\ne = time.time() + 1\nwhile time.time() < e: pass")
	start := time.Now()
	spawn(t, c, cmd)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats %+v after %v", st, wall)
	if st.ThrottledPeriods == 0 {
		t.Error("not throttled")
	}
	if m.controllerErr("cpuacct") == nil || m.mode == ModeV2 {
		// The busy loop wants the CPU all the time; the quota allows it
		// 20% of the wall time (python's start included, which is slow
		// under emulation), plus a few periods of slack.
		if limit := wall/5 + 100*time.Millisecond; st.CPUUsageNs <= 0 || time.Duration(st.CPUUsageNs) > limit {
			t.Errorf("CPU usage %v in %v, want (0, %v]", time.Duration(st.CPUUsageNs), wall, limit)
		}
	}
}

// startTree starts sh with a foreground sleep and a setsid'd orphan sleep and
// waits until the orphan is in the cgroup. It returns the orphan's pid.
func startTree(t *testing.T, c *Cgroup) (*exec.Cmd, int) {
	t.Helper()
	cmd := command(t, "/bin/sh", "-c", "(setsid sleep 1000 &) ; sleep 1000")
	spawn(t, c, cmd)
	shSid, _ := unix.Getsid(cmd.Process.Pid)
	orphan := 0
	ok := waitFor(5*time.Second, func() bool {
		pids, _ := c.Procs()
		for _, p := range pids {
			if sid, err := unix.Getsid(p); err == nil && sid != shSid && sid == p {
				orphan = p
			}
		}
		return orphan != 0 && len(pids) >= 2
	})
	if !ok {
		pids, _ := c.Procs()
		t.Fatalf("setsid'd child never showed up; procs %v", pids)
	}
	return cmd, orphan
}

// gone reports whether pid exited (absent or a zombie nobody reaped).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func TestKillTree(t *testing.T) {
	m := newTestManager(t)
	c := mustCreate(t, m, "kill", Limits{})
	cmd, orphan := startTree(t, c)

	start := time.Now()
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Kill took %v", time.Since(start))
	err := cmd.Wait()
	if ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("sh: %v, want SIGKILL", err)
	}
	if !waitFor(2*time.Second, func() bool { return gone(orphan) }) {
		t.Errorf("orphan %d survived Kill", orphan)
	}
	if pids, err := c.Procs(); err != nil || len(pids) != 0 {
		t.Errorf("Procs after Kill = %v, %v", pids, err)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, c)

	// Destroy alone kills a live tree too.
	c2 := mustCreate(t, m, "kill2", Limits{})
	cmd2, orphan2 := startTree(t, c2)
	if err := c2.Destroy(); err != nil {
		t.Fatal(err)
	}
	_ = cmd2.Wait()
	assertGone(t, c2)
	if !waitFor(2*time.Second, func() bool { return gone(orphan2) }) {
		t.Errorf("orphan %d survived Destroy", orphan2)
	}
}

func TestReap(t *testing.T) {
	m := newTestManager(t)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := m.Create(n, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	// Orphan "a" has a process; "d" exists in one hierarchy only.
	a, err := m.Open("a")
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := startTree(t, a)
	d := m.cgroup("d")
	if err := os.Mkdir(d.dirs[0], 0o755); err != nil {
		t.Fatal(err)
	}
	removed, err := m.Reap(func(n string) bool { return n == "b" })
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(removed)
	if !slices.Equal(removed, []string{"a", "c", "d"}) {
		t.Errorf("removed %v, want [a c d]", removed)
	}
	_ = cmd.Wait()
	if names, err := m.List(); err != nil || !slices.Equal(names, []string{"b"}) {
		t.Errorf("List after Reap = %v, %v", names, err)
	}
	for _, n := range []string{"a", "c", "d"} {
		assertGone(t, m.cgroup(n))
	}
	if _, err := m.Open("b"); err != nil {
		t.Errorf("kept cgroup: %v", err)
	}
}

func TestProbe(t *testing.T) {
	m := newTestManager(t)
	feats := m.Probe()
	for _, f := range feats {
		t.Logf("%-14s usable=%-5v %s %s", f.Name, f.Usable, f.Path, f.Reason)
		if !f.Usable && f.Reason == "" {
			t.Errorf("%s unusable without a reason", f.Name)
		}
	}
	if len(feats) == 0 {
		t.Fatal("no features")
	}
}

// v2Layout is the layout of this host's cgroup2 mount, forced to v2 mode
// even when it carries no controllers (as on the hybrid build machine).
func v2Layout(t *testing.T) layout {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := parseMountinfo(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	self := readProcCgroup(t, "/proc/self/cgroup")
	for _, e := range mounts {
		if e.fstype != "cgroup2" {
			continue
		}
		own, err := relTo(self[""], e.root)
		if err != nil {
			continue
		}
		return layout{mode: ModeV2, hiers: []hierarchy{{mount: e.point, root: e.root, own: own}}}
	}
	testenv.Require(t, false, "a cgroup2 mount")
	return layout{}
}

func TestV2Unified(t *testing.T) {
	testenv.RequireRoot(t)
	m, err := newManager(v2Layout(t), testPrefix())
	testenv.Require(t, err == nil, fmt.Sprintf("writable cgroup2 (%v)", err))
	cleanupManager(t, m)
	requireWritable(t, m)
	if m.Mode() != ModeV2 {
		t.Fatalf("mode %s", m.Mode())
	}
	expectV2(t, m)
	for _, f := range m.Probe() {
		t.Logf("%-14s usable=%-5v %s %s", f.Name, f.Usable, f.Path, f.Reason)
	}

	c := mustCreate(t, m, "v2", Limits{})
	var out bytes.Buffer
	cmd := command(t, "/bin/cat", "/proc/self/cgroup")
	cmd.Stdout = &out
	usedFD := false
	err = c.Spawn(func(fd int) error {
		usedFD = fd >= 0
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		return cmd.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if !usedFD {
		t.Error("v2 Spawn passed no cgroup fd")
	}
	cg, err := ParseProcSelf(&out)
	if err != nil {
		t.Fatal(err)
	}
	if cg[""] != c.procPath(0) {
		t.Errorf("child's 0:: cgroup = %q, want %q", cg[""], c.procPath(0))
	}
	assertNoThreadInside(t, c)
	if _, err := c.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}

	if _, err := os.Stat(filepath.Join(c.dirs[0], "cgroup.kill")); err != nil {
		testenv.Require(t, false, "cgroup.kill")
	}
	tree, orphan := startTree(t, c)
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = tree.Wait()
	if !waitFor(2*time.Second, func() bool { return gone(orphan) }) {
		t.Errorf("orphan %d survived cgroup.kill", orphan)
	}
	if pids, err := c.Procs(); err != nil || len(pids) != 0 {
		t.Errorf("Procs after Kill = %v, %v", pids, err)
	}
	if err := c.SetIdle(true); m.controllerErr("cpu") != nil {
		if !errors.Is(err, ErrControllerUnavailable) {
			t.Errorf("SetIdle on a cpu-less cgroup2 = %v", err)
		}
	} else if b, _ := os.ReadFile(filepath.Join(c.dirs[0], "cpu.idle")); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Errorf("SetIdle(true) on cgroup2 = %v, cpu.idle %q", err, b)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, c)

	_, err = m.Create("v2mem", Limits{MemoryBytes: 32 << 20})
	if m.controllerErr("memory") != nil {
		if !errors.Is(err, ErrControllerUnavailable) || !strings.Contains(fmt.Sprint(err), "controller memory not available") {
			t.Errorf("Create with memory limit on a memory-less cgroup2 = %v", err)
		}
		t.Logf("expected error: %v", err)
		assertGone(t, m.cgroup("v2mem"))
	} else if err != nil {
		t.Errorf("Create with memory limit: %v", err)
	}
}

func TestRunOnFreshThread(t *testing.T) {
	var tids []int
	for i := 0; i < 20; i++ {
		tid := 0
		runOnFreshThread(func() { tid = unix.Gettid() })
		if tid == os.Getpid() {
			t.Fatal("f ran on the main thread")
		}
		tids = append(tids, tid)
	}
	for _, tid := range tids {
		p := fmt.Sprintf("/proc/self/task/%d", tid)
		if !waitFor(2*time.Second, func() bool { _, err := os.Stat(p); return err != nil }) {
			t.Errorf("thread %d still alive: the runtime reused it", tid)
		}
	}
}

func BenchmarkSpawnTrue(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	m, err := New(testPrefix())
	if err != nil {
		b.Skip(err)
	}
	defer func() { _ = m.removePrefix() }()
	c, err := m.Create("bench", Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Destroy() }()
	for b.Loop() {
		cmd := exec.Command("/bin/true")
		if err := c.Spawn(func(int) error { return cmd.Start() }); err != nil {
			b.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlainTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreateDestroy(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	m, err := New(testPrefix())
	if err != nil {
		b.Skip(err)
	}
	defer func() { _ = m.removePrefix() }()
	l := Limits{MemoryBytes: 64 << 20, CPUs: 1, PidsMax: 64}
	if m.checkLimits(l) != nil {
		l = Limits{}
	}
	for b.Loop() {
		c, err := m.Create("bench", l)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Destroy(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRenameKeepsProcessesAndLimits hands a cgroup with a running process
// to a new name: the process stays in it (now under the new name), limits
// still apply, and the old name is gone everywhere.
func TestRenameKeepsProcessesAndLimits(t *testing.T) {
	m := newTestManager(t)
	c, err := m.Create("before", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy() })
	cmd := exec.Command("/bin/sleep", "30")
	if err := c.Spawn(func(fd int) error {
		if fd >= 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		}
		return cmd.Start()
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	old := append([]string(nil), c.dirs...)
	if !m.CanRename() {
		// cgroup v2: the kernel cannot rename a cgroup. Rename must say
		// so and leave the cgroup, its name and its process as they were.
		err := c.Rename("after")
		if !errors.Is(err, ErrRenameUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("Rename on %s = %v, want ErrRenameUnsupported", m.Mode(), err)
		}
		if c.Name() != "before" || !slices.Equal(c.dirs, old) {
			t.Errorf("failed rename changed the cgroup: %q %v", c.Name(), c.dirs)
		}
		if pids, err := c.Procs(); err != nil || !slices.Contains(pids, cmd.Process.Pid) {
			t.Errorf("procs after failed rename = %v, %v; want %d", pids, err, cmd.Process.Pid)
		}
		if _, err := m.Open("after"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(after) = %v", err)
		}
		// The kernel agrees: a plain rename(2) of the directory fails.
		if err := os.Rename(c.dirs[0], filepath.Join(filepath.Dir(c.dirs[0]), "after")); err == nil {
			t.Error("the kernel renamed a cgroup v2 directory: Rename could support v2")
		}
		return
	}
	if err := c.Rename("after"); err != nil {
		t.Fatal(err)
	}
	for _, d := range old {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("old cgroup %s still exists (%v)", d, err)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		for _, ctrl := range []string{":memory:", ":pids:"} {
			if strings.Contains(l, ctrl) && !strings.HasSuffix(l, "/after") {
				t.Errorf("process not in the renamed cgroup: %s", l)
			}
		}
	}
	if m.controllerErr("pids") == nil {
		if err := c.SetLimits(Limits{PidsMax: 5}); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(filepath.Join(c.dirOf("pids"), "pids.max")); strings.TrimSpace(string(got)) != "5" {
			t.Errorf("pids.max after rename = %q", got)
		}
	}
	// Renaming onto an existing cgroup fails and keeps the name.
	other, err := m.Create("taken", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Destroy() })
	if err := c.Rename("taken"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("rename onto an existing cgroup: %v", err)
	}
	if c.Name() != "after" {
		t.Errorf("name after failed rename = %q", c.Name())
	}
	if err := c.Rename("../escape"); err == nil {
		t.Error("rename to an invalid name succeeded")
	}
}

// TestCreateAfterPrefixRemoved: another Manager on the same prefix (another
// process, or a second backend of this one) removes the empty prefix when it
// closes. Create must make it again and, on v2, enable the controllers in it
// again, so that the new cgroup still gets its limits.
func TestCreateAfterPrefixRemoved(t *testing.T) {
	m := newTestManager(t)
	other, err := New(m.prefix)
	if err != nil {
		t.Fatal(err)
	}
	l := Limits{}
	if m.controllerErr("memory") == nil {
		l.MemoryBytes = 48 << 20
	}
	if m.controllerErr("pids") == nil {
		l.PidsMax = 9
	}
	for round := 0; round < 2; round++ {
		if err := other.Close(); err != nil {
			t.Fatal(err)
		}
		for _, h := range m.hiers {
			if _, err := os.Stat(h.parent); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("Close left the empty prefix %s (%v)", h.parent, err)
			}
		}
		c, err := m.Create("again", l)
		if err != nil {
			t.Fatalf("Create after the prefix was removed: %v", err)
		}
		if l.MemoryBytes > 0 {
			f := map[string]string{ModeV1: "memory.limit_in_bytes", ModeV2: "memory.max"}[m.mode]
			if b, err := os.ReadFile(filepath.Join(c.dirOf("memory"), f)); err != nil || strings.TrimSpace(string(b)) != strconv.FormatInt(l.MemoryBytes, 10) {
				t.Errorf("%s = %q, %v", f, b, err)
			}
		}
		if l.PidsMax > 0 {
			if b, err := os.ReadFile(filepath.Join(c.dirOf("pids"), "pids.max")); err != nil || strings.TrimSpace(string(b)) != "9" {
				t.Errorf("pids.max = %q, %v", b, err)
			}
		}
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSetIdleOnRemovedCgroup: SetIdle on a cgroup that is gone reports that
// (fs.ErrNotExist), not a kernel without cpu.idle.
func TestSetIdleOnRemovedCgroup(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "cpu")
	c := mustCreate(t, m, "idle-gone", Limits{})
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	err := c.SetIdle(true)
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrControllerUnavailable) {
		t.Errorf("SetIdle on a removed cgroup = %v, want fs.ErrNotExist", err)
	}
}

// v2Child makes a cgroup named name under the test process's own cgroup in
// the cgroup2 hierarchy of lay, holding a sleeping process when populate is
// set, and returns its path relative to the mount. Cleanup kills the
// process and removes the cgroup (after the test's managers are gone).
func v2Child(t *testing.T, lay layout, name string, populate bool) string {
	t.Helper()
	h := lay.hiers[0]
	rel := path.Join(h.own, name)
	dir := filepath.Join(h.mount, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rmdirRetry(dir, rmdirTimeout); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if populate {
		cmd := exec.Command("/bin/sleep", "120")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid)); err != nil {
			t.Fatal(err)
		}
	}
	return rel
}

// spawnTrue starts /bin/true in c and waits for it; it returns the error of
// the start (EOPNOTSUPP when c cannot hold processes) or of the wait.
func spawnTrue(t *testing.T, c *Cgroup) error {
	cmd := command(t, "/bin/true")
	if err := trySpawn(t, c, cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// TestV2PopulatedOwnCgroup: warren started from a login shell on a systemd
// machine sits in a session scope that holds other processes. The kernel
// lets no domain controller (memory) be enabled there, and enabling a
// threaded one (cpu, pids) would make the scope a thread root, under which
// no cgroup can hold a process: the Manager must enable nothing there,
// report the controllers unusable, and still run sandboxes without limits.
func TestV2PopulatedOwnCgroup(t *testing.T) {
	m0 := newTestManager(t) // enables the controllers in our own cgroup, where it can
	lay := v2Layout(t)
	scope := v2Child(t, lay, m0.prefix+"-session.scope", true)
	lay.hiers[0].own = scope
	m, err := newManager(lay, testPrefix())
	if err != nil {
		t.Fatal(err)
	}
	cleanupManager(t, m)
	scopeDir := filepath.Join(lay.hiers[0].mount, scope)
	if got := readWords(filepath.Join(scopeDir, "cgroup.subtree_control")); len(got) != 0 {
		t.Errorf("the Manager enabled %v in the populated %s", got, scopeDir)
	}
	if b, _ := os.ReadFile(filepath.Join(scopeDir, "cgroup.type")); strings.TrimSpace(string(b)) != "domain" {
		t.Errorf("%s/cgroup.type = %q, want domain", scopeDir, b)
	}
	for _, c := range wantV2 {
		err := m.controllerErr(c)
		if !errors.Is(err, ErrControllerUnavailable) || !strings.Contains(err.Error(), "holds processes") {
			t.Errorf("controller %s: %v, want unusable because the cgroup holds processes", c, err)
		}
	}
	c := mustCreate(t, m, "free", Limits{})
	if err := spawnTrue(t, c); err != nil {
		t.Errorf("spawn into a cgroup without limits below the session scope: %v", err)
	}
	if _, err := m.Create("limited", Limits{MemoryBytes: 32 << 20}); !errors.Is(err, ErrControllerUnavailable) {
		t.Errorf("Create with a memory limit = %v, want ErrControllerUnavailable", err)
	}
}

// TestV2DelegateSubgroup: a systemd service with Delegate=yes and
// DelegateSubgroup=supervisor runs warren in <service>/supervisor and marks
// <service> delegated (xattr trusted.delegate=1). The sandbox cgroups go
// beside the supervisor leaf, in <service>/<prefix>, with every controller
// the service was given.
func TestV2DelegateSubgroup(t *testing.T) {
	m0 := newTestManager(t)
	lay := v2Layout(t)
	svc := v2Child(t, lay, m0.prefix+"-warren.service", false)
	svcDir := filepath.Join(lay.hiers[0].mount, svc)
	if err := unix.Setxattr(svcDir, "trusted.delegate", []byte("1"), 0); err != nil {
		testenv.Require(t, false, fmt.Sprintf("xattrs on cgroupfs (%v)", err))
	}
	lay.hiers[0].own = v2Child(t, lay, path.Base(svc)+"/supervisor", true)
	m, err := newManager(lay, testPrefix())
	if err != nil {
		t.Fatal(err)
	}
	cleanupManager(t, m)
	if want := filepath.Join(svcDir, m.prefix); m.hiers[0].parent != want {
		t.Errorf("sandbox cgroups under %s, want %s", m.hiers[0].parent, want)
	}
	expectV2(t, m)
	for _, f := range m.Probe() {
		t.Logf("%-14s usable=%-5v %s %s", f.Name, f.Usable, f.Path, f.Reason)
	}
	l := Limits{}
	if m.controllerErr("memory") == nil {
		l.MemoryBytes = 40 << 20
	}
	if m.controllerErr("pids") == nil {
		l.PidsMax = 11
	}
	c := mustCreate(t, m, "sb", l)
	var out bytes.Buffer
	cmd := command(t, "/bin/cat", "/proc/self/cgroup")
	cmd.Stdout = &out
	if err := trySpawn(t, c, cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if cg, err := ParseProcSelf(&out); err != nil || cg[""] != c.procPath(0) {
		t.Errorf("child's cgroup = %q (%v), want %q", cg[""], err, c.procPath(0))
	}
	if l.MemoryBytes > 0 {
		if b, err := os.ReadFile(filepath.Join(c.dirs[0], "memory.max")); err != nil || strings.TrimSpace(string(b)) != strconv.FormatInt(l.MemoryBytes, 10) {
			t.Errorf("memory.max = %q, %v", b, err)
		}
	}
	if l.PidsMax > 0 {
		if b, err := os.ReadFile(filepath.Join(c.dirs[0], "pids.max")); err != nil || strings.TrimSpace(string(b)) != "11" {
			t.Errorf("pids.max = %q, %v", b, err)
		}
	}
}
