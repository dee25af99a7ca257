package gvisor_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/testenv"
)

var (
	shared     *gvisor.Backend
	sharedErr  error
	sharedOnce sync.Once
	sharedBase string
)

// newBackend returns the package's shared backend, on directories of its
// own. Privileged: fails under WARREN_TEST_PRIVILEGED=1 without root or
// without the pinned runsc.
func newBackend(t testing.TB) *gvisor.Backend {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireFile(t, "/usr/bin/python3")
	runsc, agentPath := testenv.RunscBinary(t), testenv.AgentBinary(t)
	sharedOnce.Do(func() {
		sharedBase, sharedErr = os.MkdirTemp("", "warren-gvisor-test-")
		if sharedErr != nil {
			return
		}
		shared, sharedErr = gvisor.New(gvisor.Options{
			DataDir: filepath.Join(sharedBase, "data"), RunDir: filepath.Join(sharedBase, "run"),
			RunscPath: runsc, AgentPath: agentPath,
			CgroupPrefix: fmt.Sprintf("warren-gvisor-test-%d", os.Getpid()),
			Python:       "/usr/bin/python3", Node: "/usr/bin/node",
		})
	})
	if sharedErr != nil {
		t.Fatalf("gvisor backend: %v", sharedErr)
	}
	return shared
}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilt()
	if shared != nil {
		_, _ = shared.ReapOrphans(nil)
		_ = shared.Close()
		if err := os.RemoveAll(sharedBase); err != nil {
			fmt.Fprintf(os.Stderr, "leftovers: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func harness(t testing.TB) *conformance.Harness {
	b := newBackend(t)
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	return &conformance.Harness{
		Backend:  b,
		Image:    img,
		UserNS:   b.Capabilities().UserNS,
		HostPid:  func(sb backend.Sandbox) int { return sb.(*gvisor.Sandbox).Pid() },
		Snapshot: func() (string, error) { return snapshot(b) },
		// Each cycle starts a sentry (0.3-3 s on two loaded cores):
		// fewer cycles than native's 200 keep the suite in its budget.
		Cycles: 10,
	}
}

// snapshot describes what sandboxes can leave on the host: mounts of the
// backend's directories, its cgroups, bundles and runsc state, and
// processes started with its runsc state directory (runsc, its sentries
// and gofers).
func snapshot(b *gvisor.Backend) (string, error) {
	var out []string
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	mine := 0
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, sharedBase) {
			mine++
		}
	}
	out = append(out, fmt.Sprintf("host mounts of the data or run directory: %d", mine))
	cgs, err := b.Cgroups()
	if err != nil {
		return "", err
	}
	out = append(out, fmt.Sprintf("cgroups: %v", cgs))
	for _, d := range []string{"run", "run/.runsc", "data/sandboxes"} {
		ents, err := os.ReadDir(filepath.Join(sharedBase, d))
		if err != nil {
			return "", err
		}
		var names []string
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "runsc-") || d != "run/.runsc" {
				names = append(names, e.Name())
			}
		}
		out = append(out, fmt.Sprintf("%s: %v", d, names))
	}
	// A removed sandbox's gofer exits on its own once its sentry is
	// gone, a moment after the stop returns: wait for that (a while).
	procs := runscProcesses()
	for deadline := time.Now().Add(5 * time.Second); procs > 0 && time.Now().Before(deadline); procs = runscProcesses() {
		time.Sleep(50 * time.Millisecond)
	}
	out = append(out, fmt.Sprintf("runsc processes: %d", procs))
	return strings.Join(out, "\n"), nil
}

// runscProcesses counts the host processes started with the backend's
// directories in their command line (runsc, its sentries and gofers).
func runscProcesses() int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), sharedBase) {
			n++
		}
	}
	return n
}

// TestConformance runs the isolation suite against gVisor sandboxes.
func TestConformance(t *testing.T) { conformance.Run(t, harness(t)) }

// TestAgentConformance runs the agent protocol suite against the agent
// as runsc's init.
func TestAgentConformance(t *testing.T) { conformance.RunAgent(t, harness(t)) }
