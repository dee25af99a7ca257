// Package testenv holds what tests share: the privileged-test policy and a
// freshly built agent binary.
//
// Privileged tests call Require for the capability they need. Outside CI a
// missing capability skips the test; with WARREN_TEST_PRIVILEGED=1 (set by
// .ci/run) it fails, so a privileged lane can never pass by skipping.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Strict reports whether missing capabilities must fail tests.
func Strict() bool { return os.Getenv("WARREN_TEST_PRIVILEGED") == "1" }

// Require fails (strict) or skips the test when ok is false.
func Require(t testing.TB, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if Strict() {
		t.Fatalf("required capability missing: %s (WARREN_TEST_PRIVILEGED=1)", what)
	}
	t.Skipf("skipping: %s not available (set WARREN_TEST_PRIVILEGED=1 to fail instead)", what)
}

// RequireRoot requires euid 0.
func RequireRoot(t testing.TB) {
	t.Helper()
	Require(t, os.Geteuid() == 0, "root")
}

// RequireFile requires an executable or file at path.
func RequireFile(t testing.TB, path string) {
	t.Helper()
	_, err := os.Stat(path)
	Require(t, err == nil, path)
}

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// AgentBinary builds cmd/warren-agent once per test process (statically, as
// shipped) and returns its path. WARREN_AGENT overrides the build.
func AgentBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("WARREN_AGENT"); p != "" {
		return p
	}
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "warren-agent-build-")
		if err != nil {
			agentErr = err
			return
		}
		agentPath = filepath.Join(dir, "warren-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", agentPath, "./cmd/warren-agent")
		cmd.Dir = ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = &buildError{out: string(out), err: err}
		}
	})
	if agentErr != nil {
		t.Fatalf("build agent: %v", agentErr)
	}
	return agentPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// ModuleRoot is the repository root (the directory holding go.mod).
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// ParentPID is pid's parent's pid, 0 when pid is gone.
func ParentPID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// SearchableDir makes a temporary directory that sandbox root (an
// unprivileged host uid under user namespaces) can search, unlike
// t.TempDir, whose parent is private; it is removed when the test ends.
func SearchableDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}
