// Package testenv holds what tests share: the privileged-test policy and
// freshly built agent and spawner binaries.
//
// Privileged tests call Require for the capability they need. Outside CI a
// missing capability skips the test; with WARREN_TEST_PRIVILEGED=1 (set by
// .ci/run) it fails, so a privileged lane can never pass by skipping.
package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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

// built is a helper binary a test process builds once.
type built struct {
	once sync.Once
	path string
	err  error
}

// get builds name with the command args, in which "OUT" stands for the
// output path.
func (b *built) get(t testing.TB, name string, args ...string) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", name+"-build-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, name)
		args = slices.Clone(args)
		for i, a := range args {
			if a == "OUT" {
				args[i] = b.path
			}
		}
		cmd := exec.Command(args[0], args[1:]...) //nolint:gosec // args is a build command written in the tests
		cmd.Dir = ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = &buildError{out: string(out), err: err}
		}
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", name, b.err)
	}
	return b.path
}

var agent, spawner, warren built

// WarrenBinary builds cmd/warren once per test process (without the agent
// and spawner embedded: hand it AgentBinary and SpawnerBinary through
// WARREN_AGENT and WARREN_SPAWNER) and returns its path. A package's
// TestMain removes it with RemoveWarrenBinary.
func WarrenBinary(t testing.TB) string {
	t.Helper()
	return warren.get(t, "warren", "go", "build", "-o", "OUT", "./cmd/warren")
}

// RemoveWarrenBinary removes what WarrenBinary built, if anything.
func RemoveWarrenBinary() {
	if warren.path != "" {
		_ = os.RemoveAll(filepath.Dir(warren.path))
	}
}

// RemoveBuilt removes every binary this test process built (warren, the
// agent, the spawner): a package's TestMain calls it after m.Run, so test
// runs leave no build directories in the temporary directory.
func RemoveBuilt() {
	for _, b := range []*built{&warren, &agent, &spawner} {
		if b.path != "" {
			_ = os.RemoveAll(filepath.Dir(b.path))
		}
	}
}

// AgentBinary builds cmd/warren-agent once per test process (statically, as
// shipped) and returns its path. WARREN_AGENT overrides the build.
func AgentBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("WARREN_AGENT"); p != "" {
		return p
	}
	return agent.get(t, "warren-agent", "go", "build", "-trimpath", "-ldflags=-s -w", "-o", "OUT", "./cmd/warren-agent")
}

// SpawnerBinary builds cmd/warren-spawner once per test process (with the C
// compiler, as `make build` does) and returns its path. WARREN_SPAWNER
// overrides the build.
func SpawnerBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("WARREN_SPAWNER"); p != "" {
		return p
	}
	return spawner.get(t, "warren-spawner", "cc", "-O2", "-Wall", "-Wextra", "-Werror", "-static", "-o", "OUT", "cmd/warren-spawner/spawner.c")
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
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil { //nolint:gosec // 0711: the point of SearchableDir, for sandboxes' uid range to traverse
		t.Fatal(err)
	}
	return dir
}

// WarrenCommand runs the warren binary the tests built on the data and run
// directories of a test's server, with the agent and spawner the tests
// built.
func WarrenCommand(t testing.TB, data, run string, args ...string) *exec.Cmd {
	cmd := exec.Command(WarrenBinary(t), args...) //nolint:gosec // the binary the tests built
	// WARREN_DISK_POOL=off: a server's default disk pool (a loop-mounted
	// image, kept mounted after it stops) is left to the tests of disks,
	// which pass --disk-pool and unmount it. WARREN_RUNSC=off: the gvisor
	// tier (a runsc probe and a cgroup at every server start) is left to
	// the tests of tiers, which name their runsc.
	cmd.Env = append(os.Environ(), "WARREN_AGENT="+AgentBinary(t), "WARREN_SPAWNER="+SpawnerBinary(t),
		"WARREN_DATA_DIR="+data, "WARREN_RUN_DIR="+run, "WARREN_DISK_POOL=off", "WARREN_RUNSC=off")
	return cmd
}

// CreateKey makes an API key of namespace ('*' for every one) valid for a
// day on a test server's data directory, and returns it.
func CreateKey(t testing.TB, data, run, namespace, description string) string {
	t.Helper()
	out, err := WarrenCommand(t, data, run, "key", "create", "--namespace", namespace, "--expire", "1d", "--description", description).Output()
	if err != nil || !strings.HasPrefix(string(out), "msb_") {
		t.Fatalf("key create %s: %v %q", namespace, err, out)
	}
	return strings.TrimSpace(string(out))
}

// SyncBuffer is a bytes.Buffer that a process's output and a test's reads
// may use at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
