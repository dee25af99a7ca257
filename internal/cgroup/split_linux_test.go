package cgroup

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// splitScript plays an agent in a split cgroup: one thread (the launcher)
// joins the workload through fd 3 (OpenWorkload), reports its cgroups,
// forks sleepers until the kernel refuses (up to 50) and reports how many;
// then the main thread, still in the agent's leaf, starts 5 threads.
const splitScript = `
import os, sys, threading, time
res = {}
def launcher():
    os.write(3, b"0")
    res["launcher"] = open("/proc/thread-self/cgroup").read().replace("\n", ";")
    n = 0
    for i in range(50):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    res["forks"] = n
t = threading.Thread(target=launcher)
t.start()
t.join()
started = 0
def idle():
    time.sleep(2)
ts = []
for i in range(5):
    try:
        th = threading.Thread(target=idle)
        th.start()
        ts.append(th)
        started += 1
    except RuntimeError:
        pass
print(res["launcher"], res["forks"], started, flush=True)
time.sleep(30)
`

// runSplitScript starts splitScript in c and returns what it printed.
func runSplitScript(t *testing.T, c *Cgroup) (launcherCgroups string, forks, threads int, pid int) {
	t.Helper()
	testenv.RequireFile(t, "/usr/bin/python3")
	work, err := c.OpenWorkload()
	if err != nil || work == nil {
		t.Fatalf("OpenWorkload = %v, %v", work, err)
	}
	defer func() { _ = work.Close() }()
	cmd := command(t, "/usr/bin/python3", "-c", splitScript)
	cmd.ExtraFiles = []*os.File{work}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	spawn(t, c, cmd)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the script's report: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 {
		t.Fatalf("script printed %q", line)
	}
	forks, _ = strconv.Atoi(f[1])
	threads, _ = strconv.Atoi(f[2])
	return f[0], forks, threads, cmd.Process.Pid
}

// TestSplitKeepsAgentPids: in a split cgroup the workload's forks stop at
// its pids.max while the agent's leaf can still start threads, the agent
// is born in its leaf, and Stats, Kill and Destroy cover both leaves.
func TestSplitKeepsAgentPids(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "pids")
	c := mustCreate(t, m, "split", Limits{PidsMax: 8, AgentPids: 16})
	if !c.Split() {
		t.Fatal("cgroup made with AgentPids is not split")
	}
	pd := c.splitDir()
	for dir, want := range map[string]string{filepath.Join(pd, workLeaf): "8", filepath.Join(pd, agentLeaf): "16", pd: "24"} {
		if b, err := os.ReadFile(filepath.Join(dir, "pids.max")); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s/pids.max = %q, %v; want %s", dir, b, err, want)
		}
	}
	if o, err := m.Open("split"); err != nil || !o.Split() {
		t.Errorf("Open of a split cgroup: split %v, %v", o != nil && o.Split(), err)
	}

	launcher, forks, threads, pid := runSplitScript(t, c)
	t.Logf("launcher %s, forks %d, agent threads %d", launcher, forks, threads)
	pidsKey, pidsPath := "", ""
	for i, h := range m.hiers {
		if m.mode == ModeV2 || h.ctrls[0] == "pids" || strings.Contains(strings.Join(h.ctrls, ","), "pids") {
			pidsKey, pidsPath = hierKey(m, i), c.procPath(i)
		}
	}
	if !strings.Contains(launcher, pidsKey+":"+path.Join(pidsPath, workLeaf)) {
		t.Errorf("launcher thread's cgroups %q: not in %s/%s", launcher, pidsPath, workLeaf)
	}
	if forks < 1 || forks > 8 {
		t.Errorf("workload forked %d, want 1..8 (its pids.max)", forks)
	}
	if threads != 5 {
		t.Errorf("agent started %d of 5 threads with its workload's pids exhausted", threads)
	}
	if cg := readProcCgroup(t, fmt.Sprintf("/proc/%d/cgroup", pid)); cg[pidsKey] != path.Join(pidsPath, agentLeaf) {
		t.Errorf("agent process born in %q, want its leaf %s", cg[pidsKey], path.Join(pidsPath, agentLeaf))
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.PidsCurrent < int64(forks+2) {
		t.Errorf("Stats.PidsCurrent = %d, want the agent's threads and the %d forks", st.PidsCurrent, forks)
	}
	if procs, err := c.Procs(); err != nil || len(procs) < forks+1 {
		t.Errorf("Procs = %v, %v; want the agent and %d forks", procs, err, forks)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, c)
}

// TestSplitRollbackAndUnsplit: a failed Create removes the leaves with the
// cgroup; a cgroup made without AgentPids is not split and has no
// workload to open.
func TestSplitRollbackAndUnsplit(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "pids")
	testHookCreate = func(*Cgroup) error { return fmt.Errorf("injected") }
	_, err := m.Create("rollback", Limits{AgentPids: 4})
	testHookCreate = nil
	if err == nil {
		t.Fatal("Create with a failing hook succeeded")
	}
	assertGone(t, m.cgroup("rollback"))

	c := mustCreate(t, m, "plain", Limits{PidsMax: 8})
	if c.Split() {
		t.Error("cgroup made without AgentPids is split")
	}
	if f, err := c.OpenWorkload(); f != nil || err != nil {
		t.Errorf("OpenWorkload of an unsplit cgroup = %v, %v", f, err)
	}
	// SetLimits with AgentPids on an unsplit cgroup (an older layout
	// reattached) writes its one pids.max as before.
	if err := c.SetLimits(Limits{PidsMax: 9, AgentPids: 4}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(c.splitDir(), "pids.max")); strings.TrimSpace(string(b)) != "9" {
		t.Errorf("pids.max of an unsplit cgroup = %q, want 9", b)
	}
}

// TestV2Split: on the cgroup2 mount (without controllers on the build
// machine) the leaves are threaded, the agent is born in its leaf, a
// thread joins the workload through OpenWorkload, and Procs, Kill and
// Destroy see through the threaded leaves.
func TestV2Split(t *testing.T) {
	testenv.RequireRoot(t)
	m, err := newManager(v2Layout(t), testPrefix())
	testenv.Require(t, err == nil, fmt.Sprintf("writable cgroup2 (%v)", err))
	cleanupManager(t, m)
	requireWritable(t, m)
	c := mustCreate(t, m, "v2split", Limits{AgentPids: 16})
	if !c.Split() {
		t.Fatal("v2 cgroup made with AgentPids is not split")
	}
	for _, leaf := range []string{agentLeaf, workLeaf} {
		if b, err := os.ReadFile(filepath.Join(c.dirs[0], leaf, "cgroup.type")); err != nil || strings.TrimSpace(string(b)) != "threaded" {
			t.Errorf("%s/cgroup.type = %q, %v", leaf, b, err)
		}
	}
	launcher, forks, threads, pid := runSplitScript(t, c)
	if want := "0::" + path.Join(c.procPath(0), workLeaf); !strings.Contains(launcher, want) {
		t.Errorf("launcher thread's cgroup %q, want %s", launcher, want)
	}
	if forks != 50 || threads != 5 {
		t.Errorf("forks %d, threads %d without a pids limit; want 50, 5", forks, threads)
	}
	if cg := readProcCgroup(t, fmt.Sprintf("/proc/%d/cgroup", pid)); cg[""] != path.Join(c.procPath(0), agentLeaf) {
		t.Errorf("agent process born in %q, want %s", cg[""], path.Join(c.procPath(0), agentLeaf))
	}
	procs, err := c.Procs()
	if err != nil || len(procs) != forks+1 {
		t.Errorf("Procs = %d pids, %v; want the agent and its %d forks", len(procs), err, forks)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, c)
}
