package sandbox_test

import (
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestStartPlanned: dependencies start first and are logged; a bad plan
// starts nothing; a start command runs only on a start that started the
// sandbox. (The fake's agent runs no background processes, so a command
// there is one that cannot be started: exec_failed, the sandbox running.)
func TestStartPlanned(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	m := e.manager(t)
	mustStart(t, m, "db", spec)
	if err := m.Stop(t.Context(), "ns", "db"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		plan sandbox.Plan
		kind error
		says string
	}{
		{"self", sandbox.Plan{DependsOn: []string{"app"}}, errdefs.ErrInvalid, "itself"},
		{"bad name", sandbox.Plan{DependsOn: []string{"../x"}}, errdefs.ErrInvalid, "depends_on"},
		{"missing", sandbox.Plan{DependsOn: []string{"nowhere"}}, errdefs.ErrNotFound, "nowhere"},
		{"too many", sandbox.Plan{DependsOn: make([]string, sandbox.MaxDependsOn+1)}, errdefs.ErrInvalid, "at most"},
	} {
		_, started, err := m.StartPlanned(t.Context(), "ns", "app", spec, tc.plan)
		if started || err == nil || errdefs.Kind(err) != tc.kind.Error() || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: started %v, %v; want %s saying %q", tc.name, started, err, tc.kind, tc.says)
		}
	}
	if !gone(m, "app") || state(t, m, "db") != sandbox.Stopped {
		t.Fatal("a refused plan started something")
	}
	// A spec that will be refused starts no dependency.
	bad := spec
	bad.MemoryMiB = 1
	if _, _, err := m.StartPlanned(t.Context(), "ns", "app", bad, sandbox.Plan{DependsOn: []string{"db"}}); errdefs.Kind(err) != errdefs.ErrInvalid.Error() {
		t.Errorf("bad spec: %v, want invalid_params", err)
	}
	if state(t, m, "db") != sandbox.Stopped {
		t.Error("a refused spec started its dependency")
	}

	info, started, err := m.StartPlanned(t.Context(), "ns", "app", spec, sandbox.Plan{DependsOn: []string{"db", "db"}})
	if err != nil || !started || info.State != sandbox.Running {
		t.Fatalf("start with a dependency: %+v %v %v", info, started, err)
	}
	if state(t, m, "db") != sandbox.Running {
		t.Error("the dependency was not started")
	}
	logHas(t, m, "app", `started "db", which it depends on`)

	// Running already: nothing is started, so the command is not run.
	cmd := sandbox.Plan{Command: []string{"/no/such/shell", "-c", "true"}}
	if _, started, err := m.StartPlanned(t.Context(), "ns", "app", spec, cmd); err != nil || started {
		t.Errorf("start of a running sandbox: started %v, %v; want nothing done", started, err)
	}
	// Started now: the command runs, and its shell is not there.
	if err := m.Stop(t.Context(), "ns", "app"); err != nil {
		t.Fatal(err)
	}
	_, started, err = m.StartPlanned(t.Context(), "ns", "app", spec, cmd)
	if !started || errdefs.Kind(err) != errdefs.ErrExecFailed.Error() || !strings.Contains(err.Error(), "the sandbox runs") {
		t.Errorf("start command that cannot start: started %v, %v; want exec_failed", started, err)
	}
	if state(t, m, "app") != sandbox.Running {
		t.Error("a start command that could not start stopped the sandbox")
	}
}
