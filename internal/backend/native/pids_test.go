package native_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/wire"
)

// taskBomb takes every pid its sandbox has: threads until the kernel
// refuses, then forks until it refuses, reports both counts in
// /tmp/bomb, holds them for 4 s and exits (its threads and children with
// it). It needs no fork afterwards, which would fail.
const taskBomb = `
import os, threading, time
def hold():
    time.sleep(4)
threads = 0
while threads < 24:
    try:
        threading.Thread(target=hold, daemon=True).start()
        threads += 1
    except RuntimeError:
        break
forks = 0
while forks < 5000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(4)
        os._exit(0)
    forks += 1
with open("/tmp/bomb.new", "w") as f:
    f.write("%d %d\n" % (threads, forks))
os.rename("/tmp/bomb.new", "/tmp/bomb")
time.sleep(4)
os._exit(0)
`

// TestAgentSurvivesPidsExhaustion: sandbox code that takes every pid of its
// sandbox (threads, then forks) leaves its agent serving: the agent's
// threads have a pids budget of their own. While the bomb holds, the agent
// answers file requests and refuses an exec cleanly; once the bomb is
// gone, execs work again.
func TestAgentSurvivesPidsExhaustion(t *testing.T) {
	h := harness(t)
	const pids = 48
	sb := h.Sandbox(t, backend.Config{PidsMax: pids})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "setsid /usr/bin/python3 -c '"+taskBomb+"' </dev/null >/dev/null 2>&1 &"); r.Code != 0 {
		t.Fatalf("start the bomb: %+v %s", r.ExitStatus, r.Stderr)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var report []byte
	for {
		b, err := sb.Agent().ReadFile(ctx, "/tmp/bomb")
		if err == nil {
			report = b
			break
		}
		select {
		case <-sb.Done():
			t.Fatal("the sandbox ended while its pids ran out")
		case <-ctx.Done():
			t.Fatalf("no bomb report: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	var threads, forks int
	if _, err := fmt.Sscan(string(report), &threads, &forks); err != nil {
		t.Fatalf("bomb report %q: %v", report, err)
	}
	t.Logf("the bomb held %d threads and %d forks", threads, forks)
	if threads != 24 || forks == 0 {
		t.Errorf("bomb held %d threads and %d forks, want 24 and some", threads, forks)
	}
	if threads+forks+1 < pids-2 || threads+forks+1 > pids {
		t.Errorf("bomb took %d+%d tasks, want about its grant %d", threads, forks, pids)
	}
	// While every pid of the workload is taken: the agent answers, and an
	// exec fails as an exec, not as a dead agent.
	if _, err := sb.Agent().Health(ctx); err != nil {
		t.Errorf("agent health while the pids are exhausted: %v", err)
	}
	res, err := backend.Exec(ctx, sb, &wire.ExecRequest{Argv: []string{"/bin/true"}}, func(string, []byte) {})
	t.Logf("exec while exhausted: %+v, %v", res, err)
	if err == nil && res.Code == 0 {
		t.Errorf("an exec started with every pid of the sandbox taken")
	}
	assertAgentLeafHoldsOnlyAgent(t, sb)
	// The bomb exits after its hold; execs then work again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := backend.Exec(ctx, sb, &wire.ExecRequest{Argv: []string{"/bin/echo", "ok"}}, func(string, []byte) {})
		if err == nil && res.Code == 0 {
			break
		}
		select {
		case <-sb.Done():
			t.Fatal("the sandbox ended after its pids ran out")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec after the bomb: %+v, %v", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWorkloadCannotJoinAgentCgroup: sandbox root finds no cgroup file
// through which to move into the agent's cgroup: it writes its pid to every
// cgroup.procs and tasks file it can reach, mounting cgroupfs itself where
// the kernel lets it. Afterwards no task but the agent's is in the agent's
// cgroup, and sandbox processes sit in the workload's.
func TestWorkloadCannotJoinAgentCgroup(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{})
	script := `
cat /proc/self/cgroup
mkdir -p /tmp/cg1 /tmp/cg2
mount -t cgroup2 none /tmp/cg1 2>/dev/null && echo mounted cgroup2
mount -t cgroup -o pids none /tmp/cg2 2>/dev/null && echo mounted pids
for f in $(find /sys/fs/cgroup /tmp/cg1 /tmp/cg2 -name cgroup.procs -o -name tasks -o -name cgroup.threads 2>/dev/null); do
	for d in "$f" "$(dirname "$f")/../agent/$(basename "$f")" "$(dirname "$f")/../../agent/$(basename "$f")"; do
		[ -e "$d" ] && echo $$ > "$d" 2>/dev/null && echo "moved through $d"
	done
done
sleep 30 &
echo sleeper $!
`
	r := conformance.Exec(t, sb, 30*time.Second, "/bin/sh", "-c", script)
	t.Logf("inside: %s %s", r.Stdout, r.Stderr)
	if strings.Contains(r.Stdout, "moved through") && strings.Contains(r.Stdout, "agent") {
		t.Errorf("sandbox root wrote to an agent cgroup file: %s", r.Stdout)
	}
	assertAgentLeafHoldsOnlyAgent(t, sb)
}

// assertAgentLeafHoldsOnlyAgent checks, from the host, that every task in
// the sandbox's agent leaf belongs to the agent, and that the agent's
// process has some thread there and its launcher thread in the workload's.
func assertAgentLeafHoldsOnlyAgent(t *testing.T, sb backend.Sandbox) {
	t.Helper()
	agent := sb.(*native.Sandbox).Pid()
	id := sb.ID()
	inAgent, inWork := 0, 0
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/cgroup")
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		s := string(b)
		agentLeaf := strings.Contains(s, "/"+id+"/agent\n")
		workLeaf := strings.Contains(s, "/"+id+"/work\n")
		if !agentLeaf && !workLeaf {
			continue
		}
		tgid := taskTgid(filepath.Dir(f))
		switch {
		case agentLeaf && tgid != agent:
			t.Errorf("task %s of process %d (not the agent %d) is in the agent's cgroup", filepath.Base(filepath.Dir(f)), tgid, agent)
		case agentLeaf:
			inAgent++
		case workLeaf && tgid == agent:
			inWork++
		}
	}
	if inAgent == 0 || inWork != 1 {
		t.Errorf("agent %d: %d threads in its own cgroup, %d in the workload's (want >0 and the launcher alone)", agent, inAgent, inWork)
	}
}

// taskTgid reads the Tgid of /proc/<pid>/task/<tid>.
func taskTgid(taskDir string) int {
	b, err := os.ReadFile(filepath.Join(taskDir, "status"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Tgid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// TestAgentPidsHoldMaxProcesses: the agent's own pids budget
// (backend.AgentPids) holds what the API lets a tenant make it wait for:
// wire.MaxProcesses background processes and a burst of execs beside
// them, each of which the Go runtime waits for on a thread of its own.
func TestAgentPidsHoldMaxProcesses(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	for i := range wire.MaxProcesses {
		if _, err := sb.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: []string{"/bin/sleep", "60"}}); err != nil {
			t.Fatalf("background process %d: %v", i, err)
		}
	}
	errs := make(chan error, 32)
	for range cap(errs) {
		go func() {
			res, err := backend.Exec(ctx, sb, &wire.ExecRequest{Argv: []string{"/bin/sleep", "1"}}, func(string, []byte) {})
			if err == nil && res.Code != 0 {
				err = fmt.Errorf("exit %+v", res.ExitStatus)
			}
			errs <- err
		}()
	}
	time.Sleep(500 * time.Millisecond)
	threads := agentThreads(t, sb.(*native.Sandbox).Pid())
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("exec beside %d background processes: %v", wire.MaxProcesses, err)
		}
	}
	t.Logf("agent threads with %d background processes and %d execs: %d (budget %d)", wire.MaxProcesses, cap(errs), threads, backend.AgentPids)
	if _, err := sb.Agent().Health(ctx); err != nil {
		t.Fatalf("agent after the processes: %v", err)
	}
	if threads >= backend.AgentPids {
		t.Errorf("the agent ran %d threads, at its budget of %d", threads, backend.AgentPids)
	}
	// Not a thread per process waited for (the agent waits on the poller).
	if threads > wire.MaxProcesses/8 {
		t.Errorf("the agent ran %d threads for %d processes: a thread per wait?", threads, wire.MaxProcesses+cap(errs))
	}
}

// agentThreads reads the Threads line of the agent's /proc status.
func agentThreads(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}
