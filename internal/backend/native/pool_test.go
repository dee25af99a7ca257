package native_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestWarmPool runs sandboxes from pre-spawned agents: they must end up in
// their own cgroup (limits hold, the cgroup namespace is rooted there) and
// closing the backend must leave no agent, directory or cgroup behind.
func TestWarmPool(t *testing.T) {
	testenv.RequireRoot(t)
	agentPath := testenv.AgentBinary(t)
	base, err := os.MkdirTemp("", "warren-pool-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("warren-pool-test-%d", os.Getpid())
	b, err := native.New(native.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"),
		AgentPath: agentPath, CgroupPrefix: prefix, Prewarm: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	h := &conformance.Harness{Backend: b, Image: img}
	// Let the pool fill, so the starts below take pooled agents.
	waitFor(t, func() bool { return countAgents() >= 2 })
	for i := range 5 {
		sb := h.Sandbox(t, backend.Config{ID: fmt.Sprintf("pooled-%d", i), MemoryBytes: 64 << 20})
		r := conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/proc/self/cgroup")
		for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
			if strings.Contains(l, ":memory:") && !strings.HasSuffix(l, ":/") {
				t.Errorf("cgroup namespace not rooted at the sandbox's cgroup: %q", l)
			}
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
	waitFor(t, func() bool { return countAgents() == 0 })
	if _, err := os.Stat(filepath.Join(base, "run", ".pool")); !os.IsNotExist(err) {
		t.Errorf("pool directory left behind: %v", err)
	}
	for _, ctrl := range []string{"memory", "pids", "cpu"} {
		matches, _ := filepath.Glob("/sys/fs/cgroup/" + ctrl + "/*" + prefix + "*")
		matches2, _ := filepath.Glob("/sys/fs/cgroup/" + ctrl + "/*/*/" + prefix + "/*")
		if len(matches)+len(matches2) > 0 {
			t.Errorf("cgroups left behind: %v %v", matches, matches2)
		}
	}
}

// countAgents counts this test binary's agent processes.
func countAgents() int {
	n := 0
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if exe, err := os.Readlink("/proc/" + p.Name() + "/exe"); err == nil && strings.HasPrefix(filepath.Base(exe), "warren-agent") {
			if ppid(p.Name()) == os.Getpid() {
				n++
			}
		}
	}
	return n
}

func ppid(pid string) int {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	var n int
	fmt.Sscan(f[1], &n)
	return n
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
