package rpc_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestStartConfig: sandbox.start honours microsandbox's depends_on, shell,
// scripts and exec, and rejects what it cannot honour with clear errors.
func TestStartConfig(t *testing.T) {
	e := newEnv(t, true, nil)
	state := func(name string) string {
		var info struct {
			State string `json:"state"`
		}
		e.must("sandbox.get", map[string]any{"sandbox": name}, &info)
		return info.State
	}
	// stdout runs a shell script in sandbox name until it prints something
	// (the start command runs in the background) or 10s have passed.
	stdout := func(name, script string) string {
		deadline := time.Now().Add(10 * time.Second)
		for {
			var res struct {
				Output []struct{ Stream, Text string } `json:"output"`
			}
			e.must("sandbox.command.run", map[string]any{"sandbox": name, "command": "sh", "args": []string{"-c", script}}, &res)
			var lines []string
			for _, o := range res.Output {
				if o.Stream == "stdout" {
					lines = append(lines, o.Text)
				}
			}
			if len(lines) > 0 || time.Now().After(deadline) {
				return strings.Join(lines, "\n")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A stopped dependency is started again first, with its own config.
	e.must("sandbox.start", map[string]any{"sandbox": "db", "config": map[string]any{"envs": []string{"ROLE=db"}}}, nil)
	e.must("sandbox.stop", map[string]any{"sandbox": "db"}, nil)
	cfg := map[string]any{
		"depends_on": []string{"db", "db"},
		"shell":      "/bin/sh",
		"scripts":    map[string]string{"start": "echo started-$$ >> /tmp/marks", "test": "exit 3"},
	}
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	if got := state("db"); got != "running" {
		t.Fatalf("dependency is %s, want running", got)
	}
	if got := stdout("db", "echo $ROLE"); got != "db" {
		t.Errorf("dependency restarted without its config: %q", got)
	}
	// The "start" script ran, once; starting the running sandbox again
	// does not run it again.
	if got := stdout("app", "cat /tmp/marks 2>/dev/null"); !strings.HasPrefix(got, "started-") {
		t.Fatalf("start script output %q", got)
	}
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	time.Sleep(300 * time.Millisecond)
	if got := stdout("app", "cat /tmp/marks 2>/dev/null"); strings.Count(got, "started-") != 1 {
		t.Fatalf("start script ran again on a start of a running sandbox: %q", got)
	}
	// A restart after a stop runs it again.
	e.must("sandbox.stop", map[string]any{"sandbox": "app"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(stdout("app", "cat /tmp/marks 2>/dev/null"), "started-") != 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := stdout("app", "cat /tmp/marks 2>/dev/null"); strings.Count(got, "started-") != 2 {
		t.Fatalf("start script did not run on restart: %q", got)
	}

	// exec wins over the start script.
	e.must("sandbox.start", map[string]any{"sandbox": "ex", "config": map[string]any{
		"exec": "echo from-exec > /tmp/m", "scripts": map[string]string{"start": "echo from-script > /tmp/m"},
	}}, nil)
	if got := stdout("ex", "cat /tmp/m 2>/dev/null"); got != "from-exec" {
		t.Fatalf("exec vs start script: %q", got)
	}

	bad := []struct {
		name   string
		config map[string]any
		kind   string
		want   string
	}{
		{"missing dependency", map[string]any{"depends_on": []string{"nowhere"}}, "not_found", "nowhere"},
		{"self dependency", map[string]any{"depends_on": []string{"bad"}}, "invalid_params", "itself"},
		{"bad dependency name", map[string]any{"depends_on": []string{"../x"}}, "invalid_params", "depends_on"},
		{"relative shell", map[string]any{"shell": "bash", "exec": "true"}, "invalid_params", "shell"},
		{"bad script name", map[string]any{"scripts": map[string]string{"a b": "true"}}, "invalid_params", "scripts"},
		{"NUL in exec", map[string]any{"exec": "echo \x00"}, "invalid_params", "NUL"},
		{"huge script", map[string]any{"scripts": map[string]string{"start": strings.Repeat("x", 70<<10)}}, "invalid_params", "at most"},
		{"shell not in the sandbox", map[string]any{"shell": "/no/such/shell", "exec": "true"}, "exec_failed", "/no/such/shell"},
	}
	for _, c := range bad {
		r := e.call("sandbox.start", map[string]any{"sandbox": "bad", "config": c.config})
		if r.Error == nil || r.kind() != c.kind || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("%s: want kind %s mentioning %q, got %d %s", c.name, c.kind, c.want, r.Status, r.Raw)
		}
	}
	// Rejected configs started nothing (the last one started the sandbox
	// before its command failed).
	var list struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	e.must("sandbox.list", map[string]any{}, &list)
	if len(list.Sandboxes) != 4 {
		t.Errorf("want 4 sandboxes (db, app, ex, bad), got %d", len(list.Sandboxes))
	}
}
